"""The input stage: raw trace records (a DataFrame of the `mqgate` source's rows, or any
DataFrame with its `topic, queue, offset, timestamp, body` columns) parsed into the Parquet
dataset of `mqgate.analytics.columns`, and the dataset's compaction.

A record that does not parse, lacks a required field or names an unknown hop or status goes
to `malformed/` with the reason: counted and reported, never fatal.
"""

from __future__ import annotations

import math
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from mqgate.analytics.columns import (
    BATCH_JSON,
    EVENT_COLUMNS,
    EVENT_JSON,
    MALFORMED_COLUMNS,
    PARTITIONS,
    ROUND_JSON,
    SAMPLE_CHARS,
    SOURCE_COLUMNS,
    events_dir,
    malformed_dir,
)
from mqgate.tracing.batch import BATCH_PREFIX, ROUND_PREFIX
from mqgate.tracing.events import HOPS, TRACE_TOPIC_PREFIX

REQUIRED: Final = ("msgId", "hop", "timeMs", "project", "topic")
# Compaction: a partition with more files than this is rewritten, in files of about this many rows.
MAX_FILES_PER_PARTITION: Final = 8
ROWS_PER_FILE: Final = 2_000_000


@dataclass
class IngestStats:
    """What one ingest run (or micro-batch) added."""

    events: int = 0
    malformed: int = 0
    partitions: set[tuple[str, str]] = field(default_factory=set)  # (date, project) written
    ends: dict[int, int] = field(default_factory=dict)  # source queue -> max(offset) + 1
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: IngestStats) -> None:
        self.events += other.events
        self.malformed += other.malformed
        self.partitions |= other.partitions
        for q, o in other.ends.items():
            self.ends[q] = max(self.ends.get(q, 0), o)
        for r, n in other.reasons.items():
            self.reasons[r] = self.reasons.get(r, 0) + n


def _reason(e: Column) -> Column:
    """Why a parsed record is not an event, or null when it is one."""
    missing = F.concat_ws(", ", *(F.when(e[name].isNull(), F.lit(name)) for name in REQUIRED))
    gateway = e["resource"]["gatewayId"]
    nothing = F.lit(True)
    for name in REQUIRED:
        nothing = nothing & e[name].isNull()
    return (
        F.when(e.isNull() | nothing, F.lit("not a trace event (not JSON, or none of its fields)"))
        .when(missing != "", F.concat(F.lit("missing or mistyped: "), missing))
        .when(gateway.isNull(), F.lit("missing or mistyped: resource.gatewayId"))
        .when(~e["hop"].isin(*sorted(HOPS)), F.lit("unknown hop"))
        .when(~F.coalesce(e["status"], F.lit("ok")).isin("ok", "error"), F.lit("unknown status"))
    )


def _batches_of(body: Column) -> Column:
    """The parsed batches of a batch or round record's body (tracing.batch), else null."""
    one = F.from_json(body, BATCH_JSON)
    round_ = F.from_json(body, ROUND_JSON)["batches"]
    whole = F.forall(round_, _names_ids)
    return F.when(body.startswith(BATCH_PREFIX.decode()) & _names_ids(one), F.array(one)).when(
        body.startswith(ROUND_PREFIX.decode()) & (F.size(round_) > 0) & whole, round_
    )


def _names_ids(b: Column) -> Column:
    runs = b["firstId"].isNotNull() & (b["count"] > 0)
    return b["msgIds"].isNotNull() | runs | (F.size(b["parts"]) > 0)


def _run(first_id: Column, count: Column, queue: Column, first_offset: Column) -> Column:
    """(msgId, queue, offset) of each message of a run of `count` ids from `first_id`
    (core.ids.id_run: the first 20 characters, then the 12-hex-digit counter counting up)."""
    counter = F.conv(F.substring(first_id, 21, 12), 16, 10).cast("long")
    return F.transform(
        F.sequence(F.lit(0), count - 1),
        lambda j: F.struct(
            F.concat(F.substring(first_id, 1, 20), F.lpad(F.lower(F.hex(counter + j)), 12, "0")).alias(
                "msgId"
            ),
            queue.alias("queue"),
            (first_offset + j).alias("offset"),
        ),
    )


