"""What runs inside one Spark task: its share of the N worker queues, one thread each.

A task gets its worker queues, already parsed (stages.task_input). Each worker queue is
drained by its own thread in chunks of `sink.batch_rows`, one transaction per chunk, so N
workers write concurrently even when Spark has fewer cores than N (the sink's cost is
waiting, not computing). Events marked for the hot path are produced to the hot topic
instead. A failing chunk never fails the task: its events go to the retry topic (or, after
retry.max_attempts, to the dead letters).
The task returns only once every transaction committed and every produce was acknowledged.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import msgspec
import psycopg

from mqgate.pipeline.config import PipelineConfig
from mqgate.pipeline.dispatch import worker_of
from mqgate.pipeline.gateway import GatewayClient
from mqgate.pipeline.hotkeys import HotKey, HotKeyRule, hot_keys, take_moved
from mqgate.pipeline.parsing import Event, ParseFailure, encode_internal
from mqgate.pipeline.sink import ChunkResult, Sink, describe

log = logging.getLogger("mqgate.pipeline")

KIND_EVENTS: Final = "events"
KIND_HOT: Final = "hot"
KIND_RETRY: Final = "retry"
# A deadlock between two workers is retried in place before the chunk takes the retry path.
LOCAL_ATTEMPTS: Final = 3
ROLLBACKS: Final = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.TransactionRollback,
)
TOP_KEYS_PER_TASK: Final = 64
MAX_ERRORS: Final = 5


class TaskPlan(msgspec.Struct, frozen=True):
    config: PipelineConfig
    kind: str
    # Hot-key detection (event queries with hot_keys.enabled): the rule, and the keys whose
    # share of the processing time measured so far reaches the rule's time_share.
    hot_rule: HotKeyRule | None = None
    slow_keys: Mapping[str, float] = msgspec.field(default_factory=dict)


class TaskReport(msgspec.Struct):
    events: int = 0
    applied: int = 0
    duplicates: int = 0
    retried: int = 0
    dead: int = 0
    moved_hot: int = 0
    parse_failures: int = 0
    # The batch's next offset per source queue (from the rows this task was sent).
    ends: dict[int, int] = msgspec.field(default_factory=dict)
    # Seconds of worker time per key (the costliest keys only), for hot-key detection.
    key_seconds: dict[str, float] = msgspec.field(default_factory=dict)
    # Busy seconds of each worker queue, to see how even the load was.
    worker_seconds: dict[int, float] = msgspec.field(default_factory=dict)
    errors: list[str] = msgspec.field(default_factory=list)
    hot: list[HotKey] = msgspec.field(default_factory=list)

    def merge(self, other: TaskReport) -> None:
        self.events += other.events
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.retried += other.retried
        self.dead += other.dead
        self.moved_hot += other.moved_hot
        self.parse_failures += other.parse_failures
        for q, n in other.ends.items():
            self.ends[q] = max(self.ends.get(q, 0), n)
        for k, v in other.key_seconds.items():
            self.key_seconds[k] = self.key_seconds.get(k, 0.0) + v
        for w, s in other.worker_seconds.items():
            self.worker_seconds[w] = self.worker_seconds.get(w, 0.0) + s
        self.errors.extend(other.errors[: MAX_ERRORS - len(self.errors)])
        self.hot.extend(other.hot)


class TaskInput(msgspec.Struct):
    """What one Spark task got after the shuffle (stages.task_input)."""

    # Worker queue -> its events, in source-queue order.
    queues: dict[int, list[Event]]
    failures: list[ParseFailure] = msgspec.field(default_factory=list)
    # The next offset per source queue, from the progress rows this task was sent.
    ends: dict[int, int] = msgspec.field(default_factory=dict)
    # The micro-batch's events (event queries): a worker's fair share, for hot-key detection.
    batch_events: int = 0


class _WorkerResult(msgspec.Struct):
    worker: int
    applied: int = 0
    duplicates: int = 0
    failed: list[tuple[Event, str]] = msgspec.field(default_factory=list)
    seconds: float = 0.0
    key_seconds: dict[str, float] = msgspec.field(default_factory=dict)


def _write_chunk(sink: Sink, chunk: Sequence[Event]) -> ChunkResult:
    for attempt in range(LOCAL_ATTEMPTS):
        try:
            with sink.connection() as conn:
                return sink.apply_chunk(conn, chunk)
        except ROLLBACKS as exc:
            if attempt == LOCAL_ATTEMPTS - 1:
                return ChunkResult(failed=[(e, describe(exc)) for e in chunk])
        except Exception as exc:
            # A lost connection, the server gone, anything unexpected: the whole chunk
            # takes the retry path and the worker goes on with the next one.
            return ChunkResult(failed=[(e, describe(exc)) for e in chunk])
    raise AssertionError("unreachable")


def drain(sink: Sink, worker: int, events: Sequence[Event], batch_rows: int, cost_ms: float) -> _WorkerResult:
    """One worker: its queue in order, chunk by chunk."""
    result = _WorkerResult(worker)
    started = time.monotonic()
    for i in range(0, len(events), batch_rows):
        chunk = events[i : i + batch_rows]
        t0 = time.monotonic()
        if cost_ms > 0:
            # The modelled per-event cost (benchmarks): waiting, as a remote sink would.
            time.sleep(cost_ms * len(chunk) / 1000.0)
        outcome = _write_chunk(sink, chunk)
        result.applied += len(outcome.applied)
        result.duplicates += outcome.duplicates
        result.failed.extend(outcome.failed)
        per_event = (time.monotonic() - t0) / len(chunk)
        for e in chunk:
            result.key_seconds[e.key] = result.key_seconds.get(e.key, 0.0) + per_event
    result.seconds = time.monotonic() - started
    return result


def route_failures(
    plan: TaskPlan,
    sink: Sink,
    gateway: GatewayClient,
    failed: Sequence[tuple[Event, str]],
    report: TaskReport,
) -> None:
    """Failed events go to the retry topic as delayed messages, or to the dead letters once
    they used up retry.max_attempts. Both are durable before this returns."""
    retry = plan.config.retry
    dead = [(e, err, e.attempts) for e, err in failed if e.attempts >= retry.max_attempts]
    again = [(e, err) for e, err in failed if e.attempts < retry.max_attempts]
    if again:
        delay_ms = int(retry.delay_s * 1000)
        # Taken before the produce, so no retry is ever delivered before its recorded due time.
        due_ms = int(time.time() * 1000) + delay_ms
        messages = []
        for e, err in again:
            item = encode_internal(e, error=err)
            if delay_ms > 0:
                item["delayMs"] = delay_ms
            messages.append(item)
        gateway.produce(plan.config.producer + "-retry", messages)
        try:
            with sink.connection() as conn:
                sink.record_retries(conn, again, due_ms)
        except psycopg.Error as exc:
            # The retry messages are durable in the gateway; only the bookkeeping an
            # --available-now run waits on is missing, so the run may end before they are due.
            report.errors.append(f"recording retries: {describe(exc)}")
        report.retried += len(again)
    if dead:
        with sink.connection() as conn:
            report.dead += sink.dead_letter(conn, dead)


def run_task(plan: TaskPlan, task: TaskInput) -> TaskReport:
    """One Spark task's share of a micro-batch: its worker queues written, hot events moved,
    failures routed, parse failures dead-lettered."""
    config = plan.config
    queues = task.queues
    report = TaskReport(ends=dict(task.ends))
    report.events = sum(len(q) for q in queues.values())
    hot: list[Event] = []
    if plan.hot_rule is not None and report.events:
        # SPEC E3: this task holds every event of its workers' keys, so it sees their loads.
        counts = Counter(e.key for q in queues.values() for e in q)
        report.hot = hot_keys(counts, task.batch_events, plan.slow_keys, plan.hot_rule, worker_of)
        hot = take_moved(queues, report.hot)
    sink = Sink(config)
    if task.failures:
        # A message that does not parse will not parse on a retry either.
        with sink.connection() as conn:
            report.parse_failures = sink.dead_letter(conn, [(f, f.error, 0) for f in task.failures])
        report.errors.extend(f.error for f in task.failures[:MAX_ERRORS])
    if report.events == 0:
        return report
    with GatewayClient(config.job.gateway, config.job.admin_token) as gateway:
        with ThreadPoolExecutor(max_workers=len(queues) + 1, thread_name_prefix="mqgate-worker") as pool:
            moved = pool.submit(gateway.produce, config.producer + "-hot", [encode_internal(e) for e in hot])
            futures = [
                pool.submit(drain, sink, w, q, config.sink.batch_rows, config.sink.cost_ms)
                for w, q in sorted(queues.items())
            ]
            results = [f.result() for f in futures]
            report.moved_hot = moved.result()
        failed = [f for r in results for f in r.failed]
        for r in results:
            report.applied += r.applied
            report.duplicates += r.duplicates
            report.worker_seconds[r.worker] = r.seconds
            for k, v in r.key_seconds.items():
                report.key_seconds[k] = report.key_seconds.get(k, 0.0) + v
        if failed:
            report.errors.extend(err for _, err in failed[:MAX_ERRORS])
        route_failures(plan, sink, gateway, failed, report)
    if plan.kind == KIND_RETRY:
        # Only now, after any new failure was recorded with its higher attempt number.
        with sink.connection() as conn:
            sink.forget_retries(conn, [e for q in queues.values() for e in q])
    top = heapq.nlargest(TOP_KEYS_PER_TASK, report.key_seconds.items(), key=lambda kv: kv[1])
    report.key_seconds = dict(top)
    return report
