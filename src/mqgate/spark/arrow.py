# mypy: disable-error-code="import-untyped"
"""The source's row schema, and stored messages turned into Arrow record batches.

Rows go to Spark as `pyarrow.RecordBatch`es built column by column: far cheaper than Spark
converting Python tuples one value at a time. PySpark accepts a batch only if its Arrow
schema equals exactly the one it derives from the Spark schema, so that one is used here.
"""

from __future__ import annotations

from itertools import accumulate, chain
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqgate.model import StoredMessage

_S: Final = StringType()

SCHEMA: Final = StructType(
    [
        StructField("topic", _S, False),
        StructField("broker", _S, False),
        StructField("queue", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("messageId", _S, False),
        StructField("keys", ArrayType(_S, False), False),
        StructField("tags", ArrayType(_S, False), False),
        StructField("properties", MapType(_S, _S, False), False),
        StructField("timestamp", TimestampType(), False),
        StructField("body", _S, False),
        StructField("producer", _S, False),
        StructField("priority", IntegerType(), True),
        StructField("deliverAt", TimestampType(), True),
        StructField("deadline", TimestampType(), True),
    ]
)
ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
_LIST: Final = ARROW_SCHEMA.field("keys").type
_MAP: Final = ARROW_SCHEMA.field("properties").type
_TS: Final = ARROW_SCHEMA.field("timestamp").type
_STRING: Final = pa.string()
_INT32: Final = pa.int32()


class _ReadResult(msgspec.Struct):
    offset: int
    next: int
    msgList: list[StoredMessage]


class _ReadAnswer(msgspec.Struct):
    result: _ReadResult


_decode_answer = msgspec.json.Decoder(_ReadAnswer).decode
_decode_messages = msgspec.json.Decoder(list[StoredMessage]).decode


def decode_read(body: bytes) -> tuple[int, int, list[StoredMessage]]:
    """A /mq/read answer: (first offset, next offset, messages)."""
    r = _decode_answer(body).result
    return r.offset, r.next, r.msgList


def decode_stored(payloads: list[bytes]) -> list[StoredMessage]:
    """Stored JSON records (as the Redis store keeps them), decoded in one call."""
    return _decode_messages(b"[" + b",".join(payloads) + b"]")


def _offsets(lengths: list[int]) -> pa.Array:
    return pa.array(np.fromiter(accumulate(lengths, initial=0), np.int32, len(lengths) + 1), _INT32)


def _string_lists(values: list[list[str]]) -> pa.Array:
    lengths = [len(v) for v in values]
    flat = list(chain.from_iterable(values)) if any(lengths) else []
    return pa.ListArray.from_arrays(_offsets(lengths), pa.array(flat, _STRING), type=_LIST)


def _string_maps(values: list[dict[str, str]]) -> pa.Array:
    lengths = [len(v) for v in values]
    if any(lengths):
        keys = list(chain.from_iterable(values))
        items = list(chain.from_iterable(v.values() for v in values))
    else:
        keys = items = []
    return pa.MapArray.from_arrays(
        _offsets(lengths), pa.array(keys, _STRING), pa.array(items, _STRING), type=_MAP
    )


def _times(ms: list[int]) -> pa.Array:
    return pa.array(np.array(ms, np.int64) * 1000, _TS)


def _optional_times(ms: list[int | None]) -> pa.Array:
    if all(v is None for v in ms):
        return pa.nulls(len(ms), _TS)
    return pa.array([None if v is None else v * 1000 for v in ms], _TS)


def to_batch(topic: str, broker: str, queue: int, first: int, msgs: list[StoredMessage]) -> pa.RecordBatch:
    """The rows of `msgs`, stored at offsets first, first+1, ... of `queue`."""
    n = len(msgs)
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
        _times([m.timestamp_ms for m in msgs]),
        pa.array([m.body for m in msgs], _STRING),
        pa.array([m.producer for m in msgs], _STRING),
        pa.nulls(n, _INT32) if all(p is None for p in priorities) else pa.array(priorities, _INT32),
        _optional_times([m.deliver_at_ms for m in msgs]),
        _optional_times([m.deadline_ms for m in msgs]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
