"""The async recorder: flush on stop keeps the open interval, a restart adds to it, failed writes
keep their rows (bounded, counted), the sample and prune loops run. The recorder's clock is a
parameter: the tests set the time instead of waiting for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.recorder import QueueStateRecorder
from mqgate.queuestate.rows import QueueInterval, Rollup
from mqgate.queuestate.sampler import QueueStateSampler

IV = 60_000
B = 1_700_000_040_000


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


async def until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


def observe_seconds(sampler: QueueStateSampler, clock: Clock, first_s: int, last_s: int) -> None:
    for i in range(first_s, last_s + 1):
        clock.now_ms = B + i * 1000
        sampler.observe_queue("shop", "orders", 0, i, clock.now_ms)
        sampler.count_pull("shop", "billing", "orders", 0, 1, clock.now_ms)


def test_stop_writes_the_open_interval_and_a_restart_adds_to_that_row(tmp_path: Path) -> None:
    db = tmp_path / "qs.db"

    async def run(first_s: int, last_s: int, stop_at_ms: int) -> QueueStateRecorder:
        clock = Clock(B)
        sampler = QueueStateSampler()
        recorder = QueueStateRecorder(sampler, QueueStateHistory(db), clock=clock, flush_every_s=3600)
        await recorder.start()
        observe_seconds(sampler, clock, first_s, last_s)
        clock.now_ms = stop_at_ms
        await recorder.stop()
        recorder.history.dispose()
        return recorder

    first = asyncio.run(run(0, 29, B + 30_000))  # SIGTERM half-way through the interval
    assert first.stats.written_rows == 2 and first.pending_rows() == 0
    history = QueueStateHistory(db)
    (row,) = history.queue_history("shop")
    assert (row.start_ms, row.covered_ms, row.samples, row.max_length) == (B, 30_000, 30, 29)
    assert row.length_area == sum(i * 1000 for i in range(30))
    asyncio.run(run(31, 59, B + IV))  # the restarted gateway, same interval
    (row,) = history.queue_history("shop")
    assert (row.start_ms, row.samples, row.max_length) == (B, 59, 59)
    assert row.covered_ms == 30_000 + 29_000  # [30 s, 31 s) was nobody's
    assert row.length_area == sum(i * 1000 for i in range(60) if i != 30)
    (consumer,) = history.consumer_history("shop")
    assert consumer.pulls == 59 and consumer.last_pull_ms == B + 59_000
    history.dispose()


def test_the_flush_loop_writes_intervals_as_they_close(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock(B)
        sampler = QueueStateSampler()
        history = QueueStateHistory(tmp_path / "qs.db")
        recorder = QueueStateRecorder(sampler, history, clock=clock, flush_every_s=0.02)
        await recorder.start()
        observe_seconds(sampler, clock, 0, 59)
        clock.now_ms = B + IV + 1
        await until(lambda: recorder.stats.flushes >= 1, 10, "a flush of the closed interval")
        rows = history.queue_history("shop")
        assert [(r.start_ms, r.samples) for r in rows] == [(B, 60)]
        await recorder.stop()
        history.dispose()

    asyncio.run(scenario())


def test_a_failed_write_keeps_its_rows_until_the_database_is_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock(B)
        sampler = QueueStateSampler()
        history = QueueStateHistory(tmp_path / "not-yet" / "qs.db")  # its directory is missing
        errors: list[str] = []
        recorder = QueueStateRecorder(sampler, history, clock=clock, on_error=errors.append)
        observe_seconds(sampler, clock, 0, 59)
        clock.now_ms = B + IV
        assert await recorder.flush() == 0
        assert recorder.stats.failed_flushes == 1 and recorder.pending_rows() == 2
        assert "2 rows kept" in recorder.stats.last_error and errors == [recorder.stats.last_error]
        (tmp_path / "not-yet").mkdir()
        await asyncio.to_thread(history.create_schema)
        assert await recorder.flush() == 2
        assert recorder.pending_rows() == 0 and recorder.stats.dropped_rows == 0
        assert [r.samples for r in history.queue_history("shop")] == [60]
        history.dispose()

    asyncio.run(scenario())


def test_past_max_pending_rows_the_oldest_unwritten_rows_are_dropped_and_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock(B)
        sampler = QueueStateSampler()
        history = QueueStateHistory(tmp_path / "missing" / "qs.db")
        recorder = QueueStateRecorder(sampler, history, clock=clock, max_pending_rows=3)
        for k in range(5):  # five closed intervals of one queue
            sampler.observe_queue("shop", "orders", 0, k, B + k * IV)
        clock.now_ms = B + 5 * IV
        await recorder.flush()
        assert recorder.stats.dropped_rows == 2 and recorder.pending_rows() == 3
        assert "2 unwritten rows dropped" in recorder.stats.last_error
        (tmp_path / "missing").mkdir()
        history.create_schema()
        await recorder.flush()
        assert [r.start_ms for r in history.queue_history("shop")] == [B + k * IV for k in (2, 3, 4)]
        history.dispose()

    asyncio.run(scenario())


def test_the_probe_runs_every_sample_period_and_its_failures_are_counted(tmp_path: Path) -> None:
    calls: list[int] = []

    async def probe(now_ms: int) -> None:
        calls.append(now_ms)
        if len(calls) == 3:
            raise RuntimeError("store briefly unreachable")
        sampler.observe_queue("shop", "orders", 0, len(calls), now_ms)

    sampler = QueueStateSampler(sample_every_s=0.01)

    async def scenario() -> QueueStateRecorder:
        history = QueueStateHistory(tmp_path / "qs.db")
        recorder = QueueStateRecorder(sampler, history, probe=probe, flush_every_s=3600)
        await recorder.start()
        await until(lambda: len(calls) >= 10, 10, "ten probes")
        await recorder.stop()
        n = len(calls)
        rows = history.queue_history("shop")
        assert sum(r.samples for r in rows) == n - 1
        history.dispose()
        return recorder

    recorder = asyncio.run(scenario())
    assert recorder.stats.failed_probes == 1 and "briefly unreachable" in recorder.stats.last_error


def test_start_prunes_rows_past_the_retention(tmp_path: Path) -> None:
    async def scenario() -> None:
        history = QueueStateHistory(tmp_path / "qs.db", retention_s=3600)
        history.create_schema()
        old = [QueueInterval("p", "t", q, B, IV, 1, IV, IV, 60, None, 0) for q in range(4)]
        fresh = QueueInterval("p", "t", 0, B + 2 * 3600_000, IV, 1, IV, IV, 60, None, 0)
        history.write(Rollup([*old, fresh]))
        clock = Clock(B + 2 * 3600_000 + IV)
        recorder = QueueStateRecorder(QueueStateSampler(), history, clock=clock)
        await recorder.start()
        await until(lambda: recorder.stats.pruned_rows == 4, 10, "the prune at start")
        await recorder.stop()
        assert [r.start_ms for r in history.queue_history("p")] == [fresh.start_ms]
        history.dispose()

    asyncio.run(scenario())


@pytest.mark.parametrize("final", [False, True])
def test_flush_with_nothing_to_write_writes_nothing(tmp_path: Path, final: bool) -> None:
    history = QueueStateHistory(tmp_path / "qs.db")
    recorder = QueueStateRecorder(QueueStateSampler(), history, clock=Clock(B))
    assert asyncio.run(recorder.flush(final=final)) == 0
    assert recorder.stats.failed_flushes == 0
    history.dispose()
