"""`mqgate serve`: run a gateway (uvicorn), with settings from a TOML file, flags and MQGATE_*."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from mqgate.settings import ENV_PREFIX, load_settings

SERVE_FLAGS = ("host", "port", "data_dir", "fsync", "store", "registry", "workers")


def add_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run a gateway",
        description="Run a gateway. Settings: defaults, then a TOML file (--config or $MQGATE_CONFIG), "
        "then MQGATE_* environment variables, then these flags.",
    )
    serve.add_argument("--config", help="TOML settings file")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    serve.add_argument(
        "--data-dir", help="logs, offsets journal, SQLite registry and secrets (default ./data)"
    )
    serve.add_argument("--fsync", help="always (default) or interval:<ms>")
    serve.add_argument("--store", help="embedded (default) or a Redis URL, e.g. redis://127.0.0.1:6379/0")
    serve.add_argument("--registry", help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db")
    serve.add_argument(
        "--workers",
        type=int,
        help="gateway processes on this port (embedded store: beside a store process owning its files)",
    )
    serve.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mqgate.api.collector import collector_off_while_starting, serving_collector

    # The start makes hundreds of thousands of long-lived objects (modules, the app) and almost
    # no garbage: the collector, on by default, spent 50-60 ms of it walking them.
    collector_off_while_starting()
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from mqgate.api.protocol import PROTOCOL_PATH
    from mqgate.preparation import prepare

    flags = {name: getattr(args, name) for name in SERVE_FLAGS}
    settings = load_settings(Path(args.config) if args.config else None, **flags)
    prepare(settings)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": PROTOCOL_PATH,  # httptools with bounded headers
        "ws": "websockets-sansio",  # WebSocket streams (docs/STREAM.md)
        "ws_max_size": 64 * 1024,  # a client sends acks over it, ~200 bytes each
        "lifespan": "on",
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
        "log_level": settings.log_level,
        "timeout_graceful_shutdown": 5,
    }
    if settings.workers == 1:
        from mqgate.app import build_app

        config = uvicorn.Config(build_app(settings), **options)
        sock = listening(config)
        server = uvicorn.Server(config)
        serving_collector()
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
        return 0 if server.started else STARTUP_FAILURE
    # This process only watches its workers: each imports the app for itself, this one never.
    serving_collector()
    # Worker processes build their app from the environment: hand them the same settings.
    if args.config:
        os.environ[ENV_PREFIX + "CONFIG"] = str(Path(args.config).resolve())
    for name, value in flags.items():
        if value is not None:
            os.environ[ENV_PREFIX + name.upper()] = str(value)
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(f"{__name__}:worker_app", factory=True, workers=settings.workers, **options)
    sock = listening(config)  # before the store process starts
    store_process = None
    if not settings.uses_redis:
        from mqgate.cli.store_supervisor import StoreProcess
        from mqgate.settings import STORE_PROCESS_ENV

        # One process owns the data directory's files; the workers call it (docs/WORKERS.md).
        store_process = StoreProcess(Path(settings.data_dir))
        store_process.start()
        os.environ[STORE_PROCESS_ENV] = str(store_process.path)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            Multiprocess(config, sockets=[sock]).run()
    finally:
        if store_process is not None:
            store_process.stop()
    return 0


def worker_app() -> Any:
    """A worker's app (`--workers N`: uvicorn imports this by name in each worker process),
    imported and built with the collector off, as in a one-process start."""
    from mqgate.api.collector import collector_off_while_starting, serving_collector

    collector_off_while_starting()
    from mqgate.app import create_app

    site = create_app()
    serving_collector()
    return site


def listening(config: Any) -> Any:
    """The server's socket, bound and listening before the app starts: a port in use fails at
    once (exit 3), before the store is opened or recovered, and no client is answered by another
    server while this one starts. Listening too, not only bound: two sockets with SO_REUSEADDR
    may both bind a port no one listens on yet, and the second server's listen would then fail
    after its start (silently, with uvloop: a gateway that never serves)."""
    from uvicorn.config import STARTUP_FAILURE

    sock = config.bind_socket()
    try:
        sock.listen(config.backlog)
    except OSError as exc:
        logging.getLogger("uvicorn.error").error(exc)
        sys.exit(STARTUP_FAILURE)
    return sock
