"""The row schema of the `mqgate` source (fixed: every topic reads as these columns).

Kept apart from the Arrow conversion so that Spark's planning processes, which only need
the schema, do not import pyarrow and pandas.
"""

from __future__ import annotations

from typing import Final

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
