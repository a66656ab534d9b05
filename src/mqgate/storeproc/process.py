"""The store process's life: open the embedded backends of the data directory (recovering
what a crash left), serve them, and close them in order on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from mqgate.backends import embedded_backends
from mqgate.health import Health
from mqgate.settings import Settings
from mqgate.storeproc.server import StoreServer
from mqgate.storeproc.wire import socket_path

log = logging.getLogger(__name__)


async def serve(
    settings: Settings,
    stop: asyncio.Event | None = None,
    parent_pid: int | None = None,
    health: Health | None = None,
) -> None:
    """Serve until `stop` is set (default: SIGTERM), or `parent_pid` is no longer this
    process's parent (the serve command was killed: its data directory must not stay locked
    by an orphan)."""
    health = health or Health()
    backends = embedded_backends(settings, health)
    await backends.start()
    store, offsets, scheduler = backends.store, backends.offsets, backends.scheduler
    await store.open()
    await offsets.open()
    await scheduler.open()
    server = StoreServer(store, offsets, scheduler, health)
    if stop is None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    orphan = None
    if parent_pid is not None:
        orphan = asyncio.get_running_loop().create_task(_stop_when_orphaned(parent_pid, stop))
    try:
        await server.start(socket_path(Path(settings.data_dir)))
        await stop.wait()
        log.info("store process stopping")
    finally:
        if orphan is not None:
            orphan.cancel()
        await server.stop()
        await scheduler.close()
        await offsets.close()
        await store.close()
        await backends.stop()


async def _stop_when_orphaned(parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    log.error("the serve command (pid %d) is gone: stopping", parent_pid)
    stop.set()
