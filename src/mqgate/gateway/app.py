"""Assembling a gateway from settings: backends, secrets, the ASGI app."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from mqgate.fsync import GroupCommitter
from mqgate.gateway.http import App, Router
from mqgate.gateway.metrics import Metrics
from mqgate.gateway.routes import Api
from mqgate.gateway.service import Gateway
from mqgate.offsets.backends.embedded import EmbeddedOffsetStore
from mqgate.registry.cache import RegistryCache
from mqgate.registry.sql import SqlRegistry
from mqgate.settings import Settings
from mqgate.store.backends.embedded import EmbeddedStore

log = logging.getLogger("mqgate")


def _read_or_create(path: Path, make: str, announce: str | None = None) -> str:
    """A secret kept in the data directory, created (mode 0600) on first start."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(make + "\n")
    if announce:
        print(announce.format(value=make, path=path), flush=True)
    return make


def admin_token_for(settings: Settings) -> str:
    if settings.admin_token:
        return settings.admin_token
    return _read_or_create(
        Path(settings.data_dir) / "admin.token",
        "mqa_" + secrets.token_urlsafe(32),
        "mqgate: generated admin token {value} (kept in {path}; set MQGATE_ADMIN_TOKEN to choose one)",
    )


def token_secret_for(settings: Settings) -> bytes:
    if settings.token_secret:
        return settings.token_secret.encode()
    return _read_or_create(Path(settings.data_dir) / "secret.key", secrets.token_hex(32)).encode()


def build_app(settings: Settings) -> App:
    """The ASGI app of one gateway process on the embedded backends."""
    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    committer = GroupCommitter(settings.fsync_interval_ms)
    store = EmbeddedStore(
        data_dir,
        broker=settings.broker_name,
        segment_bytes=settings.segment_bytes,
        committer=committer,
        checkpoint_interval_s=settings.checkpoint_interval_s,
    )
    offsets = EmbeddedOffsetStore(data_dir, committer)
    registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), settings.registry_refresh_s)
    metrics = Metrics()
    gateway = Gateway(settings, store, offsets, registry, token_secret_for(settings), metrics)
    api = Api(gateway, settings, admin_token_for(settings))

    async def startup() -> None:
        committer.start()
        await gateway.start()
        log.info("mqgate ready on %s:%s, data in %s", settings.host, settings.port, settings.data_dir)

    async def shutdown() -> None:
        await gateway.stop()
        await committer.stop()

    def observe(route: str, seconds: float, status: int) -> None:
        metrics.child(metrics.latency, route).observe(seconds)
        if status >= 400:
            metrics.child(metrics.errors, route, str(status)).inc()

    return App(
        Router(api.routes()),
        max_body_bytes=settings.max_request_bytes,
        on_startup=startup,
        on_shutdown=shutdown,
        observe=observe,
    )
