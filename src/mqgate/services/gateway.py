"""One gateway process's data path and its lifecycle: recovery before intake, background jobs,
and the features it starts once the data path is ready (attached through services/observers.py;
built by the composition root, mqgate/app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any, Final

from mqgate.errors import MqgateError
from mqgate.model import MODE_BROADCAST
from mqgate.registry.cache import Removed
from mqgate.registry.records import Snapshot
from mqgate.services.browse import Browsing
from mqgate.services.changes import Changes
from mqgate.services.consume import Consuming
from mqgate.services.context import Context, now_ms
from mqgate.services.deadletters import DeadLetters
from mqgate.services.logread import LogReading
from mqgate.services.messages import MessageConsuming
from mqgate.services.observers import Observers
from mqgate.services.operations import Operations
from mqgate.services.produce import Producing, SpoolSink
from mqgate.services.qos import DeliveryLoop
from mqgate.services.topology import Topology

log = logging.getLogger(__name__)

# Signals a server stops on (uvicorn's): shutdown starts with answering the waiting pulls.
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


class Feature:
    """A part of the platform the gateway starts after the data path is ready and stops
    before it (tracing, queue state, ...). Every method a no-op here."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def registry_changed(self, changed: Snapshot, removed: Removed) -> None:
        """Registrations changed (on this gateway or, seen at a refresh, on another)."""


class Gateway:
    def __init__(
        self,
        ctx: Context,
        topology: Topology | None = None,
        observers: Observers | None = None,
        *,
        features: Sequence[Feature] = (),
        spool: SpoolSink | None = None,
    ) -> None:
        """`topology`, `observers`: those the features were built with (None: the data path
        alone); `features`: started in this order once the data path is ready, stopped in
        reverse; `spool`: where produces go that a project's cluster cannot take."""
        self.ctx = ctx
        self.observers = observers = observers or Observers()
        self.topology = topology = topology or Topology(ctx)
        self.producing = Producing(ctx, self.topology, observers, spool)
        self.consuming = Consuming(ctx, self.topology, observers)
        self.log_reading = LogReading(ctx, self.topology, self.consuming)
        self.messages = MessageConsuming(ctx, self.topology, self.consuming, observers)
        # What moved in the store and the offsets, for the lag gauges and the alert checks.
        self.changes = Changes(ctx.store, ctx.offsets)
        self.operations = Operations(ctx, self.topology, self.consuming, self.changes)
        self.dead_letters = DeadLetters(ctx, self.topology, self.producing)
        self.browsing = Browsing(ctx, self.log_reading)
        self.features = tuple(features)
        self._tasks: list[asyncio.Task[None]] = []
        self._chained: list[tuple[int, Any, Any]] = []  # (signal, our handler, the one before)

    async def start(self) -> None:
        ctx = self.ctx
        await ctx.store.open()
        await ctx.offsets.open()
        # Recovery of held messages completes before intake and delivery start (SPEC S6).
        await ctx.scheduler.open()
        await ctx.registry.start()
        self.changes.registry_changed(ctx.registry.snapshot, Removed())
        await self.topology.sync(ctx.registry.snapshot)
        for feature in self.features:
            await feature.start()
        ctx.registry.on_change = self._registry_changed
        delivery = DeliveryLoop(
            ctx.scheduler,
            self.producing.deliver_due,
            self.producing.expired_before_delivery,
            lambda detail: ctx.health.fault("background", "delivery", detail),
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
            loop.create_task(self.operations.keep_lag_gauges(), name="lag-gauges"),
        ]
        self._chain_stop_signals(loop)

    def begin_shutdown(self) -> None:
        """The process is stopping: answer waiting pulls now (NO_NEW_MSG) and let no new pull
        wait, so the server's drain of open requests ends at once instead of timing out."""
        if not self.consuming.closing:
            log.info("shutting down: answering waiting pulls")
        self.consuming.stop_waiting()

    def _chain_stop_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hear the server's stop signals first. The server (uvicorn) waits for open requests
        before it tells the app to shut down, and a long poll is an open request: without
        this, SIGTERM waited out every long poll (then cut them off with 500s)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            previous = signal.getsignal(sig)
            if not callable(previous):  # no server handles it: the default ends the process
                continue

            def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits
                    loop.call_soon_threadsafe(self.begin_shutdown)
                previous(signum, frame)

            signal.signal(sig, handler)
            self._chained.append((sig, handler, previous))

    def _unchain_stop_signals(self) -> None:
        for sig, handler, previous in self._chained:
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous)
        self._chained = []

    async def _registry_changed(self, changed: Snapshot, removed: Removed) -> None:
        for feature in self.features:
            await feature.registry_changed(changed, removed)
        self.topology.forget(removed)
        for name in removed.consumers:
            self.consuming.forget(name)
        # Their lag gauges are recomputed soon (a deleted consumer's goes); a store topic the
        # sync makes tells its move too.
        self.changes.registry_changed(changed, removed)
        await self.topology.sync(changed)

    async def stop(self) -> None:
        self._unchain_stop_signals()
        self.begin_shutdown()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ctx = self.ctx
        for feature in reversed(self.features):
            await feature.stop()
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
                self.ctx.health.fault("background", job.__name__.strip("_"), exc.message)
            except Exception as exc:
                log.exception("background job %s failed", job.__name__)
                self.ctx.health.fault("background", job.__name__.strip("_"), repr(exc))

    async def _retention(self) -> None:
        await self.ctx.store.enforce_retention(now_ms())

    async def _expire_clients(self) -> None:
        cutoff = now_ms() - int(self.ctx.settings.broadcast_client_ttl_s * 1000)
        for c in list(self.ctx.registry.snapshot.consumers.values()):
            if c.mode == MODE_BROADCAST:
                await self.ctx.offsets.expire_clients(c.name, cutoff)
