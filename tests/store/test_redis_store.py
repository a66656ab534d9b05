"""What only the Redis message store has: several gateways sharing one store.

Each store here is a "gateway" of its own (its own client, so its own connections). Tests on
the machine's Redis use a random key prefix and delete their keys; tests that count server
commands or restart the server run a private redis-server on a free port.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mqgate.errors import BadRequest, Unavailable
from mqgate.model import StoredMessage
from mqgate.redisio import connect
from mqgate.store.backends.redis import RedisStore
from mqgate.store.backends.redis.store import WAKE_COALESCE_S
from mqgate.store.interface import TopicConfig
from tests.conftest import RedisServer, require_service

WEEK_MS = 7 * 24 * 3600 * 1000
ROUNDS = 20
WAKE_BUDGET_S = 0.05


def msg(i: int, ts: int = 1_000) -> StoredMessage:
    return StoredMessage(f"id{i:08d}", ts, "p", f"m{i}", [], [], {})


@pytest.fixture
def shared_redis() -> None:
    require_service("127.0.0.1", 6379, "Redis")


@asynccontextmanager
async def gateways(url: str, count: int = 2) -> AsyncIterator[list[RedisStore]]:
    """`count` stores sharing one prefix, each with its own client; keys deleted after."""
    prefix = f"test-{secrets.token_hex(6)}"
    clients = [connect(url) for _ in range(count)]
    stores = [RedisStore(c, broker="b1", prefix=prefix) for c in clients]
    try:
        for s in stores:
            await s.open()
        yield stores
    finally:
        for s in stores:
            await s.close()
        try:
            keys = [k async for k in clients[0].scan_iter(match=prefix + ":*", count=1000)]
            if keys:
                await clients[0].delete(*keys)
        finally:
            for c in clients:
                await c.aclose()


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


async def eventually(call: Callable[[], Awaitable[Any]], timeout_s: float = 10) -> Any:
    """`call()`, retried while Redis is unavailable (as a client retries a 503)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def topic_everywhere(stores: list[RedisStore], config: TopicConfig) -> None:
    for s in stores:
        await s.create_topic(config)
        await until(s.listening.is_set, 5, "the wake listener to subscribe")


async def wake_latencies(
    waiter: RedisStore, act: Callable[[], Awaitable[Any]], pace_s: float = 0.0
) -> list[float]:
    """How long after `act()` starts a wait on `waiter` returns, ROUNDS times."""
    out = []
    for _ in range(ROUNDS):
        if pace_s:
            await asyncio.sleep(pace_s)  # pacing, not synchronisation
        task = asyncio.create_task(waiter.wait_for_data("t", 5))
        await asyncio.sleep(0)  # its waiter is registered in its first step
        assert not task.done()
        started = time.perf_counter()
        await act()
        await asyncio.wait_for(task, 5)
        out.append(time.perf_counter() - started)
    return out


def report(what: str, latencies: list[float]) -> str:
    return f"{what}: p50 {statistics.median(latencies) * 1000:.2f} ms, max {max(latencies) * 1000:.2f} ms"


# --- waking across gateways ----------------------------------------------------------------


def test_an_append_through_one_gateway_wakes_a_wait_on_another(shared_redis: None) -> None:
    async def go() -> str:
        async with gateways("redis://127.0.0.1:6379/0") as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 2, WEEK_MS))
            counter = iter(range(10**6))

            async def append() -> None:
                await b.append("t", 1, [msg(next(counter))])

            # Back to back, most appends fall in the wake-coalescing interval of the one
            # before (their wake is the writer's trailing publish); spaced, none do.
            back_to_back = await wake_latencies(a, append)

            spaced = await wake_latencies(a, append, pace_s=WAKE_COALESCE_S * 2)
            for what, latencies in (("back to back", back_to_back), ("spaced", spaced)):
                # The typical wake within the budget; every one woken, not timed out (5 s): a
                # loaded machine stalls a round now and then (max 182 ms once, beside a CI run).
                assert statistics.median(latencies) < WAKE_BUDGET_S, report(what, latencies)
                assert max(latencies) < 2.5, report(what, latencies)
            return "append on B wakes A: " + "; ".join(
                (report("back to back", back_to_back), report("spaced", spaced))
            )

    print(asyncio.run(go()))


