"""The store process `mqgate serve --workers N` starts on the embedded store
(`python -m mqgate.cli.store_process`): it opens the embedded backends of the data directory
(recovering what a crash left), serves them to the workers (storeproc/server.py) until SIGTERM
or until the serve command is gone, then closes them in order (the last group commit round
written and synced). Settings from MQGATE_*, as its workers'."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from mqgate.backends import embedded_backends
from mqgate.health import Health
from mqgate.settings import Settings, load_settings
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


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m mqgate.cli.store_process")
    parser.add_argument("--parent", type=int, help="stop when this process is gone (the serve command)")
    args = parser.parse_args()
    settings = load_settings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s store-process %(levelname)s %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C is for the serve command
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency of the plain install
        pass
    asyncio.run(serve(settings, parent_pid=args.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
