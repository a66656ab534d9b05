"""Building a store's backends (message store, offset store, scheduler) from settings: the
gateway's own, and each failover cluster's (failover/pool.py)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from mqgate.durable.group_commit import GroupCommitter
from mqgate.health import Health
from mqgate.offsets.backends.embedded import EmbeddedOffsetStore
from mqgate.offsets.interface import OffsetStore
from mqgate.registry.cache import Notices
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.interface import Scheduler
from mqgate.settings import Settings
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import MessageStore


class Backends(msgspec.Struct):
    store: MessageStore
    offsets: OffsetStore
    scheduler: Scheduler
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]
    # How registry changes reach the other gateways at once (None: one gateway, or refresh only).
    notices: Notices | None = None
    # Closes the idle pooled connections the backends share (a server restarted since they
    # were opened left them dead); None: the backends keep none (embedded).
    close_idle_connections: Callable[[], Awaitable[None]] | None = None


def backends_for(settings: Settings, health: Health | None = None) -> Backends:
    if settings.uses_redis:
        from mqgate import redisio
        from mqgate.offsets.backends.redis import RedisOffsetStore
        from mqgate.registry.redis_notices import RedisRegistryNotices
        from mqgate.scheduler.backends.redis import RedisScheduler
        from mqgate.store.backends.redis import RedisStore

        client = redisio.connect(settings.store)
        broker, prefix = settings.broker_name, settings.redis_prefix
        wait = None
        if settings.redis_wait_replicas > 0:
            wait = redisio.ReplicaWait(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)

        async def nothing() -> None:
            return None

        return Backends(
            RedisStore(client, broker=broker, prefix=prefix, wait=wait),
            RedisOffsetStore(client, broker=broker, prefix=prefix, wait=wait),
            RedisScheduler(client, prefix=prefix, wait=wait),
            nothing,
            client.aclose,
            RedisRegistryNotices(client, settings.redis_prefix),
            functools.partial(redisio.close_idle_connections, client),
        )
    health = health or Health()
    if settings.store_process:
        return remote_backends(settings, health)
    return embedded_backends(settings, health)


def remote_backends(settings: Settings, health: Health) -> Backends:
    """A worker of `mqgate serve --workers N` on the embedded store: its store process's."""
    from mqgate.offsets.backends.remote import RemoteOffsetStore
    from mqgate.scheduler.backends.remote import RemoteScheduler
    from mqgate.store.backends.remote import RemoteStore
    from mqgate.storeproc.client import StoreClient
    from mqgate.storeproc.health_mirror import HealthMirror
    from mqgate.storeproc.notices import StoreProcessNotices

    client = StoreClient(Path(settings.store_process))
    mirror = HealthMirror(client, health)

    async def start() -> None:
        mirror.start()

    async def stop() -> None:
        await mirror.stop()
        await client.close()

    return Backends(
        RemoteStore(client, settings.broker_name),
        RemoteOffsetStore(client),
        RemoteScheduler(client),
        start,
        stop,
        StoreProcessNotices(client),
    )


def embedded_backends(settings: Settings, health: Health) -> Backends:
    """The embedded store's backends, owned by this process (a gateway, or a store process)."""
    committer = GroupCommitter(settings.fsync_interval_ms, health)
    store = EmbeddedStore(
        Path(settings.data_dir),
        broker=settings.broker_name,
        segment_bytes=settings.segment_bytes,
        committer=committer,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        journal_settle_interval_s=settings.journal_settle_interval_s,
        health=health,
        disk_free_floor_bytes=settings.disk_free_floor_bytes,
    )

    async def start() -> None:
        committer.start()

    offsets = EmbeddedOffsetStore(Path(settings.data_dir), committer, health)
    scheduler = EmbeddedScheduler(
        Path(settings.data_dir) / "scheduler", committer, health, settings.disk_free_floor_bytes
    )
    return Backends(store, offsets, scheduler, start, committer.stop)