def test_wake_on_one_gateway_wakes_a_wait_on_another(shared_redis: None) -> None:
    async def go() -> str:
        async with gateways("redis://127.0.0.1:6379/0") as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 1, WEEK_MS))

            async def wake() -> None:
                b.wake("t")

            latencies = await wake_latencies(a, wake)
            assert statistics.median(latencies) < WAKE_BUDGET_S, report("wake()", latencies)
            assert max(latencies) < 2.5, report("wake()", latencies)  # woken, not timed out (5 s)
            return report("wake() on B wakes A", latencies)

    print(asyncio.run(go()))


def test_a_wake_that_lands_while_bounds_is_answered_is_not_lost(shared_redis: None) -> None:
    async def go() -> None:
        async with gateways("redis://127.0.0.1:6379/0") as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 1, WEEK_MS))
            seen = a._topics["t"].epoch
            assert [x.max for x in await a.bounds("t")] == [0]  # "nothing to read"
            await b.append("t", 0, [msg(1)])
            await until(lambda: a._topics["t"].epoch != seen, 5, "A to hear B's wake")
            # The wake came before A waited; the wait must not sleep through it.
            started = time.monotonic()
            await a.wait_for_data("t", 5)
            assert time.monotonic() - started < 2.5  # not its whole 5 s
            assert [x.max for x in await a.bounds("t")] == [1]
            # Once looked at again, a wait waits.
            started = time.monotonic()
            await a.wait_for_data("t", 0.2)
            assert time.monotonic() - started >= 0.19

    asyncio.run(go())


def test_waiting_sends_no_redis_commands(own_redis: RedisServer) -> None:
    async def calls(client: Any) -> int:
        stats = await client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    async def go() -> None:
        observer = connect(own_redis.url)
        async with gateways(own_redis.url) as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 1, WEEK_MS))
            before = await calls(observer)
            started = time.monotonic()
            await asyncio.gather(*(a.wait_for_data("t", 1.0) for _ in range(5)))
            assert time.monotonic() - started >= 0.99
            assert await calls(observer) - before == 0, "a waiting store polled Redis"
            # The counter does see commands (this check could fail).
            await b.append("t", 0, [msg(1)])
            assert await calls(observer) - before >= 1
        await observer.aclose()

    asyncio.run(go())


# --- many writers --------------------------------------------------------------------------


def test_concurrent_appends_from_two_gateways_get_distinct_gap_free_offsets(shared_redis: None) -> None:
    async def go() -> None:
        async with gateways("redis://127.0.0.1:6379/0") as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 2, WEEK_MS))
            ids = iter(range(10**6))
            sent: dict[int, list[tuple[int, list[StoredMessage]]]] = {0: [], 1: []}

            async def writer(store: RedisStore, rounds: int) -> None:
                for r in range(rounds):
                    batch0 = [msg(next(ids)) for _ in range(1 + r % 4)]
                    if r % 3 == 0:
                        batch1 = [msg(next(ids)) for _ in range(2)]
                        firsts = await store.append_many("t", {0: batch0, 1: batch1})
                        sent[1].append((firsts[1], batch1))
                    else:
                        firsts = {0: await store.append("t", 0, batch0)}
                    sent[0].append((firsts[0], batch0))

            await asyncio.gather(*(writer(s, 60) for s in (a, b) for _ in range(4)))
            for q, appended in sent.items():
                expected = {first + i: m for first, batch in appended for i, m in enumerate(batch)}
                total = sum(len(batch) for _, batch in appended)
                assert len(expected) == total, f"queue {q}: two appends got the same offset"
                assert sorted(expected) == list(range(total)), f"queue {q}: offsets have gaps"
                stored = await a.read("t", q, 0, total + 10)
                assert stored == sorted(expected.items())
            totals = [sum(len(batch) for _, batch in sent[q]) for q in (0, 1)]
            assert [(x.min, x.max) for x in await b.bounds("t")] == [(0, totals[0]), (0, totals[1])]

    asyncio.run(go())


