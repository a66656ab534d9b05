"""Operating consumers (SPEC G9): per-queue progress and lag, offset resets, backlog alerts."""

from __future__ import annotations

from dataclasses import dataclass, field

from mqgate.core.layout import Slot
from mqgate.core.queue_choice import lock_is_held
from mqgate.errors import BadRequest, NotFound
from mqgate.model import MODE_CLUSTER
from mqgate.services.consume import Consuming
from mqgate.services.context import Context, now_ms
from mqgate.services.topology import Topology

RESET_TARGETS = ("earliest", "latest", "offset", "timestamp")


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
class BacklogAlert:
    consumer: str
    topic: str
    lag: int
    threshold: int


class Operations:
    def __init__(self, ctx: Context, topology: Topology, consuming: Consuming) -> None:
        self.ctx = ctx
        self.topology = topology
        self.consuming = consuming

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
    ) -> ConsumerProgress:
        """Move committed offsets (re-consume or skip backlog), for every queue or one, for
        every broadcast client or one."""
        ctx = self.ctx
        c = await self.topology.consumer(name)
        layout = await self.topology.layout(c)
        bounds = await self.topology.bounds(layout)
        topic_queues = layout.queues * layout.lanes  # `queue` is a store queue of the topic
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
        for client in clients:
            if c.mode == MODE_CLUSTER or await ctx.offsets.table(name, client) is not None:
                await self.consuming.ensure_table(c, layout, client)
            if await ctx.offsets.table(name, client) is None:
                raise NotFound(f"consumer {name} has no clientId {client}", field="clientId")
            for b in bounds:
                if queue is not None and layout.slot(b.queue) != Slot(c.topic, queue, queue // layout.queues):
                    continue
                if to == "earliest":
                    target = b.min
                elif to == "latest":
                    target = b.max
                elif to == "offset":
                    assert offset is not None
                    target = min(max(offset, b.min), b.max)
                else:
                    assert timestamp_ms is not None
                    slot = layout.slot(b.queue)
                    target = await ctx.store.offset_for_time(slot.topic, slot.queue, timestamp_ms)
                await ctx.offsets.reset(name, client, b.queue, target)
        ctx.store.wake(c.topic)
        return await self.progress(name)

    async def alerts(self) -> list[BacklogAlert]:
        out = []
        for c in list(self.ctx.registry.snapshot.consumers.values()):
            if c.alert_backlog > 0:
                lag = (await self.progress(c.name)).lag
                if lag > c.alert_backlog:
                    out.append(BacklogAlert(c.name, c.topic, lag, c.alert_backlog))
        return out

    async def refresh_lag_metrics(self) -> None:
        for c in list(self.ctx.registry.snapshot.consumers.values()):
            await self.progress(c.name)
