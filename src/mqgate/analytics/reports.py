"""The report's figures, computed by Spark from the Parquet dataset over a window and a
project (or all): counts, rates per minute and hour, each service's capacity. Latency is in
mqgate.analytics.latency, error localisation in mqgate.analytics.errors.

Definitions (docs/ANALYTICS.md):
- counts are events of each hop: `produced` = accepted, `delivered` = deliveries (a
  redelivered message counts again; `redelivered` says how often), `failed` = events with
  status error (any hop), `released`, `lockExpired`, `expired` and `deadLettered` = those hops;
- capacity of a service = what it handled per second: producers their `accepted` hops,
  consumers (and each consumer client) their `acked` hops, gateways every `accepted`,
  `delivered` and `acked` hop they served; `peakPerS` is the busiest minute,
  `sustainedPerS` the busiest 10-minute tumbling window (aligned to the epoch).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mqgate.analytics.columns import events_dir, malformed_dir

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000
SUSTAINED_MINUTES: Final = 10
SERIES: Final = ("accepted", "delivered", "acked", "errors")
COUNTED_HOPS: Final = {
    "produced": "accepted",
    "stored": "stored",
    "delivered": "delivered",
    "redelivered": "redelivered",
    "acked": "acked",
    "released": "released",
    "lockExpired": "lock_expired",
    "expired": "expired",
    "deadLettered": "dead_lettered",
}


@dataclass(frozen=True)
class Window:
    """[from_ms, to_ms) and a project (None: all). Open ends read everything."""

    from_ms: int | None = None
    to_ms: int | None = None
    project: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "from": iso(self.from_ms) if self.from_ms is not None else None,
            "to": iso(self.to_ms) if self.to_ms is not None else None,
            "fromMs": self.from_ms,
            "toMs": self.to_ms,
            "project": self.project,
        }


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (
        dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d")


def known_projects(out: Path) -> list[str]:
    """The projects the dataset has events of (from its partition folders)."""
    found = {p.name.removeprefix("project=") for p in events_dir(out).glob("date=*/project=*") if p.is_dir()}
    return sorted(found)


def load_events(spark: SparkSession, out: Path, window: Window) -> DataFrame | None:
    """The dataset's events in the window (None when the dataset has none at all). Date and
    project filters are on the partition columns, so Spark reads only those folders."""
    root = events_dir(out)
    if not any(root.glob("date=*/project=*/*.parquet")):
        return None
    df = spark.read.option("basePath", str(root)).parquet(str(root))
    if window.project is not None:
        df = df.where(F.col("project") == window.project)
    if window.from_ms is not None:
        df = df.where((F.col("date") >= _day(window.from_ms)) & (F.col("timeMs") >= window.from_ms))
    if window.to_ms is not None:
        df = df.where((F.col("date") <= _day(window.to_ms)) & (F.col("timeMs") < window.to_ms))
    return df


def counts(df: DataFrame) -> dict[str, Any]:
    """Counts per hop and status, overall and per project."""
    rows = df.groupBy("project", "hop", "status").count().collect()
    hops: dict[str, int] = defaultdict(int)
    per_project: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failed: dict[str, int] = defaultdict(int)
    for r in rows:
        hops[r["hop"]] += int(r["count"])
        per_project[r["project"]][r["hop"]] += int(r["count"])
        if r["status"] == "error":
            failed[r["project"]] += int(r["count"])

    def summary(by_hop: dict[str, int], errors: int) -> dict[str, int]:
        out = {name: int(by_hop.get(hop, 0)) for name, hop in COUNTED_HOPS.items()}
        out["failed"] = errors
        out["events"] = sum(by_hop.values())
        return out

    return {
        "total": summary(hops, sum(failed.values())),
        "byProject": {p: summary(h, failed[p]) for p, h in sorted(per_project.items())},
        "byHop": dict(sorted(hops.items())),
    }


def _series_column() -> Any:
    return F.when(F.col("status") == "error", F.lit("errors")).when(
        F.col("hop").isin("accepted", "delivered", "acked"), F.col("hop")
    )


def rates(df: DataFrame) -> dict[str, Any]:
    """Events per minute and per hour of each series (accepted, delivered, acked, errors),
    overall and per project; minutes and hours are UTC, aligned to the epoch."""
    rows = (
        df.select(
            "project", F.floor(F.col("timeMs") / MINUTE_MS).alias("minute"), _series_column().alias("s")
        )
        .where(F.col("s").isNotNull())
        .groupBy("project", "minute", "s")
        .count()
        .collect()
    )
    minutes: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SERIES, 0))
    hours: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SERIES, 0))
    project_hours: dict[str, dict[int, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: dict.fromkeys(SERIES, 0))
    )
    for r in rows:
        minute, series, n = int(r["minute"]), str(r["s"]), int(r["count"])
        hour = minute * MINUTE_MS // HOUR_MS * HOUR_MS
        minutes[minute * MINUTE_MS][series] += n
        hours[hour][series] += n
        project_hours[r["project"]][hour][series] += n

    def listing(by_time: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
        return [{"t": t, "time": iso(t), **v} for t, v in sorted(by_time.items())]

    return {
        "perMinute": listing(minutes),
        "perHour": listing(hours),
        "perHourByProject": {p: listing(h) for p, h in sorted(project_hours.items())},
    }


def capacity(df: DataFrame) -> list[dict[str, Any]]:
    """Each producer's, consumer's, consumer client's and gateway's throughput: total, peak
    minute and sustained (busiest 10 minutes), in events per second."""
    minute = F.floor(F.col("timeMs") / MINUTE_MS).alias("minute")
    roles = [
        df.where(F.col("hop") == "accepted").select(
            F.lit("producer").alias("role"), F.col("producer").alias("name"), minute
        ),
        df.where(F.col("hop") == "acked").select(
            F.lit("consumer").alias("role"), F.col("consumer").alias("name"), minute
        ),
        df.where(F.col("hop") == "acked").select(
            F.lit("client").alias("role"), F.col("clientId").alias("name"), minute
        ),
        df.where(F.col("hop").isin("accepted", "delivered", "acked")).select(
            F.lit("gateway").alias("role"), F.col("gatewayId").alias("name"), minute
        ),
    ]
    union = roles[0]
    for more in roles[1:]:
        union = union.unionByName(more)
    rows = union.where(F.col("name").isNotNull()).groupBy("role", "name", "minute").count().collect()
    per: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for r in rows:
        per[(r["role"], r["name"])][int(r["minute"])] = int(r["count"])
    return [capacity_of(role, name, by_minute) for (role, name), by_minute in sorted(per.items())]


def capacity_of(role: str, name: str, by_minute: dict[int, int]) -> dict[str, Any]:
    """The capacity figures of one service from its events per (epoch) minute."""
    tens: dict[int, int] = defaultdict(int)
    for m, n in by_minute.items():
        tens[m // SUSTAINED_MINUTES] += n
    peak_minute = max(by_minute, key=lambda m: (by_minute[m], -m))
    return {
        "role": role,
        "name": name,
        "events": sum(by_minute.values()),
        "activeMinutes": len(by_minute),
        "peakPerS": round(by_minute[peak_minute] / 60, 3),
        "peakAt": iso(peak_minute * MINUTE_MS),
        "sustainedPerS": round(max(tens.values()) / (SUSTAINED_MINUTES * 60), 3),
    }


def malformed(spark: SparkSession, out: Path, window: Window) -> dict[str, Any]:
    """Records that were not events, stored in the window (by their storage time)."""
    root = malformed_dir(out)
    if not any(root.glob("*.parquet")):
        return {"count": 0, "byReason": {}, "samples": []}
    df = spark.read.parquet(str(root))
    if window.project is not None:
        df = df.where(F.col("project") == window.project)
    if window.from_ms is not None:
        df = df.where(F.col("storedMs") >= window.from_ms)
    if window.to_ms is not None:
        df = df.where(F.col("storedMs") < window.to_ms)
    by_reason = {str(r["reason"]): int(r["count"]) for r in df.groupBy("reason").count().collect()}
    samples = [
        {k: r[k] for k in ("srcTopic", "srcQueue", "srcOffset", "reason", "sample")}
        for r in df.orderBy("srcTopic", "srcQueue", "srcOffset").limit(10).collect()
    ]
    return {"count": sum(by_reason.values()), "byReason": dict(sorted(by_reason.items())), "samples": samples}
