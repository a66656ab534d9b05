"""Load edges (issue 10, section 3), in process: long polls woken only as many as there is work
for, registry refreshes that read only what changed, and a metrics scrape that reads no store.
The server-level edges (SIGTERM with waiting pulls, the metrics token) are in
test_load_edges_server.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from mqgate.api.routes_log import LogRoutes
from mqgate.backends import backends_for
from mqgate.metrics import Metrics
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import ConsumerRecord, TopicRecord
from mqgate.registry.sql import CHANGES_KEPT, SqlRegistry, consumers, topics, version
from mqgate.services.context import Context
from mqgate.services.gateway import Gateway
from mqgate.settings import load_settings
from mqgate.store.interface import MessageStore, TopicConfig
from mqgate.web.request import Request
from tests.conftest import require_service
from tests.store.test_message_store_contract import Harness, msg
from tests.store.test_redis_store import gateways, topic_everywhere

WEEK_MS = 7 * 24 * 3600 * 1000
WAITERS = 50
SETTLE_ROUNDS = 50  # loop turns after a wake in which any other woken waiter would finish


@pytest.fixture(params=["embedded", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        require_service("127.0.0.1", 6379, "Redis")
    return str(request.param)


def run(kind: str, tmp_path: Path, body: Callable[[MessageStore], Awaitable[None]]) -> None:
    async def go() -> None:
        h = Harness(kind, tmp_path)
        try:
            await body(await h.open())
        finally:
            await h.cleanup()

    asyncio.run(go())


async def start_waiting(
    store: MessageStore, topic: str, reader: tuple[str, str], count: int
) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(store.wait_for_data(topic, 30, reader)) for _ in range(count)]
    await asyncio.sleep(0)  # each registers its waiter in its first step
    assert not any(t.done() for t in tasks)
    return tasks


async def woken_after(tasks: list[asyncio.Task[None]], act: Callable[[], Awaitable[Any]]) -> int:
    """How many of `tasks` a call to `act` woke: the first within 5 s, then any other woken by
    the same wake (they all finish within a few loop turns of the first)."""
    await act()
    done, _ = await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert done, "nothing woke"
    for _ in range(SETTLE_ROUNDS):
        await asyncio.sleep(0)
    return sum(t.done() for t in tasks)


async def cancel(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- waking as many as there is work for ---------------------------------------------------


def test_a_write_to_one_queue_wakes_one_waiter_of_each_reader(kind: str, tmp_path: Path) -> None:
    async def body(s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 4, WEEK_MS))
        cluster = await start_waiting(s, "t", ("c", ""), WAITERS)
        other = await start_waiting(s, "t", ("d", ""), 3)
        assert await woken_after(cluster, lambda: s.append("t", 2, [msg(0)])) == 1
        assert sum(t.done() for t in other) == 1  # every reader sees every message
        # A write to three queues has work for three pulls of a reader, no more.
        waiting = [t for t in cluster if not t.done()]
        assert (
            await woken_after(waiting, lambda: s.append_many("t", {0: [msg(1)], 1: [msg(2)], 3: [msg(3)]}))
            == 3
        )
        await cancel(cluster + other)

    run(kind, tmp_path, body)


def test_wake_frees_count_waiters_of_one_consumer_or_all(kind: str, tmp_path: Path) -> None:
    async def body(s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        c = await start_waiting(s, "t", ("c", ""), 10)
        clients = [*await start_waiting(s, "t", ("b", "x"), 2), *await start_waiting(s, "t", ("b", "y"), 2)]

        async def ack_of_c() -> None:
            s.wake("t", consumer="c", count=1)  # an ack freed one queue of c

        assert await woken_after(c, ack_of_c) == 1
        assert not any(t.done() for t in clients)

        async def reset_of_b() -> None:
            s.wake("t", consumer="b")  # an offset reset: every pull of b looks again

        assert await woken_after(clients, reset_of_b) == 4
        assert sum(t.done() for t in c) == 1

        async def everyone() -> None:
            s.wake_all()  # shutdown

        assert await woken_after(c, everyone) == 10
        await cancel(c + clients)

    run(kind, tmp_path, body)


def test_waiters_that_timed_out_are_not_kept(kind: str, tmp_path: Path) -> None:
    async def body(s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.bounds("t")
        started = time.monotonic()
        await asyncio.gather(*(s.wait_for_data("t", 0.05, ("c", "")) for _ in range(WAITERS)))
        assert time.monotonic() - started < 10  # each timed out (a loaded machine's margin)
        # The next write wakes the one waiting now, not the dead ones ahead of it in line.
        (late,) = await start_waiting(s, "t", ("c", ""), 1)
        assert await woken_after([late], lambda: s.append("t", 0, [msg(0)])) == 1
        waiters = s._topics["t"].waiters  # type: ignore[attr-defined]
        assert waiters.waiting == 0 and not waiters._readers

    run(kind, tmp_path, body)


def test_a_reader_rechecks_with_one_waiter_at_a_time(kind: str, tmp_path: Path) -> None:
    async def body(s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.bounds("t")
        started = time.monotonic()
        tasks = [asyncio.create_task(s.wait_for_data("t", 30, ("c", ""), 0.1)) for _ in range(WAITERS)]

        async def nothing() -> None:
            return None

        # Each recheck wakes the longest waiting one, not all fifty.
        assert await woken_after(tasks, nothing) == 1
        assert tasks[0].done() and time.monotonic() - started >= 0.09
        assert await woken_after(tasks[1:], nothing) == 1
        assert tasks[1].done()
        await cancel(tasks)

    run(kind, tmp_path, body)


def test_an_append_on_another_gateway_wakes_at_most_one_waiter_per_queue() -> None:
    require_service("127.0.0.1", 6379, "Redis")

    async def go() -> None:
        async with gateways("redis://127.0.0.1:6379/0") as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 2, WEEK_MS))
            tasks = await start_waiting(a, "t", ("c", ""), WAITERS)
            woken = await woken_after(tasks, lambda: b.append("t", 1, [msg(0)]))
            # B's wake says "something changed", not where: A wakes one waiter per queue.
            assert 1 <= woken <= 2
            await cancel(tasks)

    asyncio.run(go())


# --- the registry: a change costs the same however large it is -----------------------------

REGISTERED = 2_000


def fill(registry: SqlRegistry, count: int) -> None:
    """`count` consumers on topic "t", written in one go (as an older mqgate would: no log)."""
    rows = [
        {
            "name": f"c{i}",
            "topic": "t",
            "mode": "cluster",
            "start": "earliest",
            "lock_timeout_s": 60.0,
            "max_attempts": 16,
            "paused": False,
            "rate_limit_per_s": 0.0,
            "alert_backlog": 0,
            "token_hash": "0" * 64,
            "created_ms": 1,
        }
        for i in range(count)
    ]
    with registry.engine.begin() as conn:
        conn.execute(sa.insert(topics).values(name="t", queues=1, retention_ms=WEEK_MS, created_ms=1))
        conn.execute(sa.insert(consumers), rows)
        conn.execute(sa.update(version).values(version=version.c.version + 1))


def consumer(name: str) -> ConsumerRecord:
    return ConsumerRecord(name, "t", "cluster", "earliest", 60.0, 16, False, 0.0, 0, "0" * 64, 1)


class Statements:
    """The SQL statements an engine runs while counting."""

    def __init__(self, engine: sa.Engine) -> None:
        self.seen: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(" ".join(statement.split()))

    def full_reads(self, table: str) -> list[str]:
        return [s for s in self.seen if f"FROM {table}" in s and "WHERE" not in s]


@pytest.fixture(params=["sqlite", "postgresql"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_a_change_reads_only_the_rows_it_changed(registry_url: str) -> None:
    async def go() -> None:
        a, b = SqlRegistry(registry_url), SqlRegistry(registry_url)
        a.create_schema()
        fill(a, REGISTERED)
        here, there = RegistryCache(a, 3600), RegistryCache(b, 3600)
        await here.start()
        await there.start()
        assert len(here.snapshot.consumers) == REGISTERED
        changed: list[set[str]] = []

        async def on_change(snapshot: Any, removed: Any) -> None:
            changed.append(set(snapshot.consumers))

        there.on_change = on_change
        read_here, read_there = Statements(a.engine), Statements(b.engine)
        started = time.monotonic()
        await here.change("add_consumer", consumer("new"))
        await here.change("update_consumer", "c7", paused=True)
        took_s = time.monotonic() - started
        assert here.consumer("new") is not None and here.consumer("c7").paused  # type: ignore[union-attr]
        assert await there.refresh()  # another gateway catches up with both
        assert there.consumer("new") == here.consumer("new") and there.consumer("c7") == here.consumer("c7")
        assert changed == [{"new", "c7"}]  # it is told about those two only
        assert len(there.snapshot.consumers) == REGISTERED + 1
        for statements in (read_here, read_there):
            assert not statements.full_reads("mqgate_consumers"), statements.seen
        assert here.full_reloads == there.full_reloads == 1  # the start
        assert took_s < 10.0  # a loaded machine's margin: the statements read are the check
        assert not await there.refresh()  # nothing new: nothing read but the log
        await here.stop()
        await there.stop()

    asyncio.run(go())


def test_a_cache_the_log_cannot_bring_up_to_date_reloads_everything(tmp_path: Path) -> None:
    async def go() -> None:
        url = f"sqlite:///{tmp_path / 'registry.db'}"
        registry = SqlRegistry(url)
        cache = RegistryCache(registry, 3600)
        await cache.start()
        writer = SqlRegistry(url)
        writer.add_topic(TopicRecord("t", 1, WEEK_MS, None, 1))
        fill_version = writer.version()
        with writer.engine.begin() as conn:  # a change an older mqgate made: no log entry
            conn.execute(sa.update(version).values(version=fill_version + 1))
        writer.add_consumer(consumer("late"))
        assert await cache.refresh()
        assert cache.full_reloads == 2 and cache.consumer("late") is not None
        # Far behind (the log was pruned past it): everything again, and right.
        with writer.engine.begin() as conn:
            conn.execute(sa.update(version).values(version=version.c.version + CHANGES_KEPT))
        writer.add_consumer(consumer("later"))
        assert await cache.refresh()
        assert cache.full_reloads == 3 and cache.consumer("later") is not None
        writer.dispose()
        await cache.stop()

    asyncio.run(go())


# --- a metrics scrape reads no store --------------------------------------------------------


class CountingStore:
    """The real store, counting the calls that read it."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name in ("bounds", "read", "read_raw", "offset_for_time", "create_topic"):

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self.reads += 1
                return await found(*args, **kwargs)

            return counted
        return found


