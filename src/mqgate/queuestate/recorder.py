"""The async side of queue state: sample, flush the rolled-up rows to the history, prune.

Three loops on the event loop: `probe(now_ms)` every `sample_every_s` (the caller's coroutine
that reads queue lengths and backlogs and calls the sampler's observe_* methods), a flush every
`flush_every_s` that rolls up the finished intervals and writes them in a worker thread
(asyncio.to_thread), and a prune every `prune_every_s`. `stop()` ends the loops without
cancelling a write in progress (a cancelled await would leave the thread writing while the rows
stay pending, and the next write would count them twice), then writes the open intervals up to
now: a SIGTERM keeps the last partial interval, and a restart's rows add to it.

A write that fails (database down) keeps its rows and retries at the next flush; past
`max_pending_rows` the oldest are dropped and counted in `stats.dropped_rows`, never silently.
A kill -9 loses what was not yet flushed: the open interval and at most `flush_every_s` of
closed ones (`partial_flush=True` also writes the open intervals at every flush, bounding the
loss to `flush_every_s` at the cost of one upsert per active key per flush).

Steady runs (queuestate/runs.py, issue 27): an interval row equal to its key's previous one
(an idle queue) is not written as a row of its own but extends the key's run, written on when
the run ends, before a reader looks (`flush()`, which the queries call), on stop and at least
every `persist_every_s`: an idle gateway's history grows by what changed, not by a row per
queue per interval. A kill -9 may lose up to `persist_every_s` of a run that went on (its
first row is written when it begins). With `partial_flush` every row is written as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec

from mqgate.queuestate.history import PruneCounts, QueueStateHistory
from mqgate.queuestate.rows import Rollup
from mqgate.queuestate.runs import DEFAULT_PERSIST_EVERY_MS, SteadyRuns
from mqgate.queuestate.sampler import QueueStateSampler
from mqgate.timeouts import wait_event

log = logging.getLogger("mqgate.queuestate")

DEFAULT_FLUSH_EVERY_S: Final = 10.0
DEFAULT_PRUNE_EVERY_S: Final = 3600.0
DEFAULT_MAX_PENDING_ROWS: Final = 1_000_000

Probe = Callable[[int], Awaitable[None]]


def wall_ms() -> int:
    return int(time.time() * 1000)


class RecorderStats(msgspec.Struct):
    written_rows: int = 0
    flushes: int = 0
    failed_flushes: int = 0
    dropped_rows: int = 0  # rows given up after failed writes (past max_pending_rows)
    pruned_rows: int = 0
    failed_probes: int = 0
    last_error: str = ""


class QueueStateRecorder:
    def __init__(
        self,
        sampler: QueueStateSampler,
        history: QueueStateHistory,
        *,
        probe: Probe | None = None,
        flush_every_s: float = DEFAULT_FLUSH_EVERY_S,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
        partial_flush: bool = False,
        max_pending_rows: int = DEFAULT_MAX_PENDING_ROWS,
        clock: Callable[[], int] = wall_ms,
        on_error: Callable[[str], None] | None = None,
        persist_every_s: float = DEFAULT_PERSIST_EVERY_MS / 1000,
    ) -> None:
        self.sampler = sampler
        self.history = history
        self.probe = probe
        self.flush_every_s = flush_every_s
        self.prune_every_s = prune_every_s
        self.partial_flush = partial_flush
        self.max_pending_rows = max_pending_rows
        self.clock = clock
        self.on_error = on_error  # e.g. the gateway's Health.fault, to show it in /healthz
        self.stats = RecorderStats()
        self.runs = None if partial_flush else SteadyRuns(int(persist_every_s * 1000))
        self._pending = Rollup()
        self._flush_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await asyncio.to_thread(self.history.create_schema)
        self._stopping.clear()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._flush_loop(), name="queuestate-flush"),
            loop.create_task(self._prune_loop(), name="queuestate-prune"),
        ]
        if self.probe is not None:
            self._tasks.append(loop.create_task(self._sample_loop(self.probe), name="queuestate-sample"))

    async def stop(self) -> None:
        """End the loops (letting a write finish), then write everything up to now."""
        self._stopping.set()
        for task in self._tasks:
            if task.get_name() == "queuestate-sample":
                task.cancel()  # a probe only observes: cutting it short loses nothing
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        self._tasks = []
        await self.flush(final=True)

    async def flush(self, *, final: bool = False, everything: bool = True) -> int:
        """Roll up and write; the rows written (0 when the write failed: they stay pending).
        `everything`: the steady runs' intervals too (a reader is about to look); the flush
        loop leaves them to their run's end or `persist_every_s`."""
        async with self._flush_lock:
            now = self.clock()
            for _ in self.sampler.sweep(now, final=final or self.partial_flush):
                await asyncio.sleep(0)  # let requests in between chunks of keys
            closed = self.sampler.take_closed()
            if self.runs is not None:
                closed = self.runs.fold(closed, now)
                closed.extend(self.runs.take(now, everything=everything or final))
            self._pending.extend(closed)
            if not len(self._pending):
                return 0
            batch, self._pending = self._pending, Rollup()
            try:
                written = await asyncio.to_thread(self.history.write, batch)
            except Exception as exc:
                self._failed(f"queue state flush failed, {len(batch)} rows kept for the next one: {exc}")
                self.stats.failed_flushes += 1
                batch.extend(self._pending)
                self._pending = self._bounded(batch)
                return 0
            self.stats.flushes += 1
            self.stats.written_rows += written
            return written

    async def prune(self) -> PruneCounts:
        counts = await asyncio.to_thread(self.history.prune, self.clock())
        self.stats.pruned_rows += counts.total
        if counts.total:
            log.info("queue state: pruned %d rows older than the retention", counts.total)
        return counts

    def pending_rows(self) -> int:
        return len(self._pending) + self.sampler.pending_rows()

    def _bounded(self, rows: Rollup) -> Rollup:
        if len(rows) <= self.max_pending_rows:
            return rows
        # Drop the oldest first: the newest intervals matter most to a health answer.
        starts = sorted(
            [r.start_ms for r in rows.queues]
            + [r.start_ms for r in rows.consumers]
            + [r.start_ms for r in rows.produce],
            reverse=True,
        )
        cutoff = starts[self.max_pending_rows - 1]
        kept = Rollup(
            [r for r in rows.queues if r.start_ms >= cutoff],
            [r for r in rows.consumers if r.start_ms >= cutoff],
            [r for r in rows.produce if r.start_ms >= cutoff],
        )
        dropped = len(rows) - len(kept)
        self.stats.dropped_rows += dropped
        self._failed(f"queue state: {dropped} unwritten rows dropped (over {self.max_pending_rows} pending)")
        return kept

    def _failed(self, detail: str) -> None:
        self.stats.last_error = detail
        log.warning(detail)
        if self.on_error is not None:
            self.on_error(detail)

    async def _pause(self, seconds: float) -> bool:
        """Wait `seconds`; True as soon as the recorder is stopping."""
        return await wait_event(self._stopping, seconds)

    async def _flush_loop(self) -> None:
        while not await self._pause(self.flush_every_s):
            try:
                await self.flush(everything=False)
            except Exception as exc:  # a bug must not end the loop: say so and go on
                self._failed(f"queue state flush loop: {exc!r}")

    async def _prune_loop(self) -> None:
        while True:
            try:
                await self.prune()
            except Exception as exc:
                self._failed(f"queue state prune failed: {exc}")
            if await self._pause(self.prune_every_s):
                return

    async def _sample_loop(self, probe: Probe) -> None:
        # Deadline-based so the samples keep their period however long a probe takes.
        period = self.sampler.sample_every_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._stopping.is_set():
            try:
                await probe(self.clock())
            except Exception as exc:
                self.stats.failed_probes += 1
                self._failed(f"queue state probe failed: {exc!r}")
            next_at = max(next_at + period, loop.time())
            if await self._pause(next_at - loop.time()):
                return
