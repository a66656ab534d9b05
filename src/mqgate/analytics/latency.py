"""Per-hop latency of messages, from their events in the window (one shuffle by message).

For each message: accepted → stored (`store`), stored → first delivery (`deliver`), last
delivery → acked (`process`: the delivery that was acked), accepted → acked (`endToEnd`).
Percentiles are Spark's `percentile_approx` at accuracy ACCURACY: each reported value lies
between the exact percentiles at p − 1/ACCURACY and p + 1/ACCURACY (in rank), which the tests
check against the generator's exact values at a stated ±0.1%.
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

ACCURACY: Final = 10_000
PERCENTILES: Final = (0.5, 0.9, 0.99)
HOPS: Final = ("store", "deliver", "process", "endToEnd")


def _at(hop: str, how: Any, column: str = "timeMs") -> Column:
    result: Column = how(F.when(F.col("hop") == hop, F.col(column)))
    return result


def per_message(df: DataFrame) -> DataFrame:
    """One row per message: its topic, consumer, acking client and the four latencies."""
    m = df.groupBy("project", "topic", "msgId").agg(
        _at("accepted", F.min).alias("a"),
        _at("stored", F.min).alias("s"),
        _at("delivered", F.min).alias("d1"),
        _at("delivered", F.max).alias("dn"),
        _at("acked", F.max).alias("k"),
        F.first(F.col("consumer"), ignorenulls=True).alias("consumer"),
        _at("acked", F.max, "clientId").alias("client"),
    )
    return m.select(
        "project",
        "topic",
        "msgId",
        "consumer",
        "client",
        (F.col("s") - F.col("a")).alias("store"),
        (F.col("d1") - F.col("s")).alias("deliver"),
        (F.col("k") - F.col("dn")).alias("process"),
        (F.col("k") - F.col("a")).alias("endToEnd"),
        F.col("a").alias("acceptedMs"),
    )


def _stats(hops: tuple[str, ...]) -> list[Column]:
    cols: list[Column] = []
    for h in hops:
        cols += [
            F.percentile_approx(h, list(PERCENTILES), ACCURACY).alias(f"{h}_p"),
            F.max(h).alias(f"{h}_max"),
            F.count(h).alias(f"{h}_n"),
        ]
    return cols


def _figures(row: Any, hops: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for h in hops:
        p = row[f"{h}_p"]
        n = int(row[f"{h}_n"])
        out[h] = {
            "count": n,
            **{
                f"p{round(q * 100)}": (int(v) if v is not None else None)
                for q, v in zip(PERCENTILES, p or [None] * 3, strict=True)
            },
            "max": int(row[f"{h}_max"]) if row[f"{h}_max"] is not None else None,
        }
    return out


def latency(df: DataFrame, slowest: int = 20) -> dict[str, Any]:
    """Percentiles overall, per topic and consumer, per consumer client (processing only),
    and the `slowest` acked messages end to end."""
    m = per_message(df).persist()
    try:
        overall = m.agg(*_stats(HOPS)).collect()[0]
        by_topic = m.groupBy("project", "topic", "consumer").agg(*_stats(HOPS)).collect()
        by_client = (
            m.where(F.col("client").isNotNull())
            .groupBy("topic", "consumer", "client")
            .agg(*_stats(("process",)))
            .collect()
        )
        slow = (
            m.where(F.col("endToEnd").isNotNull())
            .orderBy(F.col("endToEnd").desc(), F.col("msgId"))
            .limit(slowest)
            .collect()
        )
        # Not acked in the window (expired, dead-lettered, still in flight, or accepted before it).
        unfinished = m.where(F.col("endToEnd").isNull()).count()
    finally:
        m.unpersist()
    return {
        "accuracy": ACCURACY,
        "overall": _figures(overall, HOPS),
        "byTopicConsumer": [
            {"project": r["project"], "topic": r["topic"], "consumer": r["consumer"], **_figures(r, HOPS)}
            for r in sorted(by_topic, key=lambda r: (r["project"], r["topic"], r["consumer"] or ""))
        ],
        "byClient": [
            {
                "topic": r["topic"],
                "consumer": r["consumer"],
                "client": r["client"],
                **_figures(r, ("process",)),
            }
            for r in sorted(by_client, key=lambda r: (r["topic"], r["consumer"] or "", r["client"]))
        ],
        "slowest": [
            {
                "msgId": r["msgId"],
                "project": r["project"],
                "topic": r["topic"],
                "consumer": r["consumer"],
                "client": r["client"],
                "acceptedMs": r["acceptedMs"],
                **{h: r[h] for h in HOPS},
            }
            for r in slow
        ],
        "unacked": unfinished,
    }
