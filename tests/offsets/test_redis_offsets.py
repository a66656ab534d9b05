"""The Redis offset table under concurrency from two gateways, against the embedded one, and
across a Redis restart.

Two `RedisOffsetStore`s with separate clients (separate connection pools) stand for two
gateways. Calls pass their own `now_ms`; the concurrent tests advance that clock in rounds (every
call of a round runs at once, with the same `now_ms`) so a lock window can be checked exactly:
a lease holds its queue from its `now_ms` until the `now_ms` of its accepted ack or release, or
until its deadline. Calls within a round really are concurrent: Redis sees them in any order.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mqgate import redisio
from mqgate.core.tokens import AckToken
from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import MqgateError, NotFound, Unavailable
from mqgate.model import QueueBounds
from mqgate.offsets.backends.embedded import EmbeddedOffsetStore
from mqgate.offsets.backends.redis import RedisOffsetStore
from mqgate.offsets.interface import Lease, OffsetStore
from tests.conftest import RedisServer
from tests.offsets.test_offset_store_contract import (
    REDIS_URL,
    fresh_redis_prefix,
)

NOW = 1_700_000_000_000  # a realistic wall clock: Lua numbers must keep it exact
BROKER = "local"
LEASE_ARGS: dict[str, Any] = {"max_count": 10, "lock_timeout_ms": 1000, "max_attempts": 3, "owner": "t"}


@pytest.fixture
def prefix() -> Iterator[str]:
    yield from fresh_redis_prefix()


@asynccontextmanager
async def gateways(prefix: str, url: str = REDIS_URL) -> AsyncIterator[tuple[RedisOffsetStore, ...]]:
    """Two stores on one prefix, each with its own client, as two gateways would have."""
    clients = [redisio.connect(url), redisio.connect(url)]
    stores = tuple(RedisOffsetStore(c, broker=BROKER, prefix=prefix) for c in clients)
    for s in stores:
        await s.open()
    try:
        yield stores
    finally:
        for s in stores:
            await s.close()
        for c in clients:
            await c.aclose()


def tok(lease: Lease, group: str = "g", client: str = "") -> AckToken:
    return AckToken(group, client, BROKER, lease.queue, lease.offset, lease.next_offset, lease.lock_ts)


@dataclass
class Window:
    """One lease's hold on its queue, in the callers' clock."""

    queue: int
    start: int
    end: int  # the deadline until an accepted ack/release/extend changes it
    lock_ts: int
    offset: int
    next_offset: int


def test_two_gateways_never_hold_one_queue_at_once(prefix: str) -> None:
    rounds, workers, n_queues, lock_timeout_ms = 600, 40, 4, 30
    rng = random.Random(7)

    async def go() -> None:
        async with gateways(prefix) as (a, b):
            assert await a.ensure_table("g", "", [0] * n_queues, NOW)
            maxes = [20] * n_queues
            held: dict[int, tuple[Window, AckToken]] = {}  # worker -> its current lease
            windows: list[Window] = []
            commits: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # q -> (now, from, to)
            last_committed = [0] * n_queues
            refusals: dict[str, int] = defaultdict(int)
            now = NOW

            async def step(worker: int) -> None:
                store = a if worker % 2 else b  # the workers are split over the two gateways
                if worker not in held:
                    bounds = [QueueBounds(q, 0, m) for q, m in enumerate(maxes)]
                    lease = await store.lease(
                        "g",
                        "",
                        bounds,
                        now_ms=now,
                        max_count=5,
                        lock_timeout_ms=lock_timeout_ms,
                        max_attempts=1000,
                        owner=f"w{worker}",
                    )
                    if lease is not None:
                        w = Window(
                            lease.queue,
                            now,
                            now + lock_timeout_ms,
                            lease.lock_ts,
                            lease.offset,
                            lease.next_offset,
                        )
                        windows.append(w)
                        held[worker] = (w, tok(lease))
                    return
                w, token = held[worker]
                action = rng.choices(["ack", "release", "extend", "idle"], [70, 5, 5, 20])[0]
                if action == "idle":  # a slow consumer: its lock may expire
                    return
                if action == "extend":
                    refusal = await store.extend(token, now, 0.04)
                    if refusal is None:
                        w.end = now + 40
                        return
                else:
                    settle = store.ack if action == "ack" else store.release
                    refusal = await settle(token, now)
                    if refusal is None:
                        w.end = now
                        if action == "ack":
                            commits[w.queue].append((now, token.offset, token.next_offset))
                if refusal is not None:
                    refusals[refusal] += 1
                del held[worker]

            for _ in range(rounds):
                for q in range(n_queues):
                    maxes[q] += rng.choice([0, 0, 1, 3])  # producers keep adding
                await asyncio.gather(*(step(w) for w in range(workers)))
                table = await a.table("g", "")
                assert table is not None
                committed = [e.committed for e in table]
                assert all(c >= p for c, p in zip(committed, last_committed, strict=True)), (
                    f"a committed offset moved back: {last_committed} -> {committed}"
                )
                last_committed = committed
                now += rng.choice([0, 5, 10, 20])

            by_queue: dict[int, list[Window]] = defaultdict(list)
            for w in windows:
                by_queue[w.queue].append(w)
            for q, ws in by_queue.items():
                ws.sort(key=lambda w: (w.start, w.lock_ts))
                for prev, nxt in itertools.pairwise(ws):
                    assert nxt.start >= prev.end, f"queue {q} held twice: {prev} and {nxt}"
                    assert nxt.lock_ts > prev.lock_ts
            # Every accepted ack continued from the previous one: no batch was committed twice.
            for q in range(n_queues):
                position = 0
                for _, first, end in sorted(commits[q]):
                    assert first == position, f"queue {q}: ack of [{first}, {end}) at committed {position}"
                    position = end
                assert last_committed[q] == position
            # The run exercised what it claims to: contention, expiries, takeovers, commits.
            assert len(windows) > 800 and sum(len(c) for c in commits.values()) > 600
            assert refusals["lock_expired"] > 0 and refusals["lock_taken"] + refusals["offset_moved"] > 0

    asyncio.run(go())


def test_an_expired_lock_is_taken_over_by_exactly_one_caller(prefix: str) -> None:
    callers, timeout_ms = 50, 1000

    async def go() -> None:
        async with gateways(prefix) as (a, b):
            await a.ensure_table("g", "", [0], NOW)
            args: dict[str, Any] = {"max_count": 10, "lock_timeout_ms": timeout_ms, "max_attempts": 1000}
            first = await a.lease("g", "", [QueueBounds(0, 0, 10)], now_ms=NOW, owner="first", **args)
            assert first is not None
            holder, now = first, NOW

            async def stampede(at_ms: int) -> list[Lease]:
                leases = await asyncio.gather(
                    *(
                        (a if i % 2 else b).lease(
                            "g", "", [QueueBounds(0, 0, 10)], now_ms=at_ms, owner=f"c{i}", **args
                        )
                        for i in range(callers)
                    )
                )
                return [x for x in leases if x is not None]

            for _ in range(20):
                now += timeout_ms  # exactly the deadline: the lock has just expired
                assert await stampede(now - 1) == [], "a lock was taken before its deadline"
                winners = await stampede(now)
                assert len(winners) == 1, f"{len(winners)} callers hold the queue"
                won = winners[0]
                assert won.lock_ts > holder.lock_ts and won.offset == 0
                assert await a.ack(tok(holder), now) == "lock_taken"
                table = await b.table("g", "")
                assert table is not None and table[0].lock_ts == won.lock_ts
                holder = won
            assert await b.ack(tok(holder), now + 1) is None

    asyncio.run(go())


def test_a_free_queue_goes_to_exactly_one_of_many_callers(prefix: str) -> None:
    async def go() -> None:
        async with gateways(prefix) as (a, b):
            await a.ensure_table("g", "", [0, 0, 0], NOW)
            bounds = [QueueBounds(q, 0, 5) for q in range(3)]
            args: dict[str, Any] = {"max_count": 10, "lock_timeout_ms": 1000, "max_attempts": 3}
            leases = await asyncio.gather(
                *(
                    (a if i % 2 else b).lease("g", "", bounds, now_ms=NOW, owner=str(i), **args)
                    for i in range(60)
                )
            )
            won = sorted(x.queue for x in leases if x is not None)
            assert won == [0, 1, 2]

    asyncio.run(go())


def test_the_rate_limit_bucket_is_shared_by_two_gateways(prefix: str) -> None:
    async def go() -> None:
        async with gateways(prefix) as (a, b):
            assert await a.take_tokens("g", 10.0, 25, NOW) == (10, 0.0)
            granted, retry = await b.take_tokens("g", 10.0, 5, NOW)
            assert granted == 0 and retry == pytest.approx(0.1)
            await b.return_tokens("g", 10.0, 4)
            assert (await a.take_tokens("g", 10.0, 25, NOW))[0] == 4
            # One second later the bucket is full again; 40 concurrent takers share its 10.
            got = await asyncio.gather(
                *((a if i % 2 else b).take_tokens("g", 10.0, 1, NOW + 1000) for i in range(40))
            )
            assert sum(g for g, _ in got) == 10
            assert all(r > 0 for g, r in got if g == 0)
            # A late clock (another gateway's, a little behind) neither drains nor refills it.
            assert (await b.take_tokens("g", 10.0, 5, NOW + 900))[0] == 0
            assert (await a.take_tokens("g", 10.0, 5, NOW + 1150))[0] == 1
            # A new rate starts a new, full bucket.
            assert (await b.take_tokens("g", 3.0, 5, NOW + 1150))[0] == 3

    asyncio.run(go())


def test_missing_tables_and_clients(prefix: str) -> None:
    async def go() -> None:
        async with gateways(prefix) as (a, b):
            lease_args: dict[str, Any] = {
                "max_count": 1,
                "lock_timeout_ms": 1,
                "max_attempts": 1,
                "owner": "",
            }
            with pytest.raises(NotFound) as err:
                await a.lease("g", "", [QueueBounds(0, 0, 1)], now_ms=NOW, **lease_args)
            assert err.value.field == "consumer"
            with pytest.raises(NotFound):
                await a.ack(AckToken("g", "x", BROKER, 0, 0, 1, NOW), NOW)
            with pytest.raises(NotFound):
                await a.reset("g", "x", 0, 0)
            await a.ensure_table("g", "", [0], NOW)
            await a.ensure_table("g", "c1", [0], NOW)
            await b.take_tokens("g", 1.0, 1, NOW)
            with pytest.raises(ValueError):  # bounds for another layout, as the embedded store
                await a.lease("g", "", [QueueBounds(0, 0, 1), QueueBounds(1, 0, 1)], now_ms=NOW, **lease_args)
            # A token of another broker names no queue of this table.
            assert await a.ack(AckToken("g", "", "other", 0, 0, 1, NOW), NOW) == "offset_moved"
            assert await b.clients("g") == ["", "c1"]

    asyncio.run(go())


# --- the same random history on both backends ---------------------------------------------


class Differential:
    """Apply each call to both stores; they must answer alike and hold the same tables."""

    def __init__(self, embedded: OffsetStore, redis_store: OffsetStore) -> None:
        self.stores = (embedded, redis_store)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        outcomes = []
        for store in self.stores:
            try:
                outcomes.append(("ok", await getattr(store, name)(*args, **kwargs)))
            except (MqgateError, ValueError) as exc:
                outcomes.append(("raised", type(exc).__name__))
        if name == "expire_clients":
            outcomes = [(k, sorted(v) if k == "ok" else v) for k, v in outcomes]
        assert outcomes[0] == outcomes[1], (
            f"{name}{args}{kwargs}: embedded {outcomes[0]}, redis {outcomes[1]}"
        )
        kind, value = outcomes[0]
        return value if kind == "ok" else None


def both_backends(prefix: str, tmp_path: Path, body: Callable[[Differential], Awaitable[None]]) -> None:
    async def go() -> None:
        committer = GroupCommitter(None)
        committer.start()
        embedded = EmbeddedOffsetStore(tmp_path, committer)
        await embedded.open()
        client = redisio.connect(REDIS_URL)
        redis_store = RedisOffsetStore(client, broker=BROKER, prefix=prefix)
        await redis_store.open()
        try:
            await body(Differential(embedded, redis_store))
        finally:
            await redis_store.close()
            await client.aclose()
            await embedded.close()
            await committer.stop()

    asyncio.run(go())


@pytest.mark.parametrize("seed", range(6))
def test_redis_answers_like_the_embedded_store(seed: int, prefix: str, tmp_path: Path) -> None:
    both_backends(prefix, tmp_path, lambda d: history(random.Random(seed), d))


def test_leases_and_acks_count_as_seen_like_the_embedded_store(prefix: str, tmp_path: Path) -> None:
    async def body(d: Differential) -> None:
        await d.call("ensure_table", "g", "a", [0], NOW)
        lease = await d.call("lease", "g", "a", [QueueBounds(0, 0, 9)], now_ms=NOW + 100, **LEASE_ARGS)
        assert await d.call("expire_clients", "g", NOW + 100) == []  # seen at the cutoff: not idle
        assert await d.call("ack", tok(lease, client="a"), NOW + 500) is None
        assert await d.call("expire_clients", "g", NOW + 500) == []
        assert await d.call("expire_clients", "g", NOW + 501) == ["a"]

    both_backends(prefix, tmp_path, body)


async def history(rng: random.Random, d: Differential) -> None:
    tables = [("g", ""), ("g", "a"), ("g", "b"), ("h", "")]
    mins: dict[str, list[int]] = {"g": [], "h": []}
    maxes: dict[str, list[int]] = {"g": [], "h": []}
    lanes: dict[str, list[int]] = {"g": [], "h": []}
    tokens: list[AckToken] = []
    now = NOW
    times = [now]
    for _ in range(600):
        now += rng.choice([0, 1, 10, 100, 300, 999, 1000, 1500])  # lock timeout: 1000
        group, client = rng.choice(tables)
        times.append(now)
        op = rng.choices(["ensure", "lease", "settle", "reset", "expire", "rate"], [8, 40, 40, 4, 6, 5])[0]
        if op == "ensure" or not maxes[group]:
            grow = rng.randint(0, 2) if maxes[group] else rng.randint(1, 3)
            for _ in range(grow):
                mins[group].append(0)
                maxes[group].append(rng.randint(0, 8))
                lanes[group].append(rng.randint(0, 1))
            starts = [rng.randint(0, m) for m in maxes[group]]
            await d.call("ensure_table", group, client, starts, now)
        elif op == "lease":
            for q in range(len(maxes[group])):
                maxes[group][q] += rng.choice([0, 0, 2, 7])
                if rng.random() < 0.05:  # retention drops old messages
                    mins[group][q] = rng.randint(mins[group][q], maxes[group][q])
            table = await d.stores[0].table(group, client)
            n = len(table) if table is not None and rng.random() < 0.95 else len(maxes[group])
            bounds = [
                QueueBounds(q, mins[group][q], maxes[group][q], lanes[group][q])
                for q in range(min(n, len(maxes[group])))
            ]
            lease = await d.call(
                "lease",
                group,
                client,
                bounds,
                now_ms=now,
                max_count=rng.choice([1, 3, 10]),
                lock_timeout_ms=1000,
                max_attempts=3,
                owner=rng.choice(["x", "y"]),
            )
            if lease is not None:
                tokens.append(tok(lease, group, client))
                if rng.random() < 0.3:  # the pull found fewer messages than leased
                    t = tokens[-1]
                    tokens[-1] = msgspec.structs.replace(t, next_offset=max(t.offset, t.next_offset - 1))
        elif op == "settle" and tokens:
            t = tokens[-1] if rng.random() < 0.5 else rng.choice(tokens[-8:])
            if rng.random() < 0.1:  # a token naming a queue the table does not have
                t = msgspec.structs.replace(t, queue=t.queue + 50)
            which = rng.choice(["ack", "release", "extend", "record_dead_letters"])
            if which == "extend":
                await d.call("extend", t, now, rng.choice([0.5, 2.0]))
            elif which == "record_dead_letters":
                await d.call("record_dead_letters", t, rng.randint(0, 5), now)
            else:
                await d.call(which, t, now)
        elif op == "reset" and maxes[group]:
            table = await d.stores[0].table(group, client)
            if table:
                await d.call("reset", group, client, rng.randrange(len(table)), rng.randint(0, 30))
        elif op == "expire":  # often exactly at an earlier call's time: `seen` is compared there
            await d.call("expire_clients", group, rng.choice(times[-6:]) + rng.choice([0, 0, 1]))
        elif op == "rate":
            rate = rng.choice([0.0, 0.5, 5.0])
            if rng.random() < 0.7:
                await d.call("take_tokens", group, rate, rng.randint(0, 8), now)
            else:
                await d.call("return_tokens", group, rate, rng.randint(0, 3))
        for g, c in tables:
            await d.call("table", g, c)
        for g in ("g", "h"):
            await d.call("clients", g)


# --- a Redis of our own: persistence, outage, restart ---------------------------------------


def test_a_redis_crash_loses_no_commit_and_scripts_reload(own_redis: RedisServer) -> None:
    async def go() -> None:
        client = redisio.connect(own_redis.url, socket_timeout=2, socket_connect_timeout=2)
        store = RedisOffsetStore(client, broker=BROKER, prefix="mq")
        await store.open()
        try:
            args: dict[str, Any] = {
                "max_count": 4,
                "lock_timeout_ms": 60_000,
                "max_attempts": 3,
                "owner": "o",
            }
            await store.ensure_table("g", "", [0, 0], NOW)
            first = await store.lease(
                "g", "", [QueueBounds(0, 0, 10), QueueBounds(1, 0, 3)], now_ms=NOW, **args
            )
            assert first is not None and await store.ack(tok(first), NOW) is None
            held = await store.lease(
                "g", "", [QueueBounds(0, 0, 10), QueueBounds(1, 0, 3)], now_ms=NOW, **args
            )
            assert held is not None

            own_redis.kill9()
            with pytest.raises(Unavailable):
                await store.ack(tok(held), NOW + 1)
            own_redis.start()  # empty script cache: every script must load again

            table = await store.table("g", "")
            assert table is not None and [e.committed for e in table] == [4, 0]
            assert table[held.queue].lock_ts == held.lock_ts  # the lock survived too
            assert await store.ack(tok(held), NOW + 2) is None
            again = await store.lease(
                "g", "", [QueueBounds(0, 0, 10), QueueBounds(1, 0, 3)], now_ms=NOW + 3, **args
            )
            assert again is not None and (again.queue, again.offset) == (1, 0)  # 3 left there, 2 in queue 0
        finally:
            await store.close()
            await client.aclose()

    asyncio.run(go())


def test_an_ack_and_lease_whose_replica_wait_falls_short_takes_no_lease(prefix: str) -> None:
    """With a replica wait, a pull's ack must fail before its lease is taken: a lease the pull
    never answers would keep the queue locked until its timeout and count an attempt."""

    async def go() -> None:
        client = redisio.connect(REDIS_URL)
        replicas = int((await client.info("replication"))["connected_slaves"])
        short = redisio.ReplicaWait(replicas + 1, 10)  # every replica wait falls short
        store = RedisOffsetStore(client, broker=BROKER, prefix=prefix, wait=short)
        await store.open()
        try:
            await store.ensure_table("g", "", [0], NOW)
            first = await store.lease("g", "", [QueueBounds(0, 0, 30)], now_ms=NOW, **LEASE_ARGS)
            assert first is not None
            with pytest.raises(Unavailable):
                await store.ack_and_lease(
                    tok(first), "g", "", [QueueBounds(0, 0, 30)], now_ms=NOW + 1, **LEASE_ARGS
                )
            table = await store.table("g", "")
            assert table is not None
            entry = table[0]
            # The ack was written (a wait cannot undo it); no new lock was taken after it.
            assert (entry.committed, entry.lock_deadline_ms, entry.attempts) == (10, 0, 0)
        finally:
            await store.close()
            await client.aclose()

    asyncio.run(go())
