"""Operating consumers (SPEC G9): per-queue progress and lag, offset resets, backlog alerts,
and the lag gauges a metrics scrape reads.

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
from dataclasses import dataclass, field
from typing import Final

from mqgate.core.queue_choice import lock_is_held
from mqgate.errors import BadRequest, MqgateError, NotFound
from mqgate.model import MODE_CLUSTER
from mqgate.offsets.interface import OffsetEntry
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


@dataclass(slots=True, frozen=True)
class QueueProgress:
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


@dataclass(slots=True, frozen=True)
class ConsumerProgress:
    consumer: str
    topic: str
    mode: str
    paused: bool
    rate_limit: float
    alert_backlog: int
    lag: int
    dead_lettered: int
    queues: list[QueueProgress] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class ClampedOffset:
    """A reset to an offset outside a queue's [min, max]: it went to the nearest bound."""

    client_id: str | None  # broadcast clients only
    queue: int  # a store queue of `source`, numbered as in progress
    source: str  # the topic, or the consumer's retry queue or inbox
    requested: int
    offset: int


@dataclass(slots=True, frozen=True)
class ResetOutcome:
    progress: ConsumerProgress
    clamped: list[ClampedOffset]


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
        if c.mode == MODE_CLUSTER:
            clients = [""]
        clamped = []
        for client in clients:
            if c.mode == MODE_CLUSTER or await ctx.offsets.table(name, client) is not None:
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
