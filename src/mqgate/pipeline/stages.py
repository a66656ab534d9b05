"""The two per-partition stages of a micro-batch, on Arrow record batches (`mapInArrow`).

1. `route_batches`, one task per source queue range: reads the source's Arrow columns, parses
   each message once into its events and tags each with the Spark task that runs its worker
   queue (the `tag` column, see dispatch.partition_tags). The output is Arrow again; Spark
   shuffles it by `tag` (`repartition(T, "tag")`).
2. `run_batches`, one task per T: turns its rows into the worker queues (executor.run_task)
   and answers one row, the task's report.

No Row objects and no pickled events: an event is a Python object only while it is parsed
and while a worker writes it. Parse failures, the source progress and (event queries) the
partition's event count ride along as rows of their own kind (the `item` column).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from mqgate.pipeline.config import PipelineConfig
from mqgate.pipeline.dispatch import spread_of, stable_hash, task_of, worker_of
from mqgate.pipeline.executor import KIND_EVENTS, KIND_RETRY, TaskInput, TaskPlan, TaskReport, run_task
from mqgate.pipeline.parsing import Event, ParseFailure, SourceMessage, parse_internal, parse_message

# The source columns a micro-batch is narrowed to before it goes to Python.
COLUMNS: Final = ("messageId", "body", "topic", "queue", "offset", "timestamp", "keys", "properties")

# What a routed row is (`item`).
ITEM_EVENT: Final = 0
ITEM_FAILURE: Final = 1
ITEM_PROGRESS: Final = 2  # the next offset of a source queue
ITEM_BATCH_SIZE: Final = 3  # the events of one stage-1 partition (event queries, to every task)

_S: Final = StringType()
ROUTED_SCHEMA: Final = StructType(
    [
        StructField("tag", IntegerType(), False),
        StructField("item", ByteType(), False),
        StructField("worker", IntegerType(), True),
        StructField("event_id", _S, True),
        StructField("type", _S, True),
        StructField("key", _S, True),
        StructField("fields", MapType(_S, _S, True), True),
        StructField("payload", _S, True),
        StructField("event_ms", LongType(), True),
        StructField("source", _S, True),
        StructField("attempts", IntegerType(), True),
        StructField("origin", _S, True),
        StructField("error", _S, True),
        StructField("queue", IntegerType(), True),
        StructField("number", LongType(), True),  # next offset (progress) or events (batch size)
    ]
)
ROUTED_ARROW: Final = to_arrow_schema(ROUTED_SCHEMA)
# The columns of an event row, in the order task_input reads them.
_EVENT_COLUMNS: Final = (
    "worker", "event_id", "type", "key", "fields", "payload", "event_ms", "source", "attempts", "origin",
)  # fmt: skip
REPORT_SCHEMA: Final = StructType([StructField("report", BinaryType(), False)])
REPORT_ARROW: Final = to_arrow_schema(REPORT_SCHEMA)
_encode_report = msgspec.msgpack.Encoder().encode
_decode_report = msgspec.msgpack.Decoder(TaskReport).decode


class _Routed:
    """Routed rows gathered column by column, then made into one Arrow batch."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in ROUTED_ARROW.names}

    def __len__(self) -> int:
        return len(self.columns["tag"])

    def add(self, tag: int, item: int, **values: Any) -> None:
        for name, column in self.columns.items():
            column.append(values.get(name))
        self.columns["tag"][-1] = tag
        self.columns["item"][-1] = item

    def event(self, tag: int, worker: int, e: Event) -> None:
        c = self.columns
        c["tag"].append(tag)
        c["item"].append(ITEM_EVENT)
        c["worker"].append(worker)
        c["event_id"].append(e.event_id)
        c["type"].append(e.type)
        c["key"].append(e.key)
        c["fields"].append(e.fields)
        c["payload"].append(e.payload)
        c["event_ms"].append(e.event_ms)
        c["source"].append(e.source)
        c["attempts"].append(e.attempts)
        c["origin"].append(e.origin)
        c["error"].append(None)
        c["queue"].append(None)
        c["number"].append(None)

    def take(self) -> pa.RecordBatch:
        arrays = [pa.array(self.columns[f.name], f.type) for f in ROUTED_ARROW]
        for column in self.columns.values():
            column.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=ROUTED_ARROW)


