"""The scheduler of a store process (`mqgate serve --workers N` on the embedded store): every
call is carried out there, so each worker's delivery loop claims from the one schedule log,
and a claim keeps two workers from delivering the same destination."""

from __future__ import annotations

from mqgate.scheduler.interface import Destination, Due, SchedulerStats
from mqgate.storeproc.client import StoreClient
from mqgate.storeproc.wire import SCHEDULER


class RemoteScheduler:
    def __init__(self, client: StoreClient) -> None:
        self._client = client

    async def open(self) -> None:
        await self._client.connect()

    async def close(self) -> None:
        return None

    async def hold(
        self, items: list[tuple[bytes, list[Destination]]], keys: list[str] | None = None
    ) -> list[int]:
        # The store process's scheduler is the embedded one, which ignores hold keys.
        got: list[int] = await self._client.call(SCHEDULER, "hold", items)
        return got

    async def forget(self, keys: list[str]) -> None:
        return None

    async def claim_due(self, now_ms: int, limit: int, claim_ms: int) -> list[Due]:
        got: list[Due] = await self._client.call(SCHEDULER, "claim_due", now_ms, limit, claim_ms)
        return got

    async def settle(self, done: list[tuple[int, int]]) -> None:
        await self._client.call(SCHEDULER, "settle", done)

    async def next_due_ms(self) -> int | None:
        got: int | None = await self._client.call(SCHEDULER, "next_due_ms")
        return got

    async def wait(self, timeout_s: float) -> None:
        await self._client.call(SCHEDULER, "wait", timeout_s)

    async def held_for(self, target: str) -> int:
        got: int = await self._client.call(SCHEDULER, "held_for", target)
        return got

    async def stats(self) -> SchedulerStats:
        got: SchedulerStats = await self._client.call(SCHEDULER, "stats")
        return got
