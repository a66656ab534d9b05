"""Fixtures of the tracing tests: real stores (embedded on tmp_path, the machine's Redis with a
key prefix of the test's own) and real index databases (an SQLite file, a fresh PostgreSQL
database)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqgate.redisio import connect
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import MessageStore
from mqgate.tracing.events import Resource, TraceEvent
from mqgate.tracing.index import TraceIndex
from tests.conftest import require_service

REDIS_URL = "redis://127.0.0.1:6379/0"
GATEWAY = Resource("gw-1", "host-a", "mqgate", 8080)


class Stores:
    """Opens stores of one backend over the same data, so a test can close and reopen."""

    def __init__(self, kind: str, directory: Path, redis_url: str = REDIS_URL) -> None:
        self.kind = kind
        self.directory = directory
        self.redis_url = redis_url
        self.prefix = f"trtest{secrets.token_hex(6)}"
        self.clients: list[Any] = []
        self.opened: list[MessageStore] = []

    async def open(self) -> MessageStore:
        store: MessageStore
        if self.kind == "embedded":
            store = EmbeddedStore(self.directory)
        else:
            from mqgate.store.backends.redis import RedisStore

            client = connect(self.redis_url)
            self.clients.append(client)
            store = RedisStore(client, broker="b1", prefix=self.prefix)
        await store.open()
        self.opened.append(store)
        return store

    async def reopen(self, store: MessageStore) -> MessageStore:
        await store.close()
        self.opened.remove(store)
        return await self.open()

    async def cleanup(self) -> None:
        for store in self.opened:
            await store.close()
        for client in self.clients:
            try:
                keys = [k async for k in client.scan_iter(match=self.prefix + ":*", count=1000)]
                if keys:
                    await client.delete(*keys)
            except Exception:  # a test's own Redis may be gone already
                pass
            await client.aclose()


@pytest.fixture(params=["embedded", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        require_service("127.0.0.1", 6379, "Redis")
    return str(request.param)


def run_with_stores(
    kind: str, directory: Path, body: Callable[[Stores, MessageStore], Awaitable[None]]
) -> None:
    async def go() -> None:
        stores = Stores(kind, directory)
        try:
            await body(stores, await stores.open())
        finally:
            await stores.cleanup()

    asyncio.run(go())


def run_with_small_segments(directory: Path, body: Callable[[Stores, MessageStore], Awaitable[None]]) -> None:
    """`body` on an embedded store of 4 KiB segments: retention can drop them within a test."""

    async def go() -> None:
        store = EmbeddedStore(directory, segment_bytes=4096)
        await store.open()
        try:
            await body(Stores("embedded", directory), store)
        finally:
            await store.close()

    asyncio.run(go())


@pytest.fixture(params=["sqlite", "postgresql"])
def index_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/trace-index.sqlite"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def index(index_url: str) -> Iterator[TraceIndex]:
    idx = TraceIndex(index_url)
    idx.create_schema()
    yield idx
    idx.dispose()


def event(msg_id: str, hop: Any, time_ms: int, project: str = "shop", **fields: Any) -> TraceEvent:
    fields.setdefault("topic", "orders")
    fields.setdefault("resource", GATEWAY)
    return TraceEvent(msg_id=msg_id, hop=hop, time_ms=time_ms, project=project, **fields)
