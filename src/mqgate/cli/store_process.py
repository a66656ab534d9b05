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
from typing import Final

from mqgate.backends import embedded_backends
from mqgate.errors import StorageError
from mqgate.health import Health
from mqgate.settings import Settings, load_settings
from mqgate.store.backends.embedded.store import DATA_DIR_IN_USE
from mqgate.store.interface import MessageStore
from mqgate.storeproc.server import StoreServer
from mqgate.storeproc.wire import socket_path

log = logging.getLogger(__name__)

# How long a new store process waits for the data directory's previous owner to let go.
LOCK_WAIT_S: Final = 10.0
PR_SET_PDEATHSIG: Final = 1  # prctl(2)


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
    store, offsets, scheduler = backends.store, backends.offsets, backends.scheduler
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    orphan = None
    if parent_pid is not None:
        orphan = loop.create_task(_stop_when_orphaned(parent_pid, stop))
    server = StoreServer(store, offsets, scheduler, health)
    await backends.start()
    try:
        await _open_when_free(store, loop.time() + LOCK_WAIT_S)
        await offsets.open()
        await scheduler.open()
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


async def _open_when_free(store: MessageStore, deadline: float) -> None:
    """Open the store; while another process holds the data directory (the store process of a
    serve command killed a moment ago, closing its files), wait for it, up to `deadline`."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await store.open()
            return
        except StorageError as exc:
            if exc.code != DATA_DIR_IN_USE or loop.time() > deadline:
                raise
            log.warning("%s: waiting for it to be let go", exc)
            await asyncio.sleep(0.1)


async def _stop_when_orphaned(parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    log.error("the serve command (pid %d) is gone: stopping", parent_pid)
    stop.set()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m mqgate.cli.store_process")
    parser.add_argument("--parent", type=int, help="stop when this process is gone (the serve command)")
    args = parser.parse_args()
    if args.parent is not None:
        _die_with_parent(args.parent)
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


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM at once when the serve command dies (Linux), so a restarted one finds the data
    directory free; elsewhere the parent is looked for every second."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # gone before the line above
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
