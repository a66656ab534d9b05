"""The composition root: one gateway process built from settings by constructor injection
(backends, the data path, each feature attached through the data path's observers, the API and
the console on one ASGI app) and the background work it starts and stops. Nothing imports it
but the entry points (`mqgate serve`, `mqgate.app.create_app`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from mqgate.accesskeys.service import AccessKeys
from mqgate.alerts.service import Alerts
from mqgate.aliyun.detect import is_aliyun_request
from mqgate.api import protocol
from mqgate.api.auth import RoleGuard
from mqgate.api.collector import tune_for_serving
from mqgate.api.http import ApiDoor
from mqgate.api.limits import SettingsLimits
from mqgate.api.openapi import with_document
from mqgate.api.routes_access_keys import AccessKeyRoutes
from mqgate.api.routes_admin import AdminRoutes
from mqgate.api.routes_alerts import AlertRoutes
from mqgate.api.routes_clusters import ClusterRoutes
from mqgate.api.routes_data import DataRoutes
from mqgate.api.routes_dlq import DeadLetterRoutes
from mqgate.api.routes_half import HalfRoutes
from mqgate.api.routes_log import LogRoutes
from mqgate.api.routes_messages import MessageRoutes
from mqgate.api.routes_projects import ProjectRoutes
from mqgate.api.routes_purge import PurgeRoutes
from mqgate.api.routes_push import PushRoutes
from mqgate.api.routes_stream import StreamRoutes
from mqgate.backends import Backends, backends_for
from mqgate.console.api_audit import audited_routes
from mqgate.console.app import build_console
from mqgate.console.passwords import dummy_hash
from mqgate.failover.pool import ClusterPool
from mqgate.failover.routed import RoutedOffsets, RoutedStore
from mqgate.failover.routing import ClusterRouter
from mqgate.failover.service import Failover
from mqgate.health import Health
from mqgate.metrics import Metrics
from mqgate.metrics_history import MetricsHistory
from mqgate.platform import Platform
from mqgate.preparation import admin_token_for, open_registry, token_secret_for
from mqgate.projects.service import Projects
from mqgate.push.service import PushService
from mqgate.queuestate.service import QueueState
from mqgate.registry.cache import RegistryCache
from mqgate.registry.sql import SqlRegistry
from mqgate.services.context import Context
from mqgate.services.gateway import Gateway
from mqgate.services.observers import Observers
from mqgate.services.topology import Topology
from mqgate.settings import STORE_PROCESS_ENV, Settings, load_settings
from mqgate.sqs.detect import is_sqs_request
from mqgate.tracing.lookup import TraceLookup
from mqgate.tracing.service import Tracing
from mqgate.transactions.service import HalfMessages
from mqgate.web.app import Site, WebApp
from mqgate.web.asgi import ASGIApp
from mqgate.web.lazy import MadeOnFirstRequest

log = logging.getLogger("mqgate")


class Built(msgspec.Struct, frozen=True):
    """What build_site made: the ASGI app, its two doors, and the platform they serve."""

    site: Site
    api: WebApp
    console: WebApp
    platform: Platform


class Core(msgspec.Struct, frozen=True):
    """What the data path stands on: the registry database, the backends, the cluster pool and
    the router every store call goes through, and the context that holds them."""

    sql: SqlRegistry
    backends: Backends
    pool: ClusterPool
    router: ClusterRouter
    ctx: Context


def build_core(settings: Settings) -> Core:
    """The parts below the data path (the in-process failover tests build on them too)."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    sql = open_registry(settings)
    secret = token_secret_for(settings, sql)
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
    return Core(sql, backends, pool, router, ctx)


