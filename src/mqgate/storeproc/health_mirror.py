"""The store process's faults and degraded states, in each worker's own `Health`: a worker's
`/healthz` and metrics show what its storage is going through, as a single-process gateway's
do; and a store process that cannot be reached is itself a degraded state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from mqgate.errors import MqgateError
from mqgate.health import Health
from mqgate.storeproc.client import StoreClient
from mqgate.storeproc.wire import CONTROL

log = logging.getLogger(__name__)

UNREACHABLE: Final = "store_process"


class HealthMirror:
    def __init__(self, client: StoreClient, health: Health, every_s: float = 1.0) -> None:
        self._client = client
        self._health = health
        self._every_s = every_s
        self._seen: dict[tuple[str, str], int] = {}
        self._mirrored: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="store-process-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._every_s)

    async def poll(self) -> None:
        health = self._health
        try:
            snapshot: dict[str, Any] = await self._client.call(CONTROL, "health")
        except MqgateError as exc:
            health.degrade(UNREACHABLE, f"the store process cannot be reached: {exc}")
            return
        health.restore(UNREACHABLE)
        degraded: dict[str, str] = snapshot["degraded"]
        for condition, reason in degraded.items():
            health.degrade(condition, reason)
        for condition in self._mirrored - set(degraded):
            health.restore(condition)
        self._mirrored = set(degraded)
        for fault in snapshot["faults"]:
            key = (fault["component"], fault["kind"])
            count: int = fault["count"]
            seen = self._seen.get(key, 0)
            new = count - seen if count >= seen else count  # a restarted store process counts anew
            if new:
                health.fault(key[0], key[1], fault["last"], new)
            self._seen[key] = count
