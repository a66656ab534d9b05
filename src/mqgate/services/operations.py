"""Operating consumers (SPEC G9): per-queue progress and lag, offset resets, purges, backlog
alerts, and the lag gauges a metrics scrape reads.

A purge (issue 29) is a reset to the end of a log, planned first: every consumer of a topic on
one of its queues (or all), or one consumer on its queues (one of the topic's, or all of them,
its retry queue and inbox included). Its plan counts what each committed offset skips; the purge
itself moves each to the end the queue has when it runs (messages produced since the plan are
skipped too, and counted in its answer). Nothing leaves the log: retention removes it.

The lag gauges follow what changed (issue 27): a pass recomputes the consumers whose lag may
have moved, as the store and the offset tables tell their moves (services/changes.py: a write
to a topic, to a retry queue or inbox, retention, a commit, a reset, a registration), soon after
the move. A pass comes at least every LAG_FULL_PASS_S even with nothing moved; it recomputes
every consumer only where moves can go unheard (a Redis store other gateways write to, a project
served by a cluster), as all passes did before. With nothing moved an idle pass recomputes
nobody; `mqgate_lag_passes_total` and `mqgate_lag_recomputed_total` count both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import msgspec

from mqgate.core.queue_choice import lock_is_held
from mqgate.errors import BadRequest, MqgateError, NotFound
from mqgate.model import MODE_BROADCAST
from mqgate.offsets.interface import OffsetEntry
from mqgate.registry.records import ConsumerRecord
from mqgate.services.changes import Changes
from mqgate.services.consume import Consuming
from mqgate.services.context import Context, now_ms
from mqgate.services.topology import Topology
from mqgate.timeouts import wait_event

log = logging.getLogger(__name__)

RESET_TARGETS = ("earliest", "latest", "offset", "timestamp")
# A pass comes at least this often. Where moves can go unheard (see the module's docstring) it
# recomputes every consumer, and then at most a twentieth of the time: a pass over thousands
# of consumers reads the store for each. Where every move is heard it recomputes what moved
# (nothing, idle) and what failed before.
LAG_FULL_PASS_S: Final = 10.0
# The least time between two passes: a scrape waits for at most one of them.
LAG_COALESCE_S: Final = 0.1
LAG_PASS_SHARE: Final = 20


class QueueProgress(msgspec.Struct, frozen=True):
    client_id: str | None  # broadcast clients only
    broker: str
    queue: int
    source: str  # the store topic behind the queue (topic, retry or inbox)
    lane: int
    min: int
    max: int
    committed: int
    lag: int
    locked: bool
    lock_age_ms: int | None
    lock_owner: str | None
    last_access_ms: int | None
    attempts: int
    dead_lettered: int


class ConsumerProgress(msgspec.Struct, frozen=True):
    consumer: str
    topic: str
    mode: str
    paused: bool
    rate_limit: float
    alert_backlog: int
    lag: int
    dead_lettered: int
    queues: list[QueueProgress] = msgspec.field(default_factory=list)


class ClampedOffset(msgspec.Struct, frozen=True):
    """A reset to an offset outside a queue's [min, max]: it went to the nearest bound."""

    client_id: str | None  # broadcast clients only
    queue: int  # a store queue of `source`, numbered as in progress
    source: str  # the topic, or the consumer's retry queue or inbox
    requested: int
    offset: int


class ResetOutcome(msgspec.Struct, frozen=True):
    progress: ConsumerProgress
    clamped: list[ClampedOffset]


class PurgeMove(msgspec.Struct, frozen=True):
    """One committed offset a purge moves: from where the consumer stands to the queue's end."""

    consumer: str
    client_id: str | None  # broadcast clients only
    source: str  # the store topic behind the queue (topic, retry or inbox)
    queue: int  # a store queue of `source`
    committed: int  # where it stands (never below the queue's first offset)
    end: int

    @property
    def skipped(self) -> int:
        return max(self.end - self.committed, 0)