def build_site(settings: Settings) -> Built:
    """The ASGI app of one gateway process, with its parts (for tests and tools)."""
    protocol.configure(settings.header_timeout_s, settings.max_header_count, settings.max_header_bytes)
    core = build_core(settings)
    sql, backends, pool, router, ctx = core.sql, core.backends, core.pool, core.router, core.ctx
    metrics = ctx.metrics
    admin_token = admin_token_for(settings, sql)
    # Features reach the data path through its observers; the data path knows none of them.
    observers = Observers()
    topology = Topology(ctx)
    tracing = Tracing(ctx, topology, observers)
    queue_state = QueueState(ctx)
    observers.attach(queue_state)
    projects = Projects(ctx, topology)
    metrics_history = MetricsHistory(ctx)

    def switched(*args: Any, **kwargs: Any) -> None:
        alerts.event(*args, **kwargs)  # made below with the gateway it checks, before any start

    failover = Failover(ctx, sql.engine, router, pool, on_event=switched, on_resent=tracing.observer.resent)
    gateway = Gateway(
        ctx,
        topology,
        observers,
        # Trace topics exist before tracing starts; tracing before intake.
        features=(projects, tracing, queue_state, metrics_history),
        spool=failover,
    )
    queue_state.follow(gateway.changes)
    alerts = Alerts(gateway, sql.engine)
    push = PushService(gateway, settings, metrics)
    platform = Platform(
        gateway,
        tracing,
        TraceLookup(ctx, topology, tracing),
        queue_state,
        projects,
        metrics_history,
        alerts,
        failover,
        push,
    )
    limits = SettingsLimits(settings)
    access_keys = AccessKeys(sql.engine, ctx.secret)
    halves = HalfMessages(gateway)  # half messages of both doors: the native routes and Aliyun's
    routes = [
        *DataRoutes(gateway).routes(),
        *MessageRoutes(gateway).routes(),
        *HalfRoutes(gateway, halves).routes(),
        *LogRoutes(gateway).routes(),
        *AdminRoutes(gateway, limits, failover.stranded).routes(),
        *DeadLetterRoutes(gateway).routes(),
        *PurgeRoutes(gateway).routes(),
        *ProjectRoutes(platform).routes(),
        *AlertRoutes(alerts).routes(),
        *ClusterRoutes(failover).routes(),
        *AccessKeyRoutes(access_keys, gateway).routes(),
        *PushRoutes(gateway, push).routes(),
        *StreamRoutes(gateway).routes(),
    ]
    routes = audited_routes(routes, gateway, sql.engine)  # every admin change in the audit log
    routes = with_document(routes, settings)
    guard = RoleGuard(admin_token, gateway.topology, gateway.consuming)

    async def startup() -> None:
        await backends.start()
        await gateway.start()
        await failover.start()
        await alerts.start()
        await push.start()
        # Beside the first requests, not before them: 0.1 s of scrypt a sign-in of an unknown
        # name checks against (console/passwords.py).
        asyncio.get_running_loop().run_in_executor(None, dummy_hash)
        log.info("mqgate ready on %s:%s, store %s", settings.host, settings.port, settings.store)

    # The compatibility edges are made, their modules imported, at their first request.
    stopping: list[Callable[[], Awaitable[None]]] = []

    def sqs_edge() -> ASGIApp:
        from mqgate.sqs.edge import SqsEdge
        from mqgate.sqs.service import SqsService
        from mqgate.sqs.tables import QueueTable

        service = SqsService(gateway, QueueTable(sql.engine))
        stopping.append(service.move_tasks.stop)
        return SqsEdge(service, access_keys, metrics)

    def aliyun_edge() -> ASGIApp:
        from mqgate.aliyun.edge import AliyunEdge
        from mqgate.aliyun.service import AliyunService

        return AliyunEdge(
            AliyunService(gateway, max_body_bytes=settings.max_message_bytes, halves=halves),
            access_keys,
            metrics,
            max_publish_bytes=6 * settings.max_message_bytes + 64 * 1024,  # escapes: at most 5 bytes a byte
        )

    async def shutdown() -> None:
        await push.stop()
        for stop in stopping:
            await stop()
        await alerts.stop()
        await failover.stop()
        await gateway.stop()
        await backends.stop()

    def observe(route: str, seconds: float, status: int) -> None:
        metrics.child(metrics.latency, route).observe(seconds)
        if status >= 400:
            metrics.child(metrics.errors, route, str(status)).inc()

    api = WebApp(
        ApiDoor(guard, limits, max_body_bytes=settings.max_request_bytes),
        routes,
        observe=observe,
        role_limits={
            "admin": settings.max_concurrent_admin_requests,
            "reader": settings.max_concurrent_read_requests,
        },
    )
    console = build_console(platform, settings, sql.engine)
    site = Site(
        api,
        mounts={console.mount: console},
        home=console.mount + "/",
        on_startup=startup,
        on_shutdown=shutdown,
        edges=[
            (is_sqs_request, MadeOnFirstRequest(sqs_edge)),
            (is_aliyun_request, MadeOnFirstRequest(aliyun_edge)),
        ],
    )
    return Built(site, api, console, platform)


def build_app(settings: Settings) -> Site:
    """The ASGI app of one gateway process."""
    return build_site(settings).site


def create_app() -> Site:
    """Entry point for ASGI servers that import the app by name (`mqgate serve --workers N`
    starts each worker here): settings from `MQGATE_*`."""
    tune_for_serving()
    settings = load_settings()
    store_process = os.environ.get(STORE_PROCESS_ENV)
    if store_process and not settings.uses_redis:
        settings = dataclasses.replace(settings, store_process=store_process)
    return build_app(settings)
