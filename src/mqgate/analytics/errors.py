"""Error localisation: failed hops (status error) by node, service, queue and error type,
the top N of each with when they started, the failures over time of the top nodes, and
findings that name each fault's node, service and queue.

A failure's node is the event's errorNode, else the gateway that recorded it; its service
the consumer, else the producer, else the gateway's service; its type the errorType, else
the hop (as in mqgate.tracing.paths). The slow-consumer finding comes from latency: a client
whose median processing time is far above its consumer's other clients'.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mqgate.analytics.reports import iso

BUCKET_MS: Final = 600_000  # the failures-over-time series: 10-minute buckets
# A cause is a finding when it holds at least this share of the failures.
FINDING_SHARE: Final = 0.02
# A client is slow when its median processing time is this many times its peers' (or more).
SLOW_FACTOR: Final = 5.0
TOP_NODES_SERIES: Final = 5


# Why a failure names no queue: its message was never stored (a refused produce), or it was
# stored before the window (or under a policy that keeps no queue).
BEFORE_STORING: Final = "before storing"
QUEUE_UNKNOWN: Final = "unknown"


def failures(df: DataFrame) -> DataFrame:
    """The failed hops, each with the queue its message was stored in: a hop at the consumer's
    retry queue or inbox has none of its own (it names that topic as its source), so a dead
    letter after redeliveries would otherwise look as if it failed before storing."""
    failed = df.where(F.col("status") == "error")
    stored = (
        df.where((F.col("hop") == "stored") & F.col("queue").isNotNull())
        .join(failed.select("project", "topic", "msgId"), ["project", "topic", "msgId"], "left_semi")
        .groupBy("project", "topic", "msgId")
        .agg(F.min(F.struct("timeMs", "queue"))["queue"].alias("storedQueue"))
    )
    placed = failed.join(stored, ["project", "topic", "msgId"], "left")
    queue = F.coalesce(F.col("queue"), F.col("storedQueue"))
    return placed.select(
        "project",
        "topic",
        queue.alias("queue"),
        F.when(
            queue.isNull(), F.when(F.col("consumer").isNull(), BEFORE_STORING).otherwise(QUEUE_UNKNOWN)
        ).alias("unplaced"),
        "timeMs",
        F.coalesce(F.col("errorType"), F.col("hop")).alias("type"),
        F.coalesce(F.col("errorNode"), F.col("gatewayId")).alias("node"),
        F.coalesce(F.col("consumer"), F.col("producer"), F.col("service")).alias("service"),
    )


def _merge(
    groups: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[Any, ...]]
) -> list[dict[str, Any]]:
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for g in groups:
        k = key(g)
        m = merged.get(k)
        if m is None:
            merged[k] = {"key": k, "count": g["count"], "firstMs": g["firstMs"], "lastMs": g["lastMs"]}
        else:
            m["count"] += g["count"]
            m["firstMs"] = min(m["firstMs"], g["firstMs"])
            m["lastMs"] = max(m["lastMs"], g["lastMs"])
    return sorted(merged.values(), key=lambda m: (-m["count"], _none_last(m["key"])))


def _none_last(key: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    """A key that sorts (a queue of None, no node) after the values, never compared with them."""
    return tuple((v is None, 0 if v is None else v) for v in key)


def _top(groups: list[dict[str, Any]], names: tuple[str, ...], top_n: int) -> list[dict[str, Any]]:
    rows = _merge(groups, lambda g: tuple(g[n] for n in names))
    out = []
    for m in rows[:top_n]:
        values = dict(zip(names, m.pop("key"), strict=True))
        out.append({**values, **m, "first": iso(m["firstMs"]), "last": iso(m["lastMs"])})
    return out


def errors(df: DataFrame, top_n: int = 10) -> dict[str, Any]:
    f = failures(df)
    rows = (
        f.groupBy("type", "node", "service", "project", "topic", "queue", "unplaced")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.min("timeMs").alias("firstMs"),
            F.max("timeMs").alias("lastMs"),
        )
        .collect()
    )
    groups = [r.asDict() for r in rows]
    total = sum(g["count"] for g in groups)
    top_nodes = [t["node"] for t in _top(groups, ("node",), TOP_NODES_SERIES)]
    causes = _top(groups, ("type", "node"), top_n)
    for c in causes:  # what each cause hit
        mine = [g for g in groups if g["type"] == c["type"] and g["node"] == c["node"]]
        c["services"] = sorted({g["service"] for g in mine if g["service"] is not None})
        hit = {(g["project"], g["topic"], g["queue"]) for g in mine if g["queue"] is not None}
        c["queues"] = [{"project": p, "topic": t, "queue": q} for p, t, q in sorted(hit)]
        c["topics"] = sorted({f"{g['project']}/{g['topic']}" for g in mine})
        for key, why in (("beforeStoring", BEFORE_STORING), ("queueUnknown", QUEUE_UNKNOWN)):
            c[key] = sum(g["count"] for g in mine if g["unplaced"] == why)
    series_rows = (
        f.where(F.col("node").isin(*top_nodes))
        .groupBy("node", (F.floor(F.col("timeMs") / BUCKET_MS) * BUCKET_MS).alias("t"))
        .count()
        .collect()
        if top_nodes
        else []
    )
    series: dict[str, dict[int, int]] = defaultdict(dict)
    for r in series_rows:
        series[r["node"]][int(r["t"])] = int(r["count"])
    return {
        "total": total,
        "byNode": _top(groups, ("node",), top_n),
        "byService": _top(groups, ("service",), top_n),
        "byQueue": _top(groups, ("project", "topic", "queue"), top_n),
        "byType": _top(groups, ("type",), top_n),
        "causes": causes,
        "overTime": {
            "bucketMs": BUCKET_MS,
            "nodes": {n: [{"t": t, "count": c} for t, c in sorted(series[n].items())] for n in top_nodes},
        },
    }


def findings(errs: dict[str, Any], lat: dict[str, Any]) -> list[dict[str, Any]]:
    """What a person should look at first: each frequent cause (type at a node, for a service)
    with the queues it hit and when it started, and each slow consumer client."""
    out: list[dict[str, Any]] = []
    total = errs["total"] or 1
    for c in errs["causes"]:
        if c["count"] / total < FINDING_SHARE:
            continue
        out.append(
            {
                "kind": "failures",
                "type": c["type"],
                "node": c["node"],
                "services": c["services"],
                "topics": c["topics"],
                "queues": c["queues"],
                "beforeStoring": c["beforeStoring"],
                "queueUnknown": c["queueUnknown"],
                "count": c["count"],
                "share": round(c["count"] / total, 4),
                "started": c["first"],
                "startedMs": c["firstMs"],
                "last": c["last"],
            }
        )
    by_consumer: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in lat["byClient"]:
        by_consumer[(c["topic"], c["consumer"])].append(c)
    for (topic, consumer), clients in sorted(by_consumer.items()):
        for c in clients:
            peers = [p["process"]["p50"] for p in clients if p is not c and p["process"]["p50"] is not None]
            mine = c["process"]["p50"]
            if not peers or mine is None:
                continue
            base = max(1, sorted(peers)[len(peers) // 2])
            if mine >= SLOW_FACTOR * base:
                out.append(
                    {
                        "kind": "slow consumer",
                        "node": c["client"],
                        "service": consumer,
                        "topic": topic,
                        "processP50Ms": mine,
                        "processP99Ms": c["process"]["p99"],
                        "peersP50Ms": base,
                    }
                )
    return out
