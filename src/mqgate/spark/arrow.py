"""Stored messages turned into Arrow record batches of the source's schema.

Rows go to Spark as `pyarrow.RecordBatch`es built column by column: far cheaper than Spark
converting Python tuples one value at a time. PySpark accepts a batch only if its Arrow
schema equals exactly the one it derives from the Spark schema, so that one is used here.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from itertools import chain
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from mqgate.spark.schema import SCHEMA

ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
_LIST: Final = ARROW_SCHEMA.field("keys").type
_MAP: Final = ARROW_SCHEMA.field("properties").type
_TS: Final = ARROW_SCHEMA.field("timestamp").type
_STRING: Final = pa.string()
_INT32: Final = pa.int32()
_NO_STRINGS: Final = pa.array([], _STRING)


class Record(
    msgspec.Struct,
    gc=False,
    rename={"msg_id": "messageId", "body": "message", "timestamp_ms": "timestamp",
            "deliver_at_ms": "deliverAt", "deadline_ms": "deadline"},
):  # fmt: skip
    """A stored message as read (StoredMessage's wire form; the delivery fields /mq/read adds
    are skipped). Not tracked by the garbage collector: it holds no cycles, and tracking
    10,000 of them per page made the collector a large share of the decoding time."""

    msg_id: str
    timestamp_ms: int
    producer: str
    body: str
    # Tuples: an empty one is a shared constant, so the usual "keys":[] allocates nothing.
    keys: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    properties: dict[str, str] = {}
    priority: int | None = None
    deliver_at_ms: int | None = None
    deadline_ms: int | None = None


class _ReadResult(msgspec.Struct, gc=False):
    offset: int
    next: int
    msgList: list[Record]


class _ReadAnswer(msgspec.Struct, gc=False):
    result: _ReadResult


_decode_answer = msgspec.json.Decoder(_ReadAnswer).decode
_decode_records = msgspec.json.Decoder(list[Record]).decode


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic collector while a page's objects are made: they are freed by
    reference counting, and a page allocates enough containers to set off several full
    collections of the worker's (large) heap otherwise."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_read(body: bytes) -> tuple[int, int, list[Record]]:
    """A /mq/read answer: (first offset, next offset, messages)."""
    with _no_gc():
        r = _decode_answer(body).result
    return r.offset, r.next, r.msgList


def decode_stored(payloads: list[bytes]) -> list[Record]:
    """Stored JSON records (as the Redis store keeps them), decoded in one call."""
    with _no_gc():
        return _decode_records(b"[" + b",".join(payloads) + b"]")


def _offsets(lengths: list[int]) -> pa.Array:
    out = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out, _INT32)


def _string_lists(values: list[tuple[str, ...]]) -> pa.Array:
    if not any(values):  # the usual case: no keys (tags) at all
        return pa.ListArray.from_arrays(
            pa.array(np.zeros(len(values) + 1, np.int32)), _NO_STRINGS, type=_LIST
        )
    flat = list(chain.from_iterable(values))
    return pa.ListArray.from_arrays(_offsets(list(map(len, values))), pa.array(flat, _STRING), type=_LIST)


def _string_maps(values: list[dict[str, str]]) -> pa.Array:
    if not any(values):
        offsets, keys, items = pa.array(np.zeros(len(values) + 1, np.int32)), _NO_STRINGS, _NO_STRINGS
    else:
        offsets = _offsets(list(map(len, values)))
        keys = pa.array(list(chain.from_iterable(values)), _STRING)
        items = pa.array(list(chain.from_iterable(v.values() for v in values)), _STRING)
    return pa.MapArray.from_arrays(offsets, keys, items, type=_MAP)


def _optional_times(ms: list[int | None]) -> pa.Array:
    if ms.count(None) == len(ms):
        return pa.nulls(len(ms), _TS)
    return pa.array([None if v is None else v * 1000 for v in ms], _TS)


def to_batch(topic: str, broker: str, queue: int, first: int, msgs: list[Record]) -> pa.RecordBatch:
    """The rows of `msgs`, stored at offsets first, first+1, ... of `queue`."""
    n = len(msgs)
    with _no_gc():
        priorities = [m.priority for m in msgs]
        columns: list[Any] = [
            pa.repeat(pa.scalar(topic, _STRING), n),
            pa.repeat(pa.scalar(broker, _STRING), n),
            pa.repeat(pa.scalar(queue, _INT32), n),
            pa.array(np.arange(first, first + n, dtype=np.int64)),
            pa.array([m.msg_id for m in msgs], _STRING),
            _string_lists([m.keys for m in msgs]),
            _string_lists([m.tags for m in msgs]),
            _string_maps([m.properties for m in msgs]),
            pa.array(np.array([m.timestamp_ms for m in msgs], np.int64) * 1000, _TS),
            pa.array([m.body for m in msgs], _STRING),
            pa.array([m.producer for m in msgs], _STRING),
            pa.nulls(n, _INT32) if priorities.count(None) == n else pa.array(priorities, _INT32),
            _optional_times([m.deliver_at_ms for m in msgs]),
            _optional_times([m.deadline_ms for m in msgs]),
        ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
