"""Registry changes announced to every gateway at once, over Redis pub/sub.

Each gateway still refreshes its copy every `registry_refresh_s`; the notice only makes a
change (a revoked token, a deleted consumer) take effect on the other gateways within a
Redis round trip instead of that period. A notice lost while a gateway's listener was
reconnecting is made up by a refresh on reconnect, and in any case by the periodic one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from mqgate import redisio


class RedisRegistryNotices:
    def __init__(self, client: redisio.RedisClient, prefix: str) -> None:
        self._client = client
        self.channel = f"{prefix}:registry"
        self.listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, on_notice: Callable[[int], Awaitable[None]]) -> None:
        """Call `on_notice(version)` for each change announced by any gateway."""

        async def heard(_channel: bytes, data: bytes) -> None:
            with contextlib.suppress(ValueError):
                await on_notice(int(data))

        async def reconnected() -> None:
            await on_notice(-1)  # notices were lost meanwhile: look anyway

        self._task = asyncio.get_running_loop().create_task(
            redisio.listen_forever(
                self._client, self.channel, heard, reconnected, self.listening, "registry notices"
            ),
            name="registry-notices",
        )

    async def announce(self, version: int) -> None:
        """Tell every gateway the registry reached `version`. Best effort: a notice that cannot
        be sent is made up by the periodic refresh."""
        with contextlib.suppress(Exception):
            await self._client.execute_command("PUBLISH", self.channel, str(version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
