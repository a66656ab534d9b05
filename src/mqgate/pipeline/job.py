"""The Spark job: one Structured Streaming query per source, each with foreachBatch.

Sources: every event type's topic (SPEC E1), the hot topic and the retry topic. A micro-batch
(`BatchProcessor`) is one Spark job on Arrow record batches (`mapInArrow`, stages.py): read
and parse each source queue range, shuffle every event to task (worker mod T), the worker by
the hash of its key (SPEC E2), then each task finds its hot keys (SPEC E3) from its workers'
loads and the processing times measured so far, produces their excess events to the hot
topic, and runs its worker queues in threads that write PostgreSQL (executor.run_task).
Only when every task is done (all transactions committed, every produce acknowledged) does
the batch return, and then the source's progress is committed to the consumer group
`spark-<job>-<query>` (SPEC E8): the gateway's committed offset never passes an event that
is not processed. Spark's checkpoint replays an unfinished batch after a crash; the ledger
makes the replay write nothing twice.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Final

import msgspec
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import mqgate.spark
from mqgate.errors import MqgateError
from mqgate.pipeline import stages
from mqgate.pipeline.config import EventType, PipelineConfig
from mqgate.pipeline.dispatch import partition_tags
from mqgate.pipeline.executor import KIND_EVENTS, KIND_HOT, KIND_RETRY, TaskPlan, TaskReport
from mqgate.pipeline.gateway import GatewayClient
from mqgate.pipeline.hotkeys import HotKeyRule, KeyTimes
from mqgate.pipeline.schema import create_tables
from mqgate.pipeline.sink import Sink

log = logging.getLogger("mqgate.pipeline")

INTERNAL_TOPIC_QUEUES: Final = 8
POLL_S: Final = 0.25
# A query that fails (gateway or database away) is restarted from its checkpoint this many
# times in a row before the run gives up.
MAX_RESTARTS: Final = 5
RESTART_DELAY_S: Final = 2.0
STOP_GRACE_S: Final = 60.0


class QuerySpec(msgspec.Struct, frozen=True):
    name: str
    kind: str
    topic: str
    consumer: str
    event_type: EventType | None = None


def query_specs(config: PipelineConfig) -> list[QuerySpec]:
    specs = [QuerySpec(et.type, KIND_EVENTS, et.topic, config.consumer(et.type), et) for et in config.events]
    if config.hot_keys.enabled:
        specs.append(QuerySpec(KIND_HOT, KIND_HOT, config.hot_keys.topic, config.consumer(KIND_HOT)))
    specs.append(QuerySpec(KIND_RETRY, KIND_RETRY, config.retry.topic, config.consumer(KIND_RETRY)))
    return specs


class RunSummary(msgspec.Struct):
    batches: int = 0
    report: TaskReport = msgspec.field(default_factory=TaskReport)
    hot_keys: dict[str, int] = msgspec.field(default_factory=dict)
    flushed: int = 0
    seconds: float = 0.0
    # From the start of the first micro-batch that had events to the end of the run.
    processing_s: float = 0.0


class BatchProcessor:
    """foreachBatch function of one query; runs on the driver, in the query's thread."""

    def __init__(self, pipeline: Pipeline, spec: QuerySpec) -> None:
        self.pipeline = pipeline
        self.spec = spec
        self.config = pipeline.config
        self.key_times = KeyTimes()
        h = self.config.hot_keys
        self.rule = HotKeyRule(
            self.config.job.partitions,
            h.min_count,
            self.config.hot_share,
            h.max_keys,
            h.time_share,
            h.load_limit,
        )
        self.detect = spec.kind == KIND_EVENTS and h.enabled

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        config, spec = self.config, self.spec
        type_name = spec.event_type.type if spec.event_type else ""
        plan = TaskPlan(config, spec.kind)
        if self.detect:
            shares = self.key_times.shares()
            slow = {k: v for k, v in shares.items() if v >= self.rule.time_share > 0}
            plan = TaskPlan(config, spec.kind, self.rule, slow)
        # One Spark job on Arrow batches: read and parse (one task per source queue range),
        # shuffle by the tag of the task that runs each worker queue, then those tasks.
        tags = self.pipeline.tags
        routed = df.select(*stages.COLUMNS).mapInArrow(
            functools.partial(stages.route_batches, config, spec.kind, type_name, tags), stages.ROUTED_SCHEMA
        )
        answers = (
            routed.repartition(len(tags), "tag")
            .mapInArrow(functools.partial(stages.run_batches, plan), stages.REPORT_SCHEMA)
            .toArrow()
        )
        report = TaskReport()
        for part in stages.read_reports(answers):
            report.merge(part)
        if spec.kind == KIND_EVENTS:
            self.key_times.add(report.key_seconds)
        if report.hot:
            with self.pipeline.sink.connection() as conn:
                self.pipeline.sink.record_hot_keys(conn, type_name, batch_id, report.hot)
        self.pipeline.flush(shutdown=False)
        # Ordered commit (SPEC E8): only now is every event of the batch applied, sent to the
        # hot or retry topic, or dead-lettered.
        mqgate.spark.commit_progress(config.job.gateway, config.job.admin_token, spec.consumer, report.ends)
        self.pipeline.record(batch_id, spec, report, started)