def _placed(b: Column) -> Column:
    """(msgId, queue, offset) of each message of a batch, however it names them (listed ids,
    a run, or a run per queue: tracing.batch.TraceBatch.segments)."""
    listed = F.transform(
        b["msgIds"],
        lambda m, j: F.struct(
            m.alias("msgId"), b["queue"].alias("queue"), (b["firstOffset"] + j).alias("offset")
        ),
    )
    parts = F.flatten(
        F.transform(b["parts"], lambda p: _run(p["firstId"], p["count"], p["queue"], p["firstOffset"]))
    )
    one = _run(b["firstId"], b["count"], b["queue"], b["firstOffset"])
    return F.when(F.size(b["parts"]) > 0, parts).when(b["firstId"].isNotNull(), one).otherwise(listed)


def _expand_batches(batches: DataFrame) -> DataFrame:
    """One row per message and hop of each batch, its `e` shaped like a parsed event (as
    tracing.batch.expand does it)."""
    b = F.col("b")
    rows = batches.select(
        *SOURCE_COLUMNS,
        "b",
        "body",
        F.posexplode(_placed(b)).alias("i", "m"),
    ).select("*", F.col("m")["msgId"].alias("msgId"), F.posexplode(F.col("b")["hops"]).alias("h", "hop"))
    first = F.col("h") == 0
    several = F.size(b["hops"]) > 1
    event = F.struct(
        F.col("msgId").alias("msgId"),
        F.col("hop").alias("hop"),
        # A run of single produces has each message's first hop time (tracing.batch.TraceBatch).
        F.when(first & (F.size(b["timesMs"]) > F.col("i")), b["timesMs"][F.col("i")])
        .when(first, b["timeMs"])
        .otherwise(b["lastMs"])
        .alias("timeMs"),
        b["project"].alias("project"),
        b["topic"].alias("topic"),
        b["resource"].alias("resource"),
        F.lit(None).cast("string").alias("status"),
        b["level"].alias("level"),
        F.lit(None).cast("string").alias("requestId"),
        F.when(F.size(b["keys"]) > F.col("i"), b["keys"][F.col("i")]).alias("keys"),
        F.col("m")["queue"].alias("queue"),
        F.when(first & several, F.lit(None)).otherwise(F.col("m")["offset"]).alias("offset"),
        b["producer"].alias("producer"),
        *(F.lit(None).cast(EVENT_JSON[c].dataType).alias(c) for c in _NOT_IN_BATCHES),
    )
    return rows.select(*SOURCE_COLUMNS, event.alias("e"), F.col("body"))


_NOT_IN_BATCHES: Final = ("consumer", "clientId", "clientAddr", "attempt", "errorType", "errorNode", "detail")


def parse_raw(raw: DataFrame) -> DataFrame:
    """Raw records → one row per record: the dataset's columns plus `reason` (null for an
    event) and `sample` (the record's start, kept for malformed ones)."""
    e = F.col("e")
    topic_project = F.when(
        F.col("srcTopic").startswith(TRACE_TOPIC_PREFIX),
        F.expr(f"substring(srcTopic, {len(TRACE_TOPIC_PREFIX) + 1})"),
    )
    source = (
        F.col("topic").alias("srcTopic"),
        F.col("queue").cast("int").alias("srcQueue"),
        F.col("offset").cast("long").alias("srcOffset"),
        F.unix_millis(F.col("timestamp")).alias("storedMs"),
    )
    with_batch = raw.select(*source, F.col("body"), _batches_of(F.col("body")).alias("bs"))
    # A batch or round that does not parse stays one row, found malformed like any other record.
    batches = with_batch.where(F.col("bs").isNotNull()).select(
        *SOURCE_COLUMNS, F.col("body"), F.explode(F.col("bs")).alias("b")
    )
    singles = with_batch.where(F.col("bs").isNull()).select(
        *SOURCE_COLUMNS, F.from_json(F.col("body"), EVENT_JSON).alias("e"), F.col("body")
    )
    parsed = singles.unionByName(_expand_batches(batches))
    return parsed.select(
        *SOURCE_COLUMNS,
        e["msgId"].alias("msgId"),
        e["hop"].alias("hop"),
        e["timeMs"].alias("timeMs"),
        e["topic"].alias("topic"),
        e["resource"]["gatewayId"].alias("gatewayId"),
        e["resource"]["host"].alias("host"),
        e["resource"]["service"].alias("service"),
        e["resource"]["port"].alias("port"),
        # Defaults are not encoded (omit_defaults): an absent status is ok, level info.
        F.coalesce(e["status"], F.lit("ok")).alias("status"),
        F.coalesce(e["level"], F.lit("info")).alias("level"),
        *(e[c].alias(c) for c in EVENT_COLUMNS[10:]),
        F.date_format(F.timestamp_millis(e["timeMs"]), "yyyy-MM-dd").alias("date"),
        F.coalesce(e["project"], topic_project, F.lit("unknown")).alias("project"),
        _reason(e).alias("reason"),
        F.substring(F.col("body"), 1, SAMPLE_CHARS).alias("sample"),
    )