def test_appends_of_one_turn_go_in_one_script_call_and_a_bad_queue_fails_alone(
    own_redis: RedisServer,
) -> None:
    """A group commit: the appends of a topic made in the same turn of the event loop are one
    script call, each answered its own first offsets; an append to a queue the topic lacks is
    refused by itself and takes nothing from the others."""

    async def scripts(client: Any) -> int:
        stats = await client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))

    async def go() -> None:
        observer = connect(own_redis.url)
        async with gateways(own_redis.url, count=1) as (a,):
            await a.create_topic(TopicConfig("t", 2, WEEK_MS))
            await a.append("t", 0, [msg(0)])  # the script loaded
            before = await scripts(observer)
            appends = [a.append("t", i % 2, [msg(i), msg(i + 100)]) for i in range(1, 21)]
            results = await asyncio.gather(*appends, a.append("t", 7, [msg(99)]), return_exceptions=True)
            assert await scripts(observer) - before == 1, "one script call for the turn's appends"
            *firsts, bad = results
            assert isinstance(bad, BadRequest) and bad.field == "queue", bad
            # Queue 1 had nothing before, queue 0 the one message: each append's two follow each other.
            assert sorted(f for i, f in enumerate(firsts, start=1) if i % 2 == 1) == list(range(0, 20, 2))
            assert sorted(f for i, f in enumerate(firsts, start=1) if i % 2 == 0) == list(range(1, 21, 2))
            for i, first in enumerate(firsts, start=1):
                got = await a.read("t", i % 2, first, 2)
                assert [m.body for _, m in got] == [f"m{i}", f"m{i + 100}"]
        await observer.aclose()

    asyncio.run(go())


def test_an_append_cancelled_before_its_group_is_sent_is_not_written(shared_redis: None) -> None:
    """A caller that went away before the group's call (a time limit, a closed request) is left
    out of it, as its append alone would not have been sent; the others are written."""

    async def go() -> None:
        async with gateways("redis://127.0.0.1:6379/0", count=1) as (a,):
            await a.create_topic(TopicConfig("t", 1, WEEK_MS))
            kept = [asyncio.create_task(a.append("t", 0, [msg(i)])) for i in (1, 2)]
            gone = asyncio.create_task(a.append("t", 0, [msg(3)]))
            await asyncio.sleep(0)  # each has joined the turn's group, which has not run yet
            gone.cancel()
            assert sorted(await asyncio.gather(*kept)) == [0, 1]
            assert gone.cancelled()
            assert [(b.min, b.max) for b in await a.bounds("t")] == [(0, 2)]
            assert [m.body for _, m in await a.read("t", 0, 0, 10)] == ["m1", "m2"]

    asyncio.run(go())


def test_a_pulls_bounds_are_read_after_a_redis_restart_without_an_error(own_redis: RedisServer) -> None:
    """The pooled connections of a restarted Redis are closed by the server: a pull's bounds
    (one pipeline for its three topics) are read again on a new one, not answered 503."""

    async def go() -> None:
        async with gateways(own_redis.url, count=1) as (a,):
            for name in ("t", "u", "v"):
                await a.create_topic(TopicConfig(name, 1, WEEK_MS))
            await a.append("t", 0, [msg(1)])
            await asyncio.gather(*(a.bounds_many(["t", "u", "v"]) for _ in range(4)))  # pooled
            own_redis.kill9()
            own_redis.start()  # its AOF: the topics are back
            got = await a.bounds_many(["t", "u", "v"])
            assert [[(b.min, b.max) for b in bounds] for bounds in got] == [[(0, 1)], [(0, 0)], [(0, 0)]]

    asyncio.run(go())


