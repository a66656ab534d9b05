"""The trace indexer: reads the trace topics from the store and feeds the query index.

Each round reads the trace topics that changed since the last one (the dirty set) from the
positions the index holds, decodes the events and writes them with the new positions in one
transaction (in a worker thread). A record that does not decode is counted and skipped, and its
offset is passed, so one bad record neither stops indexing nor comes back. Lag (store max −
indexed position, and how long since the index last caught up) is kept for metrics and for
queries that must say a path may be incomplete; it is kept up to date as positions and bounds
move, so reading it costs nothing per topic.

Idle work is proportional to what changed, not to how many trace topics exist (issue 27: one
per project, thousands): while the indexer runs, each topic has a watcher waiting on the
store's wake-ups for it (`wait_for_data`: this gateway's writes and, on a shared store, the
other gateways'), which marks it dirty when it is written; a round looks at the dirty topics
only. A watcher's wait also ends after `watch_s` (an hour by default), marking its topic dirty
as well: a safety net against a wake-up lost, which spreads one look at every topic over that
time. An indexer that is not running (`step` called by hand) has no watchers: its rounds and
`lag_now` look at every topic, as nothing tells it which changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from mqgate.errors import MqgateError
from mqgate.store.interface import MessageStore
from mqgate.timeouts import wait_event
from mqgate.tracing.events import is_trace_topic
from mqgate.tracing.index import Position, PositionMove, StalePositions, TraceIndex
from mqgate.tracing.index_writer import ProcessWriter, decode_and_write

log = logging.getLogger(__name__)


class IndexerCounters(msgspec.Struct):
    indexed: int = 0  # events written to the index by this indexer
    malformed: int = 0  # records skipped because they did not decode as trace events
    skipped_by_retention: int = 0  # offsets the store dropped before they were indexed
    stale: int = 0  # batches another indexer wrote first (positions reloaded, nothing lost)
    failures: int = 0  # rounds that failed on the store or the index (retried)
    rounds: int = 0
    visited: int = 0  # topics rounds looked at (the store's bounds read): what idle costs


class Lag(msgspec.Struct, frozen=True):
    events: int  # stored trace events not yet indexed, over the topics (as last seen)
    time_ms: int  # how long since the index last held every stored event (0 when it does)
    per_topic: dict[str, int] = msgspec.field(default_factory=dict)  # the topics that lag, only

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
        watch_s: float = 3600.0,
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
        self._dirty: set[str] = set()  # topics to look at in the next round
        self._watchers: dict[str, asyncio.Task[None]] = {}  # while running: one per topic
        self.watch_s = watch_s  # a watcher's longest wait: then it marks its topic anyway
        self._positions: dict[Position, int] | None = None
        self._store_max: dict[Position, int] = {}
        self._lag: dict[Position, int] = {}  # positions behind their store max, by how much
        self._lag_total = 0
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
            self.mark(topic)
            if self._task is not None:
                self._watch(topic)

    def remove_topic(self, topic: str) -> None:
        """Stop indexing `topic` (deleted with its project); what the index holds stays."""
        self._topics.discard(topic)
        self._dirty.discard(topic)
        watcher = self._watchers.pop(topic, None)
        if watcher is not None:
            watcher.cancel()
        for where in [w for w in self._store_max if w[0] == topic]:
            del self._store_max[where]
            self._lag_total -= self._lag.pop(where, 0)

    def mark(self, topic: str) -> None:
        """`topic` was written (or may have been): the next round looks at it."""
        self._dirty.add(topic)
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
            for topic in sorted(self._topics):
                self._watch(topic)

    async def close(self) -> None:
        tasks = list(self._watchers.values())
        self._watchers = {}
        if self._task is not None:
            tasks.append(self._task)
            self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def watching(self) -> bool:
        """Whether watchers tell the rounds which topics changed (the indexer runs)."""
        return self._task is not None

    def _watch(self, topic: str) -> None:
        if topic not in self._watchers:
            loop = asyncio.get_running_loop()
            self._watchers[topic] = loop.create_task(self._watcher(topic), name=f"trace-watch:{topic}")

    async def _watcher(self, topic: str) -> None:
        """Mark `topic` dirty whenever the store says it was written (and after `watch_s`
        without a word). The mark is made after the wake-up and before the next wait, and a
        round reads the bounds after the mark: a write in between is never missed."""
        failures = 0
        while True:
            try:
                await self.store.wait_for_data(topic, self.watch_s)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not in the store (yet, or any more), or the store is away
                failures += 1
                self.mark(topic)
                wait_s = min(60.0, 0.1 * 2**failures)
                log.debug("trace topic %s cannot be watched (%r): next try in %.1f s", topic, exc, wait_s)
                await asyncio.sleep(wait_s)
                continue
            self.mark(topic)

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
                    await wait_event(self._poke, self.gather_s)
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
        """Until a trace topic is written (its watcher marks it), poked, or `idle_wait_s`
        passed. Nothing here looks at the topics: that is what made an idle gateway with
        thousands of them busy."""
        await wait_event(self._poke, self.idle_wait_s)
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

    def _take_todo(self) -> set[str]:
        """The topics this round looks at: the dirty ones, or every one with no watchers."""
        if self.watching:
            todo, self._dirty = self._dirty & self._topics, set()
        else:
            todo, self._dirty = set(self._topics), set()
        return todo

    async def step(self) -> int:
        """One round: index what is there in the topics that changed, up to `batch_events`;
        return how many records were passed (indexed or skipped as malformed)."""
        self.counters.rounds += 1
        await self._discover()
        if self._positions is None:
            self._positions = await asyncio.to_thread(self.index.positions)
            self._recount_lag()
        todo = self._take_todo()
        try:
            return await self._round(todo, self._positions)
        except BaseException:
            self._dirty |= todo  # nothing of the round was written: look at them again
            raise

    async def _round(self, todo: set[str], positions: dict[Position, int]) -> int:
        raws: list[bytes] = []
        moves: dict[Position, PositionMove] = {}
        more: set[str] = set()  # topics with records left after this round
        passed = skipped = 0
        self._full = False
        for topic in sorted(todo):
            if not self.store.has_topic(topic):
                continue
            self.counters.visited += 1
            for bounds in await self.store.bounds(topic):
                where = (topic, bounds.queue)
                self._set_max(where, bounds.max)
                known = positions.get(where)
                start = known or 0
                if start < bounds.min:  # retention dropped them before they were indexed
                    skipped += bounds.min - start
                    start = bounds.min
                    moves[where] = PositionMove(known, start)
                room = self.batch_events - len(raws)
                if start >= bounds.max or room <= 0:
                    if start < bounds.max:
                        self._full = True
                        more.add(topic)
                    continue
                records = await self.store.read_raw(topic, bounds.queue, start, room)
                if not records:
                    continue
                self._full |= len(records) >= room
                raws += [raw for _, raw in records]
                passed += len(records)
                moves[where] = PositionMove(known, records[-1][0] + 1)
                if records[-1][0] + 1 < bounds.max:
                    more.add(topic)
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
            self._dirty |= todo
            return 0
        for where, move in moves.items():
            positions[where] = move.new
            self._relag(where)
        self._dirty |= more
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
                    self.add_topic(topic)
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
        if self._lag_total == 0:
            self._caught_up_ms = self.clock_ms()

    def _set_max(self, where: Position, high: int) -> None:
        if where[0] in self._topics:  # not one removed meanwhile
            self._store_max[where] = high
            self._relag(where)

    def _relag(self, where: Position) -> None:
        """Keep the lag of `where` (and the total) as its bound or position moved."""
        positions = self._positions or {}
        behind = max(0, self._store_max.get(where, 0) - positions.get(where, 0))
        before = self._lag.pop(where, 0)
        if behind:
            self._lag[where] = behind
        self._lag_total += behind - before

    def _recount_lag(self) -> None:
        self._lag, self._lag_total = {}, 0
        for where in self._store_max:
            self._relag(where)

    def lag(self) -> Lag:
        """The lag as of the last round (cheap: for metrics; per topic, the lagging ones)."""
        per_topic: dict[str, int] = {}
        for (topic, _), behind in self._lag.items():
            per_topic[topic] = per_topic.get(topic, 0) + behind
        events = self._lag_total
        time_ms = 0 if events == 0 else max(0, self.clock_ms() - self._caught_up_ms)
        return Lag(events, time_ms, per_topic)

    async def lag_now(self, topic: str | None = None) -> Lag:
        """The lag against the store's bounds now (for a query about to answer): of the
        topics that may have moved since they were last looked at (the dirty ones while the
        watchers run; every one without them), and of `topic` if given."""
        if topic is not None:
            looks = [topic]
        elif self.watching:
            looks = sorted(self._dirty & self._topics)
        else:
            looks = sorted(self._topics)
        for t in looks:
            if self.store.has_topic(t):
                for bounds in await self.store.bounds(t):
                    self._set_max((t, bounds.queue), bounds.max)
        if self._positions is None:
            self._positions = await asyncio.to_thread(self.index.positions)
            self._recount_lag()
        lag = self.lag()
        self._dirty |= lag.per_topic.keys() & set(looks)  # behind: the next round looks at them
        if topic is not None:
            events = lag.per_topic.get(topic, 0)
            return Lag(events, lag.time_ms if events else 0, {topic: events} if events else {})
        return lag