def test_a_metrics_scrape_renders_gauges_without_reading_the_store(tmp_path: Path) -> None:
    async def go() -> None:
        settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
        backends = backends_for(settings)
        store = CountingStore(backends.store)
        registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
        ctx = Context(settings, store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32)  # type: ignore[arg-type]
        gw = Gateway(ctx)
        await backends.start()
        await gw.start()
        try:
            await gw.topology.create_topic("t", 2, WEEK_MS, None)
            for i in range(20):
                await gw.topology.register_consumer(f"c{i}", "t", "cluster", "earliest", 60.0, 16)
            await store.append("t", 0, [msg(0), msg(1)])
            gw.operations.lag_changed("c3")
            await gw.operations.lag_settled(5)
            routes = LogRoutes(gw)
            scrape = Request("GET", "/metrics", {}, "127.0.0.1")
            before = store.reads
            started = time.monotonic()
            for _ in range(5):
                text = (await routes.metrics(scrape)).body or b""
            assert store.reads == before, "a scrape read the store"
            assert time.monotonic() - started < 5.0  # a loaded machine's margin: reads are the check
            assert b'mqgate_consumer_lag{consumer="c3"} 2.0' in text
            assert b'mqgate_consumer_lag{consumer="c19"}' in text  # registered: gauged at once
        finally:
            await gw.stop()
            await backends.stop()

    asyncio.run(go())