class PurgePlan(msgspec.Struct, frozen=True):
    """What a purge of `topic` (every consumer of it) or of `consumer` does, or did."""

    topic: str
    consumer: str | None
    queue: int | None  # a store queue of the topic; None: every queue
    moves: list[PurgeMove]
    purged: bool  # False: a preview

    @property
    def skipped(self) -> int:
        return sum(m.skipped for m in self.moves)

    @property
    def consumers(self) -> list[str]:
        return sorted({m.consumer for m in self.moves})


class Operations:
    """Consumer operations, and the lag gauges (kept as the store and the offsets move)."""

    def __init__(self, ctx: Context, topology: Topology, consuming: Consuming, changes: Changes) -> None:
        self.ctx = ctx
        self.topology = topology
        self.consuming = consuming
        self.changes = changes
        self._moved = changes.reader(on_mark=self._lag_moved)
        self._lag_failed: set[str] = set()  # refreshes that failed: again at the next pass due
        self._lag_kick = asyncio.Event()
        self._lag_asked = 0  # moves heard so far
        self._lag_done = 0  # of those, how many the gauges reflect
        self._lag_pass_ended = asyncio.Event()

    async def progress(self, name: str) -> ConsumerProgress:
        ctx = self.ctx
        c = await self.topology.consumer(name)
        layout = await self.topology.layout(c)
        bounds = await self.topology.bounds(layout)
        now = now_ms()
        queues = []
        total_lag = total_dead = 0
        for client in await ctx.offsets.clients(name):
            table = await ctx.offsets.table(name, client) or []
            # Queues the topic gained since the table was last written are read from their
            # beginning (the table grows at the next pull).
            table += [OffsetEntry(committed=b.min) for b in bounds[len(table) :]]
            for b, e in zip(bounds, table, strict=False):
                slot = layout.slot(b.queue)
                lag = max(b.max - max(e.committed, b.min), 0)
                total_lag += lag
                total_dead += e.dead_lettered
                locked = lock_is_held(e.lock_ts, e.lock_deadline_ms, now)
                queues.append(
                    QueueProgress(
                        client_id=client or None,
                        broker=ctx.store.broker,
                        queue=slot.queue,
                        source=slot.topic,
                        lane=slot.lane,
                        min=b.min,
                        max=b.max,
                        committed=e.committed,
                        lag=lag,
                        locked=locked,
                        lock_age_ms=now - e.lock_ts if locked else None,
                        lock_owner=e.lock_owner if locked else None,
                        last_access_ms=e.last_access_ms or None,
                        attempts=e.attempts,
                        dead_lettered=e.dead_lettered,
                    )
                )
        ctx.metrics.child(ctx.metrics.lag, name).set(total_lag)
        return ConsumerProgress(
            c.name,
            c.topic,
            c.mode,
            c.paused,
            c.rate_limit_per_s,
            c.alert_backlog,
            total_lag,
            total_dead,
            queues,
        )

    async def reset(
        self,
        name: str,
        to: str,
        *,
        offset: int | None,
        timestamp_ms: int | None,
        queue: int | None,
        client_id: str | None,
    ) -> ResetOutcome:
        """Move committed offsets (re-consume or skip backlog), for every queue or one, for
        every broadcast client or one; say which requested offsets were out of bounds."""
        ctx = self.ctx
        c = await self.topology.consumer(name)
        layout = await self.topology.layout(c)
        bounds = await self.topology.bounds(layout)
        topic_queues = layout.topic_queues  # `queue` is a store queue of the topic
        if queue is not None and not 0 <= queue < topic_queues:
            raise BadRequest(f"queue must be between 0 and {topic_queues - 1}", field="queue")
        if to not in RESET_TARGETS:
            raise BadRequest("to must be earliest, latest, offset or timestamp", field="to")
        if to == "offset" and offset is None:
            raise BadRequest("offset is required with to=offset", field="offset")
        if to == "timestamp" and timestamp_ms is None:
            raise BadRequest("timestamp is required with to=timestamp", field="timestamp")
        clients = [client_id] if client_id is not None else await ctx.offsets.clients(name)
        if c.mode != MODE_BROADCAST:
            clients = [""]
        clamped = []
        for client in clients:
            if c.mode != MODE_BROADCAST or await ctx.offsets.table(name, client) is not None:
                await self.consuming.ensure_table(c, layout, client)
            if await ctx.offsets.table(name, client) is None:
                raise NotFound(f"consumer {name} has no clientId {client}", field="clientId")
            for b in bounds:
                if queue is not None and b.queue != layout.grid.table_index(queue):
                    continue
                if to == "earliest":
                    target = b.min
                elif to == "latest":
                    target = b.max
                elif to == "offset":
                    assert offset is not None
                    target = min(max(offset, b.min), b.max)
                    if target != offset:
                        slot = layout.slot(b.queue)
                        clamped.append(ClampedOffset(client or None, slot.queue, slot.topic, offset, target))
                else:
                    assert timestamp_ms is not None
                    slot = layout.slot(b.queue)
                    target = await ctx.store.offset_for_time(slot.topic, slot.queue, timestamp_ms)
                await ctx.offsets.reset(name, client, b.queue, target)
        ctx.store.wake(c.topic)
        return ResetOutcome(await self.progress(name), clamped)

    # --- purge --------------------------------------------------------------------------

    async def purge_plan(self, *, topic: str | None = None, consumer: str | None = None,
                         queue: int | None = None) -> PurgePlan:  # fmt: skip
        """What a purge would skip, per consumer (and broadcast client) and queue: nothing moves."""
        return await self._purge(topic, consumer, queue, confirm=None)

    async def purge(self, *, topic: str | None = None, consumer: str | None = None,
                    queue: int | None = None, confirm: str) -> PurgePlan:  # fmt: skip
        """Move the committed offsets of the plan to each queue's end. `confirm` must repeat
        the topic's or the consumer's name: a purge skips a whole backlog, so a caller states
        what it purges instead of clicking or retrying its way into it."""
        return await self._purge(topic, consumer, queue, confirm=confirm)

    async def _purge(
        self, topic: str | None, consumer: str | None, queue: int | None, confirm: str | None
    ) -> PurgePlan:
        if (topic is None) == (consumer is None):
            raise BadRequest("purge a topic or a consumer: give exactly one", field="topic")
        if consumer is not None:
            targets = [await self.topology.consumer(consumer)]
            topic_name = targets[0].topic
        else:
            assert topic is not None
            topic_name = (await self.topology.topic(topic)).name
            snap = self.ctx.registry.snapshot
            targets = sorted(
                (c for c in snap.consumers.values() if c.topic == topic_name), key=lambda c: c.name
            )
        named = consumer if consumer is not None else topic_name
        if confirm is not None and confirm != named:
            what = "consumer" if consumer is not None else "topic"
            raise BadRequest(f"confirm must repeat the {what}'s name, {named}", field="confirm")
        grid = (await self.topology.topic(topic_name)).grid
        if queue is not None and not 0 <= queue < grid.size:
            raise BadRequest(f"queue must be between 0 and {grid.size - 1}", field="queue")
        moves: list[PurgeMove] = []
        for c in targets:
            moves += await self._purge_consumer(
                c, queue, whole=consumer is not None, apply=confirm is not None
            )
        if confirm is not None:
            self.ctx.store.wake(topic_name)
            where = "" if queue is None else f" queue {queue}"
            log.warning("purge of %s%s: %d messages skipped", named, where, sum(m.skipped for m in moves))
        return PurgePlan(topic_name, consumer, queue, moves, purged=confirm is not None)

    async def _purge_consumer(
        self, c: ConsumerRecord, queue: int | None, whole: bool, apply: bool
    ) -> list[PurgeMove]:
        """`whole`: with no queue named, the consumer's retry queue and inbox are purged too (its
        backlog); a topic's purge leaves them (they hold only what that consumer was sent)."""
        ctx = self.ctx
        layout = await self.topology.layout(c)
        bounds = await self.topology.bounds(layout)
        wanted = None if queue is None else layout.grid.table_index(queue)
        clients = [""] if c.mode != MODE_BROADCAST else await ctx.offsets.clients(c.name)
        moves = []
        tables: dict[str, list[OffsetEntry]] = {}
        for client in clients:
            if apply:
                # Every table covers every queue first (a consumer that never pulled, a broadcast
                # client's table from before the topic grew): no reset fails half-way for that.
                try:
                    await self.consuming.ensure_table(c, layout, client)
                except NotFound:  # an expired broadcast client: nothing of it to purge
                    continue
            tables[client] = await ctx.offsets.table(c.name, client) or []
        for client, table in tables.items():
            for b in bounds:
                slot = layout.slot(b.queue)
                if wanted is not None and b.queue != wanted:
                    continue
                if wanted is None and not whole and slot.topic != c.topic:
                    continue
                committed = table[b.queue].committed if b.queue < len(table) else b.min
                if apply:
                    try:
                        await ctx.offsets.reset(c.name, client, b.queue, b.max)
                    except (NotFound, IndexError):  # the client expired meanwhile
                        break
                moves.append(
                    PurgeMove(c.name, client or None, slot.topic, slot.queue, max(committed, b.min), b.max)
                )
        return moves

    # --- lag gauges ---------------------------------------------------------------------

    def lag_changed(self, consumer: str) -> None:
        """`consumer`'s lag may have moved: recompute its gauge soon (the store's and the
        offsets' moves and registrations are told without this)."""
        self.changes.consumer_moved(consumer)

    def _lag_moved(self) -> None:
        self._lag_asked += 1
        self._lag_kick.set()

    async def lag_settled(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until the gauges reflect every change asked so far."""
        target = self._lag_asked
        deadline = time.monotonic() + timeout_s
        while self._lag_done < target:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await wait_event(self._lag_pass_ended, remaining)

    async def keep_lag_gauges(self) -> None:
        """Recompute the gauges of the consumers whose lag may have moved, soon after the
        move, in a pass at least every LAG_FULL_PASS_S (the first recomputes every consumer,
        and so does each one due where moves can go unheard); a metrics scrape then only
        renders them."""
        m = self.ctx.metrics
        next_due = time.monotonic()
        while True:
            # Not kicked: due (the timer may end a hair before next_due).
            kicked = await wait_event(self._lag_kick, next_due - time.monotonic())
            self._lag_kick.clear()
            asked = self._lag_asked
            started = time.monotonic()
            due = not kicked or started >= next_due
            # Taken after `asked`: every move counted in it is in what is taken.
            moved = self._moved.take()
            full = moved.everything or (due and not self.changes.exact)
            names = moved.consumers
            if full:
                names |= set(self.ctx.registry.snapshot.consumers)
            if due or full:
                names |= self._lag_failed
                self._lag_failed = set()
            for name in sorted(names):
                if not await self._refresh_lag(name):
                    self._lag_failed.add(name)
                await asyncio.sleep(0)  # a pass over thousands must not hold up requests
            m.child(m.lag_passes, "full" if full else "changes").inc()
            m.lag_recomputed.inc(len(names))
            if due:
                took = time.monotonic() - started
                next_due = time.monotonic() + max(LAG_FULL_PASS_S, took * LAG_PASS_SHARE if full else 0.0)
            self._lag_done = asked
            ended, self._lag_pass_ended = self._lag_pass_ended, asyncio.Event()
            ended.set()
            # Changes coming meanwhile (an ack each, thousands a second) share the next pass.
            await asyncio.sleep(LAG_COALESCE_S)

    async def _refresh_lag(self, name: str) -> bool:
        """Recompute `name`'s gauge; False if that failed (the next pass due tries again)."""
        try:
            await self.progress(name)
        except NotFound:  # deleted: its series go (still registered: one of its topics is
            # not made yet, which tells its move when it is; and the next pass due tries again)
            self.ctx.metrics.forget_gauge(self.ctx.metrics.lag, name)
            return name not in self.ctx.registry.snapshot.consumers
        except MqgateError as exc:  # e.g. Redis briefly down
            log.warning("lag of consumer %s: %s", name, exc.message)
            return False
        except Exception:
            log.exception("lag of consumer %s", name)
            return False
        return True