def test_a_topic_grown_by_one_gateway_is_usable_on_another(shared_redis: None) -> None:
    async def go() -> None:
        async with gateways("redis://127.0.0.1:6379/0") as (a, b):
            await topic_everywhere([a, b], TopicConfig("t", 1, WEEK_MS))
            await a.create_topic(TopicConfig("t", 3, WEEK_MS))
            assert await b.append("t", 2, [msg(1)]) == 0  # B's cache still says 1 queue
            assert [x.max for x in await b.bounds("t")] == [0, 0, 1]
            assert await b.read("t", 2, 0, 5) == [(0, msg(1))]

    asyncio.run(go())


# --- a Redis restart -----------------------------------------------------------------------


def test_the_listener_survives_a_redis_restart(own_redis: RedisServer) -> None:
    async def go() -> None:
        async with gateways(own_redis.url) as (a, b):
            config = TopicConfig("t", 1, WEEK_MS)
            await topic_everywhere([a, b], config)
            listener = a._listener
            own_redis.kill9()
            await until(lambda: not a.listening.is_set(), 10, "A to notice Redis is gone")
            started = time.monotonic()
            await a.wait_for_data("t", 0.3)  # times out normally
            assert 0.29 <= time.monotonic() - started < 2
            with pytest.raises(Unavailable):
                await a.append("t", 0, [msg(1)])

            own_redis.start()  # on its append-only file: the topic is still there
            await until(a.listening.is_set, 15, "A's listener to reconnect by itself")
            assert listener is a._listener and not listener.done()
            # A pooled connection broken by the restart fails once (a 503 to a client).
            await eventually(lambda: b.create_topic(config))
            await eventually(lambda: b.bounds("t"))
            task = asyncio.create_task(a.wait_for_data("t", 5))
            await asyncio.sleep(0)
            started = time.monotonic()
            assert await b.append("t", 0, [msg(2)]) == 0
            await asyncio.wait_for(task, 5)
            assert time.monotonic() - started < 2.5  # woken, not timed out (5 s)
            assert await eventually(lambda: a.read("t", 0, 0, 10)) == [(0, msg(2))]

    asyncio.run(go())


# --- retention -----------------------------------------------------------------------------


def test_retention_works_through_a_backlog_in_bounded_chunks(
    shared_redis: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mqgate.store.backends.redis.store.RETENTION_CHUNK", 100)

    async def stored_bytes(store: RedisStore, topic: str) -> int:
        return int(await store._client.hget(store._topics[topic].meta, "bytes:0"))

    async def go() -> None:
        async with gateways("redis://127.0.0.1:6379/0", count=1) as (s,):
            await s.create_topic(TopicConfig("aged", 1, 60_000))
            await s.create_topic(TopicConfig("sized", 1, WEEK_MS, retention_bytes=10_000))
            for r in range(10):
                ts = 1_000 if r < 9 else 90_000
                await s.append("aged", 0, [msg(100 * r + i, ts=ts) for i in range(100)])
                await s.append("sized", 0, [msg(100 * r + i) for i in range(100)])
            sizes = [len(p) for _, p in await s.read_raw("sized", 0, 0, 1000)]
            assert await stored_bytes(s, "sized") == sum(sizes)

            # 900 + what exceeds 10 kB, 100 per script call, all in one enforce_retention.
            keep = next(n for n in range(1000) if sum(sizes[-n - 1 :]) > 10_000)
            assert await s.enforce_retention(now_ms=90_000) == 900 + (1000 - keep)
            assert [(b.min, b.max) for b in await s.bounds("aged")] == [(900, 1000)]
            assert [(b.min, b.max) for b in await s.bounds("sized")] == [(1000 - keep, 1000)]
            assert await stored_bytes(s, "sized") == sum(sizes[-keep:]) <= 10_000
            remaining = await s.read_raw("aged", 0, 0, 1000)
            assert [o for o, _ in remaining] == list(range(900, 1000))
            assert await stored_bytes(s, "aged") == sum(len(p) for _, p in remaining)
            assert await s.enforce_retention(now_ms=90_000) == 0

    asyncio.run(go())
