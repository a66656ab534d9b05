"""What the analytics dataset holds: the parsed event's columns, and the layout on disk.

The dataset is `<out>/events/date=YYYY-MM-DD/project=NAME/*.parquet` (the date of the
event's time, UTC), one row per trace event; `<out>/malformed/` keeps the records that did
not parse (their source position and a sample), so they are counted, never lost or fatal.
A row's source position (`srcTopic`, `srcQueue`, `srcOffset`) with its `msgId` and `hop` is
unique (a batch record holds many messages' hops): compaction drops duplicates by them, so a
record written twice (a replay after a crash) is counted once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

_S: Final = StringType()

# The JSON of mqgate.tracing.events.TraceEvent, as Spark parses it (body, keys and
# traceparent are read but not kept: analytics needs no content).
EVENT_JSON: Final = StructType(
    [
        StructField("msgId", _S),
        StructField("hop", _S),
        StructField("timeMs", LongType()),
        StructField("project", _S),
        StructField("topic", _S),
        StructField(
            "resource",
            StructType(
                [
                    StructField("gatewayId", _S),
                    StructField("host", _S),
                    StructField("service", _S),
                    StructField("port", IntegerType()),
                ]
            ),
        ),
        StructField("status", _S),
        StructField("level", _S),
        StructField("requestId", _S),
        StructField("keys", ArrayType(_S)),
        StructField("queue", IntegerType()),
        StructField("offset", LongType()),
        StructField("producer", _S),
        StructField("consumer", _S),
        StructField("clientId", _S),
        StructField("clientAddr", _S),
        StructField("attempt", IntegerType()),
        StructField("errorType", _S),
        StructField("errorNode", _S),
        StructField("detail", _S),
    ]
)

# The JSON of mqgate.tracing.batch.TraceBatch: the produce hops of many messages in one record,
# expanded into one row per message and hop (bodies and trace contexts are not read).
BATCH_JSON: Final = StructType(
    [
        StructField("kind", _S),
        StructField("hops", ArrayType(_S)),
        StructField("timeMs", LongType()),
        StructField("lastMs", LongType()),
        StructField("project", _S),
        StructField("topic", _S),
        EVENT_JSON["resource"],
        StructField("msgIds", ArrayType(_S)),
        StructField("firstId", _S),
        StructField("count", IntegerType()),
        StructField("level", _S),
        StructField("queue", IntegerType()),
        StructField("firstOffset", LongType()),
        StructField("producer", _S),
        StructField("keys", ArrayType(ArrayType(_S))),
        StructField("timesMs", ArrayType(LongType())),
        StructField(
            "parts",
            ArrayType(
                StructType(
                    [
                        StructField("firstId", _S),
                        StructField("count", IntegerType()),
                        StructField("queue", IntegerType()),
                        StructField("firstOffset", LongType()),
                    ]
                )
            ),
        ),
    ]
)

# The JSON of mqgate.tracing.batch.TraceRound: the batches of one group-commit round.
ROUND_JSON: Final = StructType([StructField("kind", _S), StructField("batches", ArrayType(BATCH_JSON))])

# Columns of a dataset row, in order; `date` and `project` are also the partition folders.
SOURCE_COLUMNS: Final = ("srcTopic", "srcQueue", "srcOffset", "storedMs")
EVENT_COLUMNS: Final = (
    "msgId",
    "hop",
    "timeMs",
    "topic",
    "gatewayId",
    "host",
    "service",
    "port",
    "status",
    "level",
    "requestId",
    "queue",
    "offset",
    "producer",
    "consumer",
    "clientId",
    "attempt",
    "errorType",
    "errorNode",
    "detail",
)
PARTITIONS: Final = ("date", "project")
MALFORMED_COLUMNS: Final = ("srcTopic", "srcQueue", "srcOffset", "storedMs", "project", "reason", "sample")
# The raw input: what the `mqgate` source gives, reduced to what the input stage needs.
RAW_COLUMNS: Final = ("topic", "queue", "offset", "timestamp", "body")
SAMPLE_CHARS: Final = 200


def events_dir(out: Path) -> Path:
    return out / "events"


def malformed_dir(out: Path) -> Path:
    return out / "malformed"


def state_dir(out: Path) -> Path:
    """Checkpoints and bookkeeping; the leading underscore keeps Spark from reading it as data."""
    return out / "_state"
