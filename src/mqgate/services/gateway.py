"""One gateway process's services and their lifecycle: recovery before intake, background jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from mqgate.errors import MqgateError
from mqgate.model import MODE_BROADCAST
from mqgate.services.browse import Browsing
from mqgate.services.consume import Consuming
from mqgate.services.context import Context, now_ms
from mqgate.services.deadletters import DeadLetters
from mqgate.services.logread import LogReading
from mqgate.services.operations import Operations
from mqgate.services.produce import Producing
from mqgate.services.qos import DeliveryLoop
from mqgate.services.topology import Topology

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.topology = Topology(ctx)
        self.producing = Producing(ctx, self.topology)
        self.consuming = Consuming(ctx, self.topology)
        self.log_reading = LogReading(ctx, self.topology, self.consuming)
        self.operations = Operations(ctx, self.topology, self.consuming)
        self.dead_letters = DeadLetters(ctx, self.topology, self.producing)
        self.browsing = Browsing(ctx, self.log_reading)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        ctx = self.ctx
        await ctx.store.open()
        await ctx.offsets.open()
        # Recovery of held messages completes before intake and delivery start (SPEC S6).
        await ctx.scheduler.open()
        await ctx.registry.start()
        await self.topology.sync(ctx.registry.snapshot)
        ctx.registry.on_change = self.topology.sync
        delivery = DeliveryLoop(
            ctx.scheduler, self.producing.deliver_due, self.producing.expired_before_delivery
        )
        loop = asyncio.get_running_loop()
        settings = ctx.settings
        self._tasks = [
            loop.create_task(delivery.run(), name="delivery"),
            loop.create_task(self._every(settings.retention_check_s, self._retention), name="retention"),
            loop.create_task(
                self._every(min(settings.broadcast_client_ttl_s / 10, 60.0), self._expire_clients),
                name="expire-clients",
            ),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ctx = self.ctx
        ctx.registry.on_change = None
        await ctx.registry.stop()
        await ctx.scheduler.close()
        await ctx.offsets.close()
        await ctx.store.close()

    async def _every(self, seconds: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except MqgateError as exc:  # e.g. Redis briefly down: try again next round
                log.warning("background job %s: %s", job.__name__, exc.message)
            except Exception:
                log.exception("background job %s failed", job.__name__)

    async def _retention(self) -> None:
        await self.ctx.store.enforce_retention(now_ms())

    async def _expire_clients(self) -> None:
        cutoff = now_ms() - int(self.ctx.settings.broadcast_client_ttl_s * 1000)
        for c in list(self.ctx.registry.snapshot.consumers.values()):
            if c.mode == MODE_BROADCAST:
                await self.ctx.offsets.expire_clients(c.name, cutoff)
