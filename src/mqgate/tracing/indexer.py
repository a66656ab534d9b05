"""The trace indexer: reads the trace topics from the store and feeds the query index.

Each round reads every queue of every known trace topic from the position the index holds,
decodes the events and writes them with the new positions in one transaction (in a worker
thread). A record that does not decode is counted and skipped, and its offset is passed, so
one bad record neither stops indexing nor comes back. Lag (store max − indexed position, and
how long since the index last caught up) is kept for metrics and for queries that must say a
path may be incomplete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mqgate.errors import MqgateError
from mqgate.store.interface import MessageStore
from mqgate.tracing.events import is_trace_topic
from mqgate.tracing.index import Position, PositionMove, StalePositions, TraceIndex
from mqgate.tracing.index_writer import ProcessWriter, decode_and_write

log = logging.getLogger(__name__)


@dataclass(slots=True)
class IndexerCounters:
    indexed: int = 0  # events written to the index by this indexer
    malformed: int = 0  # records skipped because they did not decode as trace events
    skipped_by_retention: int = 0  # offsets the store dropped before they were indexed
    stale: int = 0  # batches another indexer wrote first (positions reloaded, nothing lost)
    failures: int = 0  # rounds that failed on the store or the index (retried)
    rounds: int = 0


@dataclass(slots=True, frozen=True)
class Lag:
    events: int  # stored trace events not yet indexed, over the topics (as last seen)
    time_ms: int  # how long since the index last held every stored event (0 when it does)
    per_topic: dict[str, int] = field(default_factory=dict)

    @property
    def caught_up(self) -> bool:
        return self.events == 0


class TraceIndexer:
    def __init__(
        self,
        store: MessageStore,
        index: TraceIndex,
        *,
        batch_events: int = 5_000,
        idle_wait_s: float = 1.0,
        discover: Callable[[], Awaitable[list[str]]] | None = None,
        discover_every_s: float = 10.0,
        max_age_ms: int | None = None,
        max_events: int | None = None,
        prune_every_s: float = 60.0,
        gather_s: float = 0.1,
        max_backoff_s: float = 5.0,
        on_failure: Callable[[str], None] | None = None,
        on_recovery: Callable[[], None] | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.store = store
        self.index = index
        self.batch_events = batch_events
        self.idle_wait_s = idle_wait_s
        self.discover = discover
        self.discover_every_s = discover_every_s
        # Retention of the index (the trace topics have the store's own retention).
        self.max_age_ms = max_age_ms
        self.max_events = max_events
        self.prune_every_s = prune_every_s
        # After a round that was not full, wait this long (or for a poke) before the next:
        # one transaction then takes what a busy gateway wrote meanwhile, instead of one per
        # record (a round costs far more than a row). It bounds the index's lag when busy.
        self.gather_s = gather_s
        self.max_backoff_s = max_backoff_s  # after failed rounds: gather_s doubling up to this
        # The gateway's health: a failing index is a fault and a degraded condition until a
        # round succeeds again.
        self.on_failure = on_failure
        self.on_recovery = on_recovery
        self._full = False  # the last round stopped at batch_events: more is waiting
        self._last_prune = time.monotonic()
        self.clock_ms = clock_ms
        self.counters = IndexerCounters()
        self._topics: set[str] = set()
        self._positions: dict[Position, int] | None = None
        self._store_max: dict[Position, int] = {}
        self._caught_up_ms = clock_ms()
        self._last_discovery = 0.0
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        # Decodes and writes in a process of its own when set (tracing/index_writer.py).
        self.writer: ProcessWriter | None = None

    # --- topics -------------------------------------------------------------------------------

    def add_topic(self, topic: str) -> None:
        """Index `topic` from now on (from its start, or from the position the index holds)."""
        if not is_trace_topic(topic):
            raise ValueError(f"{topic} is not a trace topic")
        if topic not in self._topics:
            self._topics.add(topic)
            self._poke.set()

    async def on_new_topic(self, topic: str) -> None:
        """For `TraceRecorder(on_new_topic=...)`: a topic it created is indexed at once."""
        self.add_topic(topic)

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    # --- running ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="trace-indexer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def poke(self) -> None:
        """New events were written (by this gateway): look now rather than after the wait."""
        self._poke.set()

    async def _run(self) -> None:
        failed_in_a_row = 0
        while True:
            try:
                done = await self.step()
                await self._prune_if_due()
                if done == 0:
                    await self._wait_for_events()
                elif not self._full and self.gather_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._poke.wait(), self.gather_s)
                    self._poke.clear()
                if failed_in_a_row and self.on_recovery is not None:
                    self.on_recovery()
                failed_in_a_row = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Never die: the store or the index may be back next round. But back off, so a
                # broken index costs a round (and a log line) per backoff, not one per write.
                self.counters.failures += 1
                failed_in_a_row += 1
                wait_s = min(self.max_backoff_s, self.gather_s * 2**failed_in_a_row)
                log.warning(
                    "trace indexing round failed (%d in a row, next try in %.1f s): %r",
                    failed_in_a_row,
                    wait_s,
                    exc,
                )
                if self.on_failure is not None:
                    self.on_failure(repr(exc))
                await asyncio.sleep(wait_s)

    async def _wait_for_events(self) -> None:
        """Until a trace topic is written (here or, for a shared store, on another gateway),
        poked, or `idle_wait_s` passed."""
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._poke.wait())]
        waits += [
            asyncio.ensure_future(self.store.wait_for_data(t, self.idle_wait_s))
            for t in sorted(self._topics)
            if self.store.has_topic(t)
        ]
        try:
            # A write between the last read and the waiters' registration would wake no one:
            # once they are registered, look at the bounds again.
            await asyncio.sleep(0)
            if (await self.lag_now()).events == 0:
                await asyncio.wait(waits, timeout=self.idle_wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        self._poke.clear()

    async def _prune_if_due(self) -> None:
        if self.max_age_ms is None and self.max_events is None:
            return
        if time.monotonic() - self._last_prune < self.prune_every_s:
            return
        self._last_prune = time.monotonic()
        while (
            await asyncio.to_thread(
                self.index.prune, self.clock_ms(), max_age_ms=self.max_age_ms, max_events=self.max_events
            )
            and not self._poke.is_set()
        ):
            pass  # a chunk at a time, yielding to new events between chunks

    async def step(self) -> int:
        """One round: index what is there, up to `batch_events`; return how many records were
        passed (indexed or skipped as malformed)."""
        self.counters.rounds += 1
        await self._discover()
        if self._positions is None:
            self._positions = await asyncio.to_thread(self.index.positions)
        raws: list[bytes] = []
        moves: dict[Position, PositionMove] = {}
        passed = skipped = 0
        self._full = False
        for topic in sorted(self._topics):
            if not self.store.has_topic(topic):
                continue
            for bounds in await self.store.bounds(topic):
                where = (topic, bounds.queue)
                self._store_max[where] = bounds.max
                known = self._positions.get(where)
                start = known or 0
                if start < bounds.min:  # retention dropped them before they were indexed
                    skipped += bounds.min - start
                    start = bounds.min
                    moves[where] = PositionMove(known, start)
                room = self.batch_events - len(raws)
                if start >= bounds.max or room <= 0:
                    self._full |= start < bounds.max
                    continue
                records = await self.store.read_raw(topic, bounds.queue, start, room)
                if not records:
                    continue
                self._full |= len(records) >= room
                raws += [raw for _, raw in records]
                passed += len(records)
                moves[where] = PositionMove(known, records[-1][0] + 1)
        if not moves:
            self._note_lag()
            return 0
        try:
            if self.writer is not None:
                written = await self.writer.write(raws, moves)
                self.index.counters.written += written.rows
            else:
                written = await asyncio.to_thread(decode_and_write, self.index, raws, moves)
        except StalePositions:
            self.counters.stale += 1
            self._positions = None  # reload: another indexer did this part
            return 0
        for where, move in moves.items():
            self._positions[where] = move.new
        self.counters.indexed += written.held
        self.counters.malformed += written.malformed
        self.counters.skipped_by_retention += skipped
        self._note_lag()
        return passed

    async def _discover(self) -> None:
        if self.discover is None or time.monotonic() - self._last_discovery < self.discover_every_s:
            return
        self._last_discovery = time.monotonic()
        try:
            for topic in await self.discover():
                if is_trace_topic(topic):
                    self._topics.add(topic)
        except MqgateError as exc:
            log.warning("trace topic discovery failed: %r", exc)

    async def run_until_caught_up(self, timeout_s: float = 60.0) -> None:
        """Index until the lag is zero as of the store's bounds now (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while (await self.lag_now()).events > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the trace indexer did not catch up")
            await self.step()

    # --- lag ----------------------------------------------------------------------------------

    def _note_lag(self) -> None:
        if self._lag_events() == 0:
            self._caught_up_ms = self.clock_ms()

    def _lag_events(self, topic: str | None = None) -> int:
        positions = self._positions or {}
        return sum(
            max(0, high - positions.get(where, 0))
            for where, high in self._store_max.items()
            if topic is None or where[0] == topic
        )

    def lag(self) -> Lag:
        """The lag as of the last round (cheap: for metrics)."""
        per_topic = {t: self._lag_events(t) for t in sorted(self._topics)}
        events = sum(per_topic.values())
        time_ms = 0 if events == 0 else max(0, self.clock_ms() - self._caught_up_ms)
        return Lag(events, time_ms, per_topic)

    async def lag_now(self, topic: str | None = None) -> Lag:
        """The lag against the store's bounds now (for a query about to answer)."""
        for t in [topic] if topic is not None else sorted(self._topics):
            if t is not None and self.store.has_topic(t):
                for bounds in await self.store.bounds(t):
                    self._store_max[(t, bounds.queue)] = bounds.max
        if self._positions is None:
            self._positions = await asyncio.to_thread(self.index.positions)
        lag = self.lag()
        if topic is not None:
            events = lag.per_topic.get(topic, self._lag_events(topic))
            return Lag(events, lag.time_ms if events else 0, {topic: events})
        return lag
