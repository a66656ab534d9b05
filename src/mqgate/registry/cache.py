"""Each gateway's copy of the registry, refreshed periodically and at once after its own changes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from mqgate.errors import MqgateError
from mqgate.registry.records import ConsumerRecord, ProducerRecord, Snapshot, TopicRecord
from mqgate.registry.sql import SqlRegistry

log = logging.getLogger(__name__)

MISS_REFRESH_S: Final = 0.2


class RegistryCache:
    def __init__(self, registry: SqlRegistry, refresh_s: float) -> None:
        self.registry = registry
        self.refresh_s = refresh_s
        self.snapshot = Snapshot(0, {}, {}, {})
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._miss_refresh_at = 0.0
        # Called with each new snapshot (e.g. to make the store topics of new registrations).
        self.on_change: Callable[[Snapshot], Awaitable[None]] | None = None
        self.on_change_failures = 0

    async def start(self) -> None:
        await asyncio.to_thread(self.registry.create_schema)
        await self.refresh(force=True)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="registry-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.registry.dispose)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except MqgateError as exc:
                log.warning("registry refresh failed, keeping the cached copy: %s", exc.message)

    async def refresh(self, force: bool = False) -> bool:
        """Reload if the registry's version moved; True if it did."""
        async with self._lock:
            if not force:
                ver = await asyncio.to_thread(self.registry.version)
                if ver == self.snapshot.version:
                    return False
            self.snapshot = await asyncio.to_thread(self.registry.snapshot)
            if self.on_change is not None:
                try:
                    await self.on_change(self.snapshot)
                except MqgateError as exc:  # e.g. Redis briefly down: the next change retries
                    self.on_change_failures += 1
                    log.warning(
                        "applying registry version %d failed (%d so far): %s",
                        self.snapshot.version,
                        self.on_change_failures,
                        exc.message,
                    )
            return True

    async def refresh_on_miss(self) -> bool:
        """A name was not found: maybe it was just registered through another gateway. Look
        (at most every MISS_REFRESH_S, so unknown names cannot flood the database)."""
        now = time.monotonic()
        if now - self._miss_refresh_at < MISS_REFRESH_S:
            # A look just started or just ended: wait for it rather than answer "unknown".
            async with self._lock:
                return True
        self._miss_refresh_at = now
        await self.refresh()
        return True

    async def change(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Apply a change through the registry and refresh this gateway's copy at once."""
        await asyncio.to_thread(getattr(self.registry, method), *args, **kwargs)
        await self.refresh(force=True)

    def topic(self, name: str) -> TopicRecord | None:
        return self.snapshot.topics.get(name)

    def producer(self, name: str) -> ProducerRecord | None:
        return self.snapshot.producers.get(name)

    def consumer(self, name: str) -> ConsumerRecord | None:
        return self.snapshot.consumers.get(name)
