"""The trace topics read incrementally through a gateway into the dataset.

Each topic is one Structured Streaming query (`format("mqgate")`, Trigger.AvailableNow) with
its checkpoint under `<out>/_state/`, so a rerun reads only what was stored since. Each
micro-batch goes through the input stage (mqgate.analytics.ingest) and then the batch's end
offsets are committed to the job's own consumer group (`analytics-<project>`, registered on
first use): `mqgate consumer progress analytics-<project>` shows the job's lag. Without a
checkpoint (a new output folder) the query starts at the group's committed offsets.
A batch Spark replays after a crash is written again; the partitions it touched are
compacted with duplicates dropped (by source position) before the run ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyspark.sql import DataFrame, SparkSession

import mqgate.spark
from mqgate.analytics.columns import RAW_COLUMNS, state_dir
from mqgate.analytics.ingest import IngestStats, compact, parse_raw, write_parsed
from mqgate.client import Client
from mqgate.errors import AlreadyExists, NotFound
from mqgate.tracing.events import TRACE_TOPIC_PREFIX, project_of_trace_topic, trace_topic

CONSUMER_PREFIX: Final = "analytics-"
MAX_PER_TRIGGER: Final = 1_000_000


class UnknownProject(NotFound):
    pass


@dataclass(frozen=True)
class TopicSource:
    topic: str
    consumer: str


def consumer_for(topic: str) -> str:
    name = project_of_trace_topic(topic) or topic
    return CONSUMER_PREFIX + name


def trace_sources(gw: Client, project: str | None, topics: list[str] | None) -> list[TopicSource]:
    """The topics to read: those given, else the project's trace topic, else every trace
    topic the gateway lists. An unknown project is refused with the known ones named."""
    listed = [str(t["name"]) for t in gw.topics().get("topics", [])]
    if topics:
        missing = [t for t in topics if t not in listed]
        if missing:
            raise UnknownProject(f"no topic {', '.join(missing)} at {gw.url}", field="topic")
        return [TopicSource(t, consumer_for(t)) for t in topics]
    traced = [t for t in listed if t.startswith(TRACE_TOPIC_PREFIX)]
    if project is None:
        return [TopicSource(t, consumer_for(t)) for t in sorted(traced)]
    if trace_topic(project) not in listed:
        known = ", ".join(sorted(p for t in traced if (p := project_of_trace_topic(t)))) or "none"
        raise UnknownProject(
            f"project {project} has no trace topic at {gw.url} (traced projects: {known})", field="project"
        )
    return [TopicSource(trace_topic(project), consumer_for(trace_topic(project)))]


def _starting_offsets(gw: Client, source: TopicSource) -> str:
    """The group's committed offsets ({store queue: offset}); registering it on first use."""
    with contextlib.suppress(AlreadyExists):
        gw.register_consumer(source.consumer, source.topic, mode="cluster", start="earliest")
    _, bounds = gw.bounds(source.topic)
    committed = gw.commit(source.consumer, {b.queue: 0 for b in bounds})  # never lowers: reads them
    return json.dumps({str(q): committed[q] for q in sorted(committed)})


class _Batches:
    """foreachBatch: parse and append, then commit the batch's end offsets to the group."""

    def __init__(self, gateway: str, token: str, source: TopicSource, out: Path) -> None:
        self.gateway, self.token, self.source, self.out = gateway, token, source, out
        self.stats = IngestStats()
        self.replayed: set[tuple[str, str]] = set()
        self.log = state_dir(out) / "batches" / f"{_safe(source.topic)}.json"

    def _last(self) -> int:
        try:
            return int(json.loads(self.log.read_text())["batchId"])
        except (OSError, ValueError, KeyError):
            return -1

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        raw = batch.select(*RAW_COLUMNS)
        stats = write_parsed(parse_raw(raw), self.out)
        if batch_id <= self._last():
            self.replayed |= stats.partitions  # written before: compaction drops the copies
        self.stats.add(stats)
        mqgate.spark.commit_progress(self.gateway, self.token, self.source.consumer, stats.ends)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text(json.dumps({"batchId": batch_id}))


def _safe(topic: str) -> str:
    return hashlib.sha1(topic.encode()).hexdigest()[:16]


def ingest_topics(
    spark: SparkSession,
    gateway: str,
    token: str,
    sources: list[TopicSource],
    out: Path,
    max_per_trigger: int = MAX_PER_TRIGGER,
) -> IngestStats:
    """Read what each source topic holds beyond the last run into the dataset; compact."""
    total = IngestStats()
    replayed: set[tuple[str, str]] = set()
    for source in sources:
        with Client(gateway, token, retry_for_s=30.0) as gw:
            starting = _starting_offsets(gw, source)
        handler = _Batches(gateway, token, source, out)
        query = (
            spark.readStream.format("mqgate")
            .option("gateway", gateway)
            .option("token", token)
            .option("topic", source.topic)
            .option("startingOffsets", starting)
            .option("maxMessagesPerTrigger", str(max_per_trigger))
            .load()
            .writeStream.queryName(f"mqgate-analytics-{_safe(source.topic)}")
            .option(
                "checkpointLocation", str((state_dir(out) / "checkpoints" / _safe(source.topic)).resolve())
            )
            .foreachBatch(handler)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        total.add(handler.stats)
        replayed |= handler.replayed
    compact(spark, out, total.partitions - replayed)
    compact(spark, out, replayed, force=True)
    return total
