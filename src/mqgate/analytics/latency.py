"""Per-hop latency of messages, from their events in the window (one shuffle by message).

A message is followed along each consumer's path (a topic with two consumer groups gives a
message two paths), and a path is cut into segments: segment 0 from the produce to the ack
or the dead letter (through any redeliveries and the retry queue), then one segment per
redrive, from its `redriven` hop (the dead letter copied back to the consumer's inbox).
For each message and consumer, along segment 0:

- `store`: accepted → the message's first stored hop;
- `deliver`: that stored hop → the consumer's first delivery (none when a delivery comes
  first in the window: its stored hop was before the window);
- `process`: the consumer's first ack with status ok → the delivery it acked: the last
  delivery before it to the same client (else to any client) in the same segment. A refused
  ack (status error) is no ack, and a later delivery (another attempt, a redrive) is never
  paired with an earlier ack, so no processing time is negative;
- `endToEnd`: accepted → that ack. A message dead-lettered on segment 0 has none, and counts
  as not acked, whatever happened after a redrive.

Each redrive segment is measured on its own (`redrive`): redriven → first delivery
(`deliver`), `process` as above, redriven → ack (`endToEnd`). A pair of hops in the wrong
time order (clocks of two gateways) is no pair: it gives no figure rather than a negative one.

Percentiles are Spark's `percentile_approx` at accuracy ACCURACY: each reported value lies
between the exact percentiles at p − 1/ACCURACY and p + 1/ACCURACY (in rank), which the tests
check against the generator's exact values at a stated ±0.1%.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from mqgate.tracing.events import HOP_ORDER

ACCURACY: Final = 10_000
PERCENTILES: Final = (0.5, 0.9, 0.99)
HOPS: Final = ("store", "deliver", "process", "endToEnd")
REDRIVE_HOPS: Final = ("deliver", "process", "endToEnd")
# Hops with a consumer that are not on its delivery path: a log reader's.
OFF_PATH: Final = ("read", "committed")
# Hops of one millisecond in their usual order (tracing.events.HOP_ORDER), except that a
# redrive starts its segment: before the delivery from the inbox it caused.
PATH_ORDER: Final = {**{hop: rank * 10 for hop, rank in HOP_ORDER.items()}, "redriven": 35}
MESSAGE: Final = ("project", "topic", "msgId")
SEGMENT: Final = (*MESSAGE, "consumer", "segment")


def _hop(name: str) -> Column:
    return F.col("hop") == name


def _when(hop: str) -> Column:
    return F.when(_hop(hop), F.col("timeMs"))


def _since(later: Column, earlier: Column) -> Column:
    """later − earlier, or null when either is missing or they are in the wrong order."""
    return F.when(later >= earlier, later - earlier)


def _rank() -> Column:
    order = F.create_map(*chain.from_iterable((F.lit(h), F.lit(r)) for h, r in sorted(PATH_ORDER.items())))
    return F.coalesce(order[F.col("hop")], F.lit(999))


def _upto(*keys: str | Column) -> Any:
    """Rows of one segment (and `keys`) in path order, up to the current one."""
    return (
        Window.partitionBy(*SEGMENT, *keys)
        .orderBy("timeMs", "rank")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def per_message(df: DataFrame) -> DataFrame:
    """One row per message, consumer and segment (consumer null: a message no consumer has a
    hop of): the acking client and the four latencies; `segment` 0 is the first path, n the
    path after the n-th redrive."""
    whole = Window.partitionBy(*MESSAGE)
    on_path = F.col("consumer").isNotNull() & ~F.col("hop").isin(*OFF_PATH)
    ev = df.select(*MESSAGE, "hop", "timeMs", "status", "consumer", "clientId", on_path.alias("onPath"))
    # The message's own hops (produce, store, the retry queue's) count for every consumer.
    ev = ev.select(
        "*",
        F.min(_when("accepted")).over(whole).alias("a"),
        F.min(_when("stored")).over(whole).alias("s"),
        F.max(F.col("onPath").cast("int")).over(whole).alias("paths"),
        _rank().alias("rank"),
    )
    ev = ev.where(F.col("onPath") | (F.col("paths") == 0)).withColumn(
        "consumer", F.when(F.col("onPath"), F.col("consumer"))
    )
    ordered = (
        Window.partitionBy(*MESSAGE, "consumer")
        .orderBy("timeMs", "rank")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    ev = ev.withColumn("segment", F.sum(_hop("redriven").cast("int")).over(ordered))
    delivery = _when("delivered")
    ev = ev.withColumn(
        "deliveredMs",
        F.coalesce(
            F.last(delivery, ignorenulls=True).over(_upto(F.coalesce(F.col("clientId"), F.lit("")))),
            F.last(delivery, ignorenulls=True).over(_upto()),
        ),
    )
    ok_ack = _hop("acked") & (F.col("status") == "ok")
    ack = F.struct(F.col("timeMs").alias("at"), F.col("deliveredMs").alias("delivered"), "clientId")
    m = ev.groupBy(*SEGMENT).agg(
        F.min("a").alias("a"),
        F.min("s").alias("s"),
        F.min(_when("redriven")).alias("r"),
        F.min(delivery).alias("d1"),
        F.min(F.when(ok_ack, ack)).alias("k"),
    )
    first = F.col("segment") == 0
    start = F.when(first, F.col("a")).otherwise(F.col("r"))
    acked_at = F.col("k")["at"]
    return m.select(
        *SEGMENT,
        F.col("k")["clientId"].alias("client"),
        F.when(first, _since(F.col("s"), F.col("a"))).alias("store"),
        _since(F.col("d1"), F.when(first, F.col("s")).otherwise(F.col("r"))).alias("deliver"),
        _since(acked_at, F.col("k")["delivered"]).alias("process"),
        _since(acked_at, start).alias("endToEnd"),
        F.col("a").alias("acceptedMs"),
        F.col("r").alias("redrivenMs"),
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


def _redrives(m: DataFrame) -> dict[str, Any]:
    """The paths after a redrive: how many, how many were acked, and their latencies."""
    again = m.where(F.col("segment") > 0)
    counted = [F.count(F.lit(1)).alias("redriven"), F.count("endToEnd").alias("acked")]
    overall = again.agg(*counted, *_stats(REDRIVE_HOPS)).collect()[0]
    groups = again.groupBy("project", "topic", "consumer").agg(*counted, *_stats(REDRIVE_HOPS)).collect()
    return {
        "redriven": int(overall["redriven"]),
        "acked": int(overall["acked"]),
        "overall": _figures(overall, REDRIVE_HOPS),
        "byTopicConsumer": [
            {
                "project": r["project"],
                "topic": r["topic"],
                "consumer": r["consumer"],
                "redriven": int(r["redriven"]),
                "acked": int(r["acked"]),
                **_figures(r, REDRIVE_HOPS),
            }
            for r in sorted(groups, key=lambda r: (r["project"], r["topic"], r["consumer"] or ""))
        ],
    }


def latency(df: DataFrame, slowest: int = 20) -> dict[str, Any]:
    """Percentiles of the first path overall (`store` once per message), per topic and
    consumer, per consumer client (processing only); the `slowest` acked messages end to end;
    the redrives' own figures."""
    m = per_message(df).persist()
    try:
        first = m.where(F.col("segment") == 0)
        stores = first.groupBy(*MESSAGE).agg(F.max("store").alias("store")).agg(*_stats(("store",)))
        overall = {
            **_figures(stores.collect()[0], ("store",)),
            **_figures(first.agg(*_stats(HOPS[1:])).collect()[0], HOPS[1:]),
        }
        by_topic = first.groupBy("project", "topic", "consumer").agg(*_stats(HOPS)).collect()
        by_client = (
            first.where(F.col("client").isNotNull())
            .groupBy("topic", "consumer", "client")
            .agg(*_stats(("process",)))
            .collect()
        )
        slow = (
            first.where(F.col("endToEnd").isNotNull())
            .orderBy(F.col("endToEnd").desc(), F.col("msgId"), F.col("consumer"))
            .limit(slowest)
            .collect()
        )
        # Not acked along the first path in the window (expired, dead-lettered, still in
        # flight, or accepted before it), per message and consumer.
        unfinished = first.where(F.col("endToEnd").isNull()).count()
        redrive = _redrives(m)
    finally:
        m.unpersist()
    return {
        "accuracy": ACCURACY,
        "overall": overall,
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
        "redrive": redrive,
    }