def write_parsed(parsed: DataFrame, out: Path) -> IngestStats:
    """Append the parsed records to the dataset (events) and to `malformed/`; the counts, the
    partitions written and the source end offsets, from one pass over the (cached) rows."""
    parsed = parsed.persist()
    try:
        summary = (
            parsed.groupBy(F.col("reason"), "date", "project", "srcQueue")
            .agg(F.count(F.lit(1)).alias("n"), F.max("srcOffset").alias("last"))
            .collect()
        )
        stats = IngestStats()
        for row in summary:
            n = int(row["n"])
            if row["last"] is not None:
                q = int(row["srcQueue"])
                stats.ends[q] = max(stats.ends.get(q, 0), int(row["last"]) + 1)
            if row["reason"] is None:
                stats.events += n
                stats.partitions.add((str(row["date"]), str(row["project"])))
            else:
                stats.malformed += n
                stats.reasons[str(row["reason"])] = stats.reasons.get(str(row["reason"]), 0) + n
        if stats.events:
            good = parsed.where(F.col("reason").isNull()).select(*SOURCE_COLUMNS, *EVENT_COLUMNS, *PARTITIONS)
            good.write.mode("append").partitionBy(*PARTITIONS).parquet(str(events_dir(out)))
        if stats.malformed:
            bad = parsed.where(F.col("reason").isNotNull()).select(*MALFORMED_COLUMNS)
            bad.write.mode("append").parquet(str(malformed_dir(out)))
        return stats
    finally:
        parsed.unpersist()


def ingest_frame(raw: DataFrame, out: Path, compact_after: bool = True) -> IngestStats:
    """The whole input stage for a DataFrame of raw records: parse, append, compact the
    partitions written."""
    stats = write_parsed(parse_raw(raw), out)
    if compact_after:
        compact(raw.sparkSession, out, stats.partitions)
    return stats


def partition_dir(out: Path, date: str, project: str) -> Path:
    return events_dir(out) / f"date={date}" / f"project={project}"


def data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.parquet") if p.is_file())


def compact(
    spark: SparkSession,
    out: Path,
    partitions: Iterable[tuple[str, str]],
    max_files: int = MAX_FILES_PER_PARTITION,
    force: bool = False,
) -> int:
    """Rewrite each named partition that has more than `max_files` files (or every one, with
    `force`) as few files without duplicate source positions; the number rewritten.

    The new files are written beside the partition (a dot folder Spark does not read), then
    swapped in: a crash leaves the old partition or the new one, plus a folder to delete.
    """
    import pyarrow.parquet as pq

    rewritten = 0
    for date, project in sorted(set(partitions)):
        target = partition_dir(out, date, project)
        files = data_files(target)
        if not files or (len(files) <= max_files and not force):
            continue
        rows = sum(pq.read_metadata(str(f)).num_rows for f in files)
        tmp = target.parent / f".compact-{uuid.uuid4().hex}"
        df = spark.read.parquet(*(str(f) for f in files)).dropDuplicates(
            ["srcTopic", "srcQueue", "srcOffset", "msgId", "hop"]
        )
        n_files = max(1, math.ceil(rows / ROWS_PER_FILE))
        df.repartition(n_files).sortWithinPartitions("timeMs").write.parquet(str(tmp))
        old = target.parent / f".old-{uuid.uuid4().hex}"
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        rewritten += 1
    return rewritten