def source_messages(batch: pa.RecordBatch, with_keys: bool, with_properties: bool) -> Iterator[SourceMessage]:
    """The messages of one batch of the source's columns; keys and properties only when the
    parser reads them (they are the costliest columns to turn into Python values)."""
    n = batch.num_rows
    ids = batch.column("messageId").to_pylist()
    bodies = batch.column("body").to_pylist()
    topics = batch.column("topic").to_pylist()
    queues = batch.column("queue").to_pylist()
    offsets = batch.column("offset").to_pylist()
    micros = batch.column("timestamp").cast(pa.int64())
    millis = pc.divide(micros, 1000).to_pylist()
    keys: Sequence[Any] = batch.column("keys").to_pylist() if with_keys else [()] * n
    props: Sequence[Any] = (
        [dict(p or ()) for p in batch.column("properties").to_pylist()] if with_properties else [{}] * n
    )
    for i in range(n):
        yield SourceMessage(
            ids[i], bodies[i], topics[i], queues[i], offsets[i], millis[i] or 0, keys[i] or (), props[i]
        )


def route_batches(
    config: PipelineConfig, kind: str, type_name: str, tags: Sequence[int], batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Stage 1 (mapInArrow): the events and parse failures of the source rows, each tagged with
    its task's tag; then one progress row per source queue, and for event queries the
    partition's event count to every task. Events go to a worker by key hash on the event
    queries, spread by event id on the hot and retry queries. All events of a key reach one
    task, which therefore sees its workers' whole load."""
    tasks = len(tags)
    partitions = config.job.partitions
    types = {et.type: et for et in config.events}
    internal = kind != KIND_EVENTS
    parse: Callable[[SourceMessage], tuple[list[Event], list[ParseFailure]]]
    if internal:
        parse = functools.partial(parse_internal, types=types, next_attempt=kind == KIND_RETRY)
        with_keys = False
    else:
        et = types[type_name]
        parse = functools.partial(parse_message, et)
        with_keys = et.format in ("string", "bytes") or not et.key
    out = _Routed()
    ends: dict[int, int] = {}
    events = 0
    for batch in batches:
        for message in source_messages(batch, with_keys, internal):
            ends[message.queue] = max(ends.get(message.queue, 0), message.offset + 1)
            parsed, failures = parse(message)
            for e in parsed:
                worker = worker_of(e.key, partitions) if not internal else spread_of(e.event_id, partitions)
                out.event(tags[task_of(worker, tasks)], worker, e)
            for f in failures:
                tag = tags[stable_hash(f.event_id) % tasks]
                out.add(tag, ITEM_FAILURE, event_id=f.event_id, type=f.type, payload=f.payload,
                        error=f.error, source=f.source)  # fmt: skip
            events += len(parsed)
        if len(out):
            yield out.take()
    for queue, next_offset in sorted(ends.items()):
        out.add(tags[queue % tasks], ITEM_PROGRESS, queue=queue, number=next_offset)
    if not internal:
        for tag in tags:
            out.add(tag, ITEM_BATCH_SIZE, number=events)
    if len(out):
        yield out.take()


def task_input(batches: Iterable[pa.RecordBatch]) -> TaskInput:
    """The worker queues, parse failures, progress and batch size in one task's routed rows."""
    queues: dict[int, list[Event]] = defaultdict(list)
    result = TaskInput(queues)
    for batch in batches:
        is_event = pc.equal(batch.column("item"), ITEM_EVENT)
        events = batch.filter(is_event)
        if events.num_rows:
            columns = [events.column(name).to_pylist() for name in _EVENT_COLUMNS]
            for worker, event_id, type_name, key, fields, payload, ms, source, attempts, origin in zip(
                *columns, strict=True
            ):
                event = Event(
                    event_id, type_name, key, dict(fields or ()), payload, ms, source, attempts, origin
                )
                queues[worker].append(event)
        if events.num_rows == batch.num_rows:
            continue
        for row in batch.filter(pc.invert(is_event)).to_pylist():
            if row["item"] == ITEM_FAILURE:
                result.failures.append(
                    ParseFailure(row["event_id"], row["type"], row["payload"], row["error"], row["source"])
                )
            elif row["item"] == ITEM_PROGRESS:
                result.ends[row["queue"]] = max(result.ends.get(row["queue"], 0), row["number"])
            elif row["item"] == ITEM_BATCH_SIZE:
                result.batch_events += row["number"]
    return result


def run_batches(plan: TaskPlan, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 2 (mapInArrow after the shuffle): run this task's worker queues; one report row."""
    yield report_batch(run_task(plan, task_input(batches)))


def report_batch(report: TaskReport) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([_encode_report(report)], pa.binary())], schema=REPORT_ARROW)


def read_reports(table: pa.Table) -> list[TaskReport]:
    """The reports of stage 2, collected on the driver (`toArrow()`)."""
    return [_decode_report(blob) for blob in table.column("report").to_pylist()]
