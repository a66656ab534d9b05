"""A store process's server in the test's own event loop, over a data directory: what a
worker of `mqgate serve --workers N` reaches, for the backend contract suites."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from mqgate.cli.store_process import serve
from mqgate.health import Health
from mqgate.settings import Settings
from mqgate.storeproc.client import StoreClient
from mqgate.storeproc.wire import socket_path


class Served:
    def __init__(self, data_dir: Path, **settings: Any) -> None:
        self.settings = Settings(data_dir=data_dir, **settings)
        self.path = socket_path(data_dir)
        self.clients: list[StoreClient] = []
        self.health: Health | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Served:
        self.path.unlink(missing_ok=True)
        self._stop = asyncio.Event()
        self.health = Health()
        self._task = asyncio.create_task(serve(self.settings, self._stop, health=self.health))
        deadline = time.monotonic() + 30
        while not self.path.exists():  # made (renamed into place) once the backends are open
            if self._task.done():
                self._task.result()
            assert time.monotonic() < deadline, "the store server did not start within 30 s"
            await asyncio.sleep(0.005)
        return self

    async def client(self) -> StoreClient:
        client = StoreClient(self.path)
        await client.connect()
        self.clients.append(client)
        return client

    async def stop(self) -> None:
        for client in self.clients:
            await client.close()
        self.clients = []
        if self._stop is not None and self._task is not None:
            self._stop.set()
            await self._task
        self._stop = self._task = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()
