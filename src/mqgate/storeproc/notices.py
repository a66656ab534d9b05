"""Registry changes announced between the workers of one gateway through their store process
(the Redis store's workers use Redis pub/sub): a revoked token or a deleted consumer takes
effect on every worker at once, not after the next refresh."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mqgate.storeproc.client import StoreClient


class StoreProcessNotices:
    def __init__(self, client: StoreClient) -> None:
        self._client = client

    async def start(self, on_notice: Callable[[int], Awaitable[None]]) -> None:
        await self._client.listen(on_notice)

    async def announce(self, version: int) -> None:
        await self._client.announce(version)

    async def stop(self) -> None:
        return None
