"""The `mqgate` sink: rows produced to a topic through /mq/produce/batch, and the progress of
a consumer group committed once per micro-batch.

Each row is one message: column `body` (or `message`), optional `keys`, `tags`,
`properties`, `orderKey`, `delayMs`. Produce is at least once: a retried task produces its
rows again. Rows read from an mqgate source carry `queue` and `offset`; with option
`progressConsumer` the streaming sink commits, after each micro-batch, max(offset) + 1 per
queue of the rows it wrote to that consumer (POST /mq/commit).

Spark makes a fresh writer for every sink commit and may call it again for a batch it
replays after a restart. The gateway's commit never lowers an offset, so a replay is
harmless anyway; the sink also remembers, per consumer and query, the last batch id it
committed (a small file on the driver) and skips older ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from mqgate.client import Client
from mqgate.spark.offsets import Offsets, OptionError
from mqgate.spark.options import WriteOptions, write_options

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on every task of a streaming query
_encode = msgspec.json.Encoder().encode


@dataclass
class WriteCommit(WriterCommitMessage):
    rows: int
    offsets: Offsets = field(default_factory=dict)  # source queue -> max(offset) + 1
    query_id: str = ""


def _body_column(schema: StructType) -> str:
    names = schema.fieldNames()
    for name in ("body", "message"):
        if name in names:
            return name
    raise OptionError(
        f"the mqgate sink needs a string column body (or message); the rows have {', '.join(names)}",
        field="body",
    )


def encode_rows(batch: pa.RecordBatch, body: str) -> list[bytes]:
    """Each row as the JSON object of one message in a batch produce."""
    names = batch.schema.names
    bodies = batch.column(body).to_pylist()
    optional: list[tuple[str, list[Any]]] = [
        (name, batch.column(name).to_pylist())
        for name in ("keys", "tags", "properties", "orderKey", "delayMs")
        if name in names
    ]
    out: list[bytes] = []
    for i, text in enumerate(bodies):
        if text is None:
            raise OptionError(f"row {i} of a batch has a null {body}", field=body)
        msg: dict[str, Any] = {"message": str(text)}
        for name, values in optional:
            v = values[i]
            if v is None or (name != "delayMs" and not v):
                continue
            msg[name] = dict(v) if name == "properties" else v
        out.append(_encode(msg))
    return out


def _positions(batch: pa.RecordBatch) -> Offsets:
    """max(offset) + 1 per queue, if the rows carry the integer columns of an mqgate source."""
    names = batch.schema.names
    if "queue" not in names or "offset" not in names:
        return {}
    types = (batch.schema.field("queue").type, batch.schema.field("offset").type)
    if not all(pa.types.is_integer(t) for t in types):
        return {}
    table = pa.table({"queue": batch.column("queue"), "offset": batch.column("offset")})
    grouped = table.group_by("queue").aggregate([("offset", "max")])
    return {
        int(q): int(o) + 1
        for q, o in zip(
            grouped.column("queue").to_pylist(), grouped.column("offset_max").to_pylist(), strict=True
        )
        if q is not None and o is not None
    }


def merge(into: Offsets, more: Offsets) -> Offsets:
    for q, o in more.items():
        if o > into.get(q, -1):
            into[q] = o
    return into


def _write(opts: WriteOptions, body: str, batches: Iterator[pa.RecordBatch]) -> WriteCommit:
    rows = 0
    positions: Offsets = {}
    with Client(opts.gateway, opts.token) as gw:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rows += gw.produce_encoded(opts.producer, encode_rows(batch, body))
            merge(positions, _positions(batch))
    ctx = TaskContext.get()
    query_id = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None) or ""
    return WriteCommit(rows, positions, query_id)


class MqgateBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Any, schema: StructType) -> None:
        self.opts = write_options(options)
        self.body = _body_column(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _write(self.opts, self.body, iterator)


class ProgressLog:
    """The last batch id whose progress was committed, per consumer and streaming query."""

    def __init__(self, directory: Path, gateway: str, consumer: str, query_id: str) -> None:
        key = hashlib.sha1(f"{gateway}\0{consumer}\0{query_id}".encode()).hexdigest()[:20]
        self.path = directory / f"{consumer}-{key}.json"

    def last(self) -> int:
        try:
            return int(json.loads(self.path.read_text())["batchId"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def record(self, batch_id: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"batchId": batch_id}))
        os.replace(tmp, self.path)  # atomic: a crash leaves the old or the new id


class MqgateStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Any, schema: StructType) -> None:
        self.opts = write_options(options)
        self.body = _body_column(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _write(self.opts, self.body, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts = self.opts
        if opts.progress_consumer is None:
            return
        done = [m for m in messages if isinstance(m, WriteCommit)]
        positions: Offsets = {}
        for m in done:
            merge(positions, m.offsets)
        query_id = next((m.query_id for m in done if m.query_id), "")
        log = ProgressLog(opts.progress_state_dir, opts.progress_gateway, opts.progress_consumer, query_id)
        if batchId <= log.last():
            return  # a replayed batch: its progress is committed already
        if positions:
            with Client(opts.progress_gateway, opts.progress_token) as gw:
                gw.commit(opts.progress_consumer, positions)
        log.record(batchId)
