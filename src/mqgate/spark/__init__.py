"""Spark over mqgate: the `mqgate` data source (batch and streaming reader and writer).

    spark = mqgate.spark.session("job")
    df = (spark.read.format("mqgate").option("gateway", url).option("token", admin)
          .option("topic", "orders").load())

Options: mqgate.spark.options; offsets (a JSON object {"<store queue>": next offset}):
mqgate.spark.offsets. Progress of a consumer group is committed by the streaming sink
(option `progressConsumer`) or, in foreachBatch, with `end_offsets` and `commit_progress`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from mqgate.spark.session import register, session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["commit_progress", "end_offsets", "register", "session"]


def commit_progress(gateway: str, token: str, consumer: str, offsets: Mapping[int, int]) -> dict[int, int]:
    """Raise `consumer`'s committed offsets to `offsets` ({store queue: next offset to read});
    never lowers one, so committing again is harmless. Returns the committed values."""
    from mqgate.client import Client

    if not offsets:
        return {}
    with Client(gateway, token) as gw:
        return gw.commit(consumer, offsets)


def end_offsets(df: DataFrame) -> dict[int, int]:
    """{queue: max(offset) + 1} of a DataFrame read from an mqgate source (e.g. a
    foreachBatch micro-batch): what to pass to commit_progress once it is processed."""
    from pyspark.sql import functions as F

    rows = df.groupBy("queue").agg(F.max("offset").alias("last")).collect()
    return {int(r["queue"]): int(r["last"]) + 1 for r in rows if r["last"] is not None}