class Pipeline:
    def __init__(self, config: PipelineConfig, spark: SparkSession) -> None:
        self.config = config
        self.spark = spark
        self.sink = Sink(config)
        # Half the slots by default: the workers mostly wait on the sink, and the hot and retry
        # queries should find free slots meanwhile instead of queueing behind them.
        cores = spark.sparkContext.defaultParallelism
        tasks = config.job.tasks or max(1, min(config.job.partitions, cores // 2))
        # Task t's rows carry tags[t], which Spark's hash partitioning sends to partition t.
        self.tags = partition_tags(tasks)
        self.summary = RunSummary()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._first_events: float | None = None
        # Hot and retry queries start when something is sent their way (or was left there by
        # an earlier run): an idle query would only take planning time from the event queries.
        self._wanted: set[str] = set()

    # --- setup (idempotent) -------------------------------------------------------------

    def setup(self) -> None:
        """Register the hot and retry topics, the job's producers and consumer groups, and
        create the PostgreSQL tables; everything may exist already."""
        c = self.config
        with GatewayClient(c.job.gateway, c.job.admin_token) as gw:
            for et in c.events:
                if not gw.topic_exists(et.topic):
                    raise PipelineSetupError(f"topic {et.topic} of event type {et.type} does not exist")
            queues = max(2, min(INTERNAL_TOPIC_QUEUES, c.job.partitions))
            for spec in query_specs(c):
                if spec.kind != KIND_EVENTS:
                    gw.ensure_topic(spec.topic, queues)
                    gw.ensure_producer(f"{c.producer}-{spec.kind}", spec.topic)
                gw.ensure_consumer(spec.consumer, spec.topic)
        with self.sink.connection() as conn:
            create_tables(conn, c)

    # --- queries ------------------------------------------------------------------------

    def start(self, spec: QuerySpec, available_now: bool) -> StreamingQuery:
        c = self.config
        reader = (
            self.spark.readStream.format("mqgate")
            .option("gateway", c.job.gateway)
            .option("token", c.job.admin_token)
            .option("topic", spec.topic)
            .option("startingOffsets", c.job.starting_offsets if spec.kind == KIND_EVENTS else "earliest")
            .option("maxMessagesPerTrigger", str(c.job.max_messages_per_trigger))
        )
        writer = (
            reader.load()
            .writeStream.queryName(f"mqgate-{c.job.name}-{spec.name}")
            .option("checkpointLocation", str((c.job.checkpoint_dir / spec.name).resolve()))
            .foreachBatch(BatchProcessor(self, spec))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(c.job.trigger_interval_s * 1000)} milliseconds")
        return writer.start()

    def flush(self, shutdown: bool) -> int:
        if self.config.job.mode != "aggregate":
            return 0
        with self._flush_lock, self.sink.connection() as conn:
            flushed = self.sink.flush_pending(conn, shutdown=shutdown)
        if flushed:
            by_reason: dict[str, int] = {}
            for _, _, count, reason in flushed:
                by_reason[reason] = by_reason.get(reason, 0) + count
            log.info(
                "flushed %d aggregates (%s)",
                len(flushed),
                ", ".join(f"{r}: {n} events" for r, n in sorted(by_reason.items())),
            )
            with self._lock:
                self.summary.flushed += sum(count for _, _, count, _ in flushed)
        return len(flushed)

    def record(self, batch_id: int, spec: QuerySpec, report: TaskReport, started: float) -> None:
        seconds = time.monotonic() - started
        with self._lock:
            if report.events and (self._first_events is None or started < self._first_events):
                self._first_events = started
            self.summary.batches += 1
            self.summary.report.merge(report)
            for h in report.hot:
                self.summary.hot_keys[h.key] = self.summary.hot_keys.get(h.key, 0) + h.moved
            if report.moved_hot:
                self._wanted.add(KIND_HOT)
            if report.retried:
                self._wanted.add(KIND_RETRY)
        busiest = max(report.worker_seconds.values(), default=0.0)
        hot = sorted(report.hot, key=lambda h: -h.moved)
        log.info(
            "%s batch %d: %d events in %.2fs (busiest worker %.2fs): applied %d, duplicates %d, "
            "to hot %d, retried %d, dead %d, parse failures %d%s%s",
            spec.name, batch_id, report.events, seconds, busiest, report.applied, report.duplicates,
            report.moved_hot, report.retried, report.dead, report.parse_failures,
            "; hot keys " + ", ".join(f"{h.key} ({h.moved} of {h.events} moved, {h.reason})" for h in hot)
            if hot else "",
            "; errors: " + " | ".join(report.errors[:3]) if report.errors else "",
        )  # fmt: skip

    # --- lifecycle ----------------------------------------------------------------------

    def drained(self, queries: dict[str, StreamingQuery], specs: list[QuerySpec]) -> bool:
        """Nothing left on the hot and retry paths: their queries idle with lag 0 and no
        retry still on its way (a delayed message is invisible until it is due)."""
        with GatewayClient(self.config.job.gateway, self.config.job.admin_token) as gw:
            for spec in specs:
                if spec.kind == KIND_EVENTS:
                    continue
                q = queries.get(spec.name)
                if (q is not None and q.status.get("isTriggerActive")) or gw.lag(spec.consumer) > 0:
                    return False
        with self.sink.connection() as conn:
            return self.sink.pending_retries(conn) == 0

    def run(self, available_now: bool, stop: threading.Event) -> RunSummary:
        """Run until stopped (SIGTERM sets `stop`) or, with `available_now`, until what was
        in the event topics at the start, and all it led to on the hot and retry paths, is
        done. Aggregates are flushed at the end either way."""
        started = time.monotonic()
        specs = query_specs(self.config)
        self.setup()
        queries: dict[str, StreamingQuery] = {}
        restarts: dict[str, int] = {}
        finished: set[str] = set()

        def launch(spec: QuerySpec) -> None:
            queries[spec.name] = self.start(spec, available_now and spec.kind == KIND_EVENTS)

        for spec in specs:
            if spec.kind == KIND_EVENTS or self._left_over(spec):
                launch(spec)
        ticker = _Ticker(self, stop)
        ticker.start()
        confirmed = 0
        try:
            while not stop.is_set():
                with self._lock:
                    wanted = set(self._wanted)
                for spec in specs:
                    if spec.name not in queries:
                        if spec.kind in wanted:
                            launch(spec)
                        continue
                    q = queries[spec.name]
                    if spec.name in finished or q.isActive:
                        continue
                    error = q.exception()
                    if error is None:
                        finished.add(spec.name)
                        continue
                    restarts[spec.name] = restarts.get(spec.name, 0) + 1
                    if restarts[spec.name] > MAX_RESTARTS:
                        raise PipelineFailed(f"query {spec.name} failed {MAX_RESTARTS} times; last: {error}")
                    log.error("query %s failed, restarting from its checkpoint: %s", spec.name, error)
                    stop.wait(RESTART_DELAY_S)
                    launch(spec)
                mains_done = all(s.name in finished for s in specs if s.kind == KIND_EVENTS)
                if available_now and mains_done and self.drained(queries, specs):
                    confirmed += 1
                    if confirmed >= 2:
                        break
                else:
                    confirmed = 0
                stop.wait(POLL_S)
        finally:
            ticker.stop()
            try:
                self._stop_queries(queries)
            finally:
                # Pending aggregates live in PostgreSQL: they are flushed even when Spark is
                # already gone (a SIGTERM to the whole process group stops the JVM too).
                self.flush(shutdown=True)
        ended = time.monotonic()
        self.summary.seconds = ended - started
        self.summary.processing_s = ended - (self._first_events or ended)
        return self.summary

    def _left_over(self, spec: QuerySpec) -> bool:
        """Work an earlier run left on the hot or retry path: a backlog, or retries whose
        delayed messages are not due yet."""
        with GatewayClient(self.config.job.gateway, self.config.job.admin_token) as gw:
            if gw.lag(spec.consumer) > 0:
                return True
        if spec.kind != KIND_RETRY:
            return False
        with self.sink.connection() as conn:
            return self.sink.pending_retries(conn) > 0

    def _stop_queries(self, queries: dict[str, StreamingQuery]) -> None:
        # Let a running batch finish first: stopping interrupts it (harmless: it is replayed
        # next time, and the ledger absorbs what it wrote) but the work would be repeated.
        deadline = time.monotonic() + STOP_GRACE_S
        for name, q in queries.items():
            try:
                while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
                    time.sleep(POLL_S)
                q.stop()
            except Exception as exc:  # the JVM may be gone already; nothing left to stop
                log.warning("stopping query %s: %s", name, exc)


class _Ticker(threading.Thread):
    """Flushes aggregates by age while no batch arrives (SPEC E6)."""

    def __init__(self, pipeline: Pipeline, stop: threading.Event) -> None:
        super().__init__(name="mqgate-pipeline-flush", daemon=True)
        self.pipeline = pipeline
        self.done = threading.Event()
        self.outer = stop
        self.every_s = max(0.5, min(pipeline.config.aggregate.age_s / 4, 5.0))

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.pipeline.flush(shutdown=False)
            except Exception as exc:  # the database may be away for a while; try again later
                log.warning("aggregate flush failed: %s", exc)

    def stop(self) -> None:
        self.done.set()
        self.join(10)


class PipelineSetupError(MqgateError):
    code = "pipeline_setup"


class PipelineFailed(MqgateError):
    code = "pipeline_failed"


def run_pipeline(
    config: PipelineConfig,
    master: str | None = None,
    available_now: bool = False,
    stop: threading.Event | None = None,
    spark: SparkSession | None = None,
) -> RunSummary:
    """Build the session (unless given one), run the pipeline, stop the session we built."""
    own = spark is None
    session = spark or mqgate.spark.session(f"mqgate-pipeline-{config.job.name}", master=master)
    try:
        return Pipeline(config, session).run(available_now, stop or threading.Event())
    finally:
        if own:
            session.stop()
