"""Assembling a gateway from settings: backends, secrets, the ASGI app."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path

import msgspec

from mqgate.api import protocol
from mqgate.api.auth import RoleGuard
from mqgate.api.http import App, Router
from mqgate.api.limits import SettingsLimits
from mqgate.api.openapi import build_openapi
from mqgate.api.routes_admin import AdminRoutes
from mqgate.api.routes_alerts import AlertRoutes
from mqgate.api.routes_clusters import ClusterRoutes
from mqgate.api.routes_data import DataRoutes
from mqgate.api.routes_dlq import DeadLetterRoutes
from mqgate.api.routes_log import LogRoutes
from mqgate.api.routes_projects import ProjectRoutes
from mqgate.backends import backends_for
from mqgate.clusters.pool import ClusterPool
from mqgate.clusters.routed import RoutedOffsets, RoutedStore
from mqgate.clusters.routing import ClusterRouter
from mqgate.console.api_audit import audited_routes
from mqgate.console.app import build_console
from mqgate.errors import StorageError
from mqgate.health import Health
from mqgate.metrics import Metrics
from mqgate.registry.cache import RegistryCache
from mqgate.registry.sql import SqlRegistry
from mqgate.services.alerts import Alerts
from mqgate.services.context import Context
from mqgate.services.failover import Failover
from mqgate.services.gateway import Gateway
from mqgate.settings import Settings

log = logging.getLogger("mqgate")


def _shared_secret(registry: SqlRegistry, name: str, path: Path, make: str, announce: str = "") -> str:
    """A secret shared by every gateway through the registry, with a copy in the data directory
    (mode 0600) for the CLI. An existing copy from an older version becomes the shared value."""
    try:
        local: str | None = path.read_text().strip()
    except FileNotFoundError:
        local = None
    value = registry.shared_secret(name, local or make)
    if value != local:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
        os.replace(tmp, path)
        if announce and value == make:
            print(announce.format(value=value, path=path), flush=True)
    return value


def admin_token_for(settings: Settings, registry: SqlRegistry) -> str:
    if settings.admin_token:
        return settings.admin_token
    return _shared_secret(
        registry,
        "admin_token",
        Path(settings.data_dir) / "admin.token",
        "mqa_" + secrets.token_urlsafe(32),
        "mqgate: generated admin token {value} (kept in {path}; set MQGATE_ADMIN_TOKEN to choose one)",
    )


def token_secret_for(settings: Settings, registry: SqlRegistry) -> bytes:
    if settings.token_secret:
        return settings.token_secret.encode()
    return _shared_secret(
        registry, "ack_secret", Path(settings.data_dir) / "secret.key", secrets.token_hex(32)
    ).encode()


def stored_data(settings: Settings) -> list[Path]:
    """Files of the embedded backends that hold data (messages, consumer offsets)."""
    if settings.uses_redis:
        return []
    root = Path(settings.data_dir)
    candidates = [*root.glob("topics/*/*/*.log"), root / "offsets" / "journal.log"]
    return [p for p in candidates if p.is_file() and p.stat().st_size > 0]


def open_registry(settings: Settings) -> SqlRegistry:
    """The registry, its tables created; refused when it is empty while the data directory
    holds data: a lost or truncated registry must not start as a new one (every name would
    answer 404 and new registrations would reuse the old data's names)."""
    registry = SqlRegistry(settings.resolved_registry_url())
    try:
        data = stored_data(settings)
        if data and registry.is_empty():
            raise StorageError(
                f"the registry ({settings.resolved_registry_url()}) holds no topics, but the data "
                f"directory {settings.data_dir} holds data ({len(data)} files, e.g. {data[0]}): "
                "refusing to start as new. Restore the registry (registry.db) from a backup, or "
                "move the data directory away to start afresh; `mqgate check` reports what is there."
            )
        registry.create_schema()
    except BaseException:
        registry.dispose()
        raise
    return registry


def prepare(settings: Settings) -> None:
    """Checks and one-time setup before any gateway process starts: fail early and clearly."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    if settings.uses_redis:
        from mqgate import redisio  # an extra: only a Redis store needs it

        asyncio.run(redisio.check_reachable(settings.store))
    registry = open_registry(settings)
    try:
        admin_token_for(settings, registry)
        token_secret_for(settings, registry)
    finally:
        registry.dispose()


def build_app(settings: Settings) -> App:
    """The ASGI app of one gateway process."""
    protocol.configure(settings.header_timeout_s, settings.max_header_count, settings.max_header_bytes)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    sql = open_registry(settings)
    secret = token_secret_for(settings, sql)
    admin_token = admin_token_for(settings, sql)
    metrics = Metrics()
    health = Health(metrics.registry)
    backends = backends_for(settings, health)
    registry = RegistryCache(sql, settings.registry_refresh_s, backends.notices)
    # Every store call goes through the router: a project with clusters is served by its active
    # one (SPEC P8); everything else by the gateway's own store.
    pool = ClusterPool(
        settings,
        settings.detection_rules(),
        probe_interval_s=settings.failover_probe_interval_s,
        probe_timeout_s=settings.failover_probe_timeout_s,
    )
    router = ClusterRouter(backends.store, backends.offsets, pool, lambda: registry.snapshot)
    ctx = Context(
        settings,
        RoutedStore(router),
        RoutedOffsets(router),
        backends.scheduler,
        registry,
        metrics,
        secret,
        health,
    )
    gateway = Gateway(ctx)
    failover = Failover(ctx, sql.engine, router, pool)
    gateway.producing.failover = failover
    failover.on_resent = gateway.producing.traces.resent
    limits = SettingsLimits(settings)
    alerts = Alerts(gateway, sql.engine)
    failover.on_event = alerts.event
    log_routes = LogRoutes(gateway)
    routes = [
        *DataRoutes(gateway).routes(),
        *log_routes.routes(),
        *AdminRoutes(gateway, limits).routes(),
        *DeadLetterRoutes(gateway).routes(),
        *ProjectRoutes(gateway).routes(),
        *AlertRoutes(alerts).routes(),
        *ClusterRoutes(failover).routes(),
    ]
    routes = audited_routes(routes, gateway, sql.engine)  # every admin change in the audit log
    log_routes.openapi_bytes = msgspec.json.encode(build_openapi(routes, settings))
    guard = RoleGuard(admin_token, gateway.topology, gateway.consuming)

    async def startup() -> None:
        await backends.start()
        await gateway.start()
        await failover.start()
        await alerts.start()
        log.info("mqgate ready on %s:%s, store %s", settings.host, settings.port, settings.store)

    async def shutdown() -> None:
        await alerts.stop()
        await failover.stop()
        await gateway.stop()
        await backends.stop()

    def observe(route: str, seconds: float, status: int) -> None:
        metrics.child(metrics.latency, route).observe(seconds)
        if status >= 400:
            metrics.child(metrics.errors, route, str(status)).inc()

    console = build_console(gateway, settings, sql.engine, alerts=alerts)
    return App(
        Router(routes),
        guard,
        limits,
        max_body_bytes=settings.max_request_bytes,
        on_startup=startup,
        on_shutdown=shutdown,
        observe=observe,
        console=console,
    )
