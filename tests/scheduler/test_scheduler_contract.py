"""The scheduler contract, one suite for every backend: embedded (log + memory) and Redis.

Redis runs on 127.0.0.1:6379 and is shared: every test uses its own random key prefix and
deletes its keys afterwards. Without Redis the Redis cases fail in CI and skip loudly elsewhere.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import BadRequest, Unavailable
from mqgate.redisio import ReplicaWait, connect
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.backends.redis import RedisScheduler
from mqgate.scheduler.backends.redis.scheduler import MOVE_CAP
from mqgate.scheduler.backends.remote import RemoteScheduler
from mqgate.scheduler.interface import Destination, Due, Scheduler
from tests.conftest import require_service
from tests.storeproc.served import Served

NOW = 1_763_000_000_000
REDIS_URL = "redis://127.0.0.1:6379/0"


class Harness(Protocol):
    scheduler: Scheduler

    async def reopen(self) -> Scheduler:
        """Close every instance and open a new one over the same data (a restart)."""

    async def peer(self) -> Scheduler:
        """The scheduler as another gateway sees it (Redis: its own client and instance)."""


class EmbeddedHarness:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.committer = GroupCommitter(None)
        self.scheduler: Scheduler = EmbeddedScheduler(directory, self.committer)

    async def reopen(self) -> Scheduler:
        await self.scheduler.close()
        self.scheduler = EmbeddedScheduler(self.directory, self.committer)
        await self.scheduler.open()
        return self.scheduler

    async def peer(self) -> Scheduler:
        return self.scheduler  # one process owns the log: every task shares the instance


@asynccontextmanager
async def embedded(tmp_path: Path) -> AsyncIterator[EmbeddedHarness]:
    h = EmbeddedHarness(tmp_path / "scheduler")
    h.committer.start()
    await h.scheduler.open()
    try:
        yield h
    finally:
        await h.scheduler.close()
        await h.committer.stop()


class RedisHarness:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.clients: list[Any] = []
        self.instances: list[RedisScheduler] = []
        self.scheduler: Scheduler = self._new()

    def _new(self) -> RedisScheduler:
        client = connect(REDIS_URL)
        self.clients.append(client)
        s = RedisScheduler(client, prefix=self.prefix, name="contract")
        self.instances.append(s)
        return s

    async def reopen(self) -> Scheduler:
        await self.close_all()
        self.scheduler = self._new()
        await self.scheduler.open()
        return self.scheduler

    async def peer(self) -> Scheduler:
        s = self._new()
        await s.open()
        return s

    async def close_all(self) -> None:
        for s in self.instances:
            await s.close()
        for c in self.clients:
            await c.aclose()
        self.instances, self.clients = [], []


@asynccontextmanager
async def redis_backend(tmp_path: Path) -> AsyncIterator[RedisHarness]:
    h = RedisHarness("test-sched-" + secrets.token_hex(6))
    await h.scheduler.open()
    try:
        yield h
    finally:
        await h.close_all()
        cleaner = connect(REDIS_URL)
        try:
            keys = [k async for k in cleaner.scan_iter(match=h.prefix + ":*", count=1000)]
            if keys:
                await cleaner.delete(*keys)
            assert not [k async for k in cleaner.scan_iter(match=h.prefix + ":*")]
        finally:
            await cleaner.aclose()


class RemoteHarness:
    """The embedded scheduler behind a store process's server (`serve --workers N`); a peer
    is another worker's connection."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.scheduler: Scheduler = RemoteScheduler(served.clients[0])

    async def reopen(self) -> Scheduler:
        await self.served.restart()
        self.scheduler = RemoteScheduler(await self.served.client())
        return self.scheduler

    async def peer(self) -> Scheduler:
        return RemoteScheduler(await self.served.client())


@asynccontextmanager
async def remote(tmp_path: Path) -> AsyncIterator[RemoteHarness]:
    served = await Served(tmp_path).start()
    await served.client()
    try:
        yield RemoteHarness(served)
    finally:
        await served.stop()


BACKENDS = {"embedded": embedded, "redis": redis_backend, "remote": remote}
Body = Callable[[Harness], Awaitable[None]]


@pytest.fixture(params=sorted(BACKENDS))
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Body], None]:
    if request.param == "redis":
        require_service("127.0.0.1", 6379, "Redis")
    factory = BACKENDS[request.param]

    def go(body: Body) -> None:
        async def main() -> None:
            async with factory(tmp_path) as harness:
                await body(harness)

        asyncio.run(main())

    return go


def dest(target: str, start: int = 0, priority: int = 0, deadline: int = 0) -> Destination:
    return Destination(target, NOW + start, NOW + deadline if deadline else 0, priority)


def keys(batch: list[Due]) -> list[tuple[int, int]]:
    return [(d.seq, d.index) for d in batch]


# --- hold, claim, order -----------------------------------------------------------------------


def test_seqs_are_unique_and_increasing_and_never_reused(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        assert await s.hold([]) == []
        a = await s.hold([(b"1", [dest("t")]), (b"2", [dest("t")])])
        b = await s.hold([(b"3", [dest("t")])])
        assert a[0] < a[1] < b[0]
        await s.settle([(b[0], 0)])  # the newest message is gone: its seq must not come back
        s = await h.reopen()
        c = await s.hold([(b"4", [dest("t")])])
        assert c[0] > b[0]
        stats = await s.stats()
        assert (stats.held_messages, stats.held_destinations) == (3, 3)

    run(body)


def test_only_due_destinations_are_claimed_best_priority_first(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        seqs = await s.hold(
            [
                (b"low", [dest("a", start=0, priority=1)]),
                (b"high-late", [dest("b", start=5, priority=8)]),
                (b"high-early", [dest("c", start=2, priority=8), dest("c2", start=1000, priority=9)]),
                (b"future", [dest("d", start=500, priority=9)]),
            ]
        )
        assert await s.next_due_ms() == NOW
        assert await s.claim_due(NOW - 1, 10, 1000) == []
        got = await s.claim_due(NOW + 10, 10, 1000)
        assert keys(got) == [(seqs[2], 0), (seqs[1], 0), (seqs[0], 0)]
        assert [d.payload for d in got] == [b"high-early", b"high-late", b"low"]
        assert got[0].destination == dest("c", start=2, priority=8)
        assert all(d.attempt == 1 and not d.expired for d in got)
        assert await s.next_due_ms() == NOW + 500  # the earliest unclaimed start
        assert keys(await s.claim_due(NOW + 1000, 10, 5000)) == [(seqs[3], 0), (seqs[2], 1)]

    run(body)


def test_same_priority_goes_by_start_then_seq(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        seqs = await s.hold([(b"", [dest("t", start=st, priority=4)]) for st in (30, 10, 30, 20)])
        got = await s.claim_due(NOW + 100, 2, 1000)
        assert keys(got) == [(seqs[1], 0), (seqs[3], 0)]
        got = await s.claim_due(NOW + 100, 10, 1000)
        assert keys(got) == [(seqs[0], 0), (seqs[2], 0)]

    run(body)


def test_priority_order_is_exact_across_a_large_due_backlog(run: Callable[[Body], None]) -> None:
    """More due members than one Redis claim call moves: the best of all of them come first."""

    async def body(h: Harness) -> None:
        s = h.scheduler
        rng = random.Random(3)
        n = MOVE_CAP * 2 + 123
        prios = [rng.randrange(9) for _ in range(n)]
        top = rng.randrange(1000)  # in the first batch: the latest start, the last one moved
        prios[top] = 9
        for i in range(0, n, 1000):
            await s.hold([(b"", [dest("t", start=-i, priority=p)]) for p in prios[i : i + 1000]])
        got = await s.claim_due(NOW, 5, 1000)
        assert got[0].seq == top + 1 and got[0].destination.priority == 9
        assert [d.destination.priority for d in got[1:]] == [8, 8, 8, 8]
        assert (await s.stats()).held_destinations == n

    run(body)


# --- claims ---------------------------------------------------------------------------------


def test_a_claim_hides_a_destination_until_it_expires(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        [seq] = await s.hold([(b"x", [dest("t")])])
        assert keys(await s.claim_due(NOW, 10, 1000)) == [(seq, 0)]
        assert await s.claim_due(NOW + 999, 10, 1000) == []
        assert (await s.stats()).claimed == 1
        assert await s.next_due_ms() == NOW + 1000  # when the claim runs out
        again = await s.claim_due(NOW + 1000, 10, 1000)
        assert keys(again) == [(seq, 0)] and again[0].attempt == 2

    run(body)


def test_two_gateways_never_hold_the_same_claim(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        other = await h.peer()
        n = 600
        for _ in range(0, n, 200):
            await s.hold([(b"", [dest("a", priority=j % 10), dest("b")]) for j in range(200)])
        claimed: list[tuple[int, int]] = []

        async def claimer(sched: Scheduler) -> None:
            while batch := await sched.claim_due(NOW, 7, 60_000):
                claimed.extend(keys(batch))
                await asyncio.sleep(0)

        await asyncio.gather(*(claimer(x) for x in (s, other, s, other)))
        assert len(claimed) == 2 * n
        assert len(set(claimed)) == 2 * n

    run(body)


def test_expired_destinations_are_handed_out_flagged(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        [seq] = await s.hold([(b"x", [dest("late", start=0, deadline=10), dest("ok", start=5)])])
        got = await s.claim_due(NOW + 11, 10, 1000)
        assert [(d.index, d.expired) for d in got] == [(0, True), (1, False)]
        assert got[0].seq == seq

    run(body)


# --- settle ----------------------------------------------------------------------------------


def test_settle_removes_destinations_then_the_message(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        [seq, other] = await s.hold(
            [(b"two", [dest("a"), dest("b", start=50)]), (b"keep", [dest("k", start=9999)])]
        )
        await s.claim_due(NOW, 10, 100_000)
        await s.settle([(seq, 0)])
        stats = await s.stats()
        assert (stats.held_messages, stats.held_destinations, stats.claimed) == (2, 2, 0)
        got = await s.claim_due(NOW + 50, 10, 1000)
        assert keys(got) == [(seq, 1)] and got[0].payload == b"two"
        await s.settle([(seq, 1), (seq, 1), (seq, 0), (10**9, 0), (other, 7)])  # repeats, unknowns
        stats = await s.stats()
        assert (stats.held_messages, stats.held_destinations, stats.claimed) == (1, 1, 0)
        s = await h.reopen()
        assert keys(await s.claim_due(NOW + 10_000, 10, 1000)) == [(other, 0)]

    run(body)


def test_held_for_counts_each_target_s_destinations_until_settled(run: Callable[[Body], None]) -> None:
    """What SQS answers as ApproximateNumberOfMessagesDelayed: per target, held and not
    delivered (claimed ones included), across a restart and repeated settles."""

    async def body(h: Harness) -> None:
        s = h.scheduler
        [one, two, three] = await s.hold(
            [
                (b"1", [dest("t:a", start=10), dest("t:b", start=10)]),
                (b"2", [dest("t:a", start=20)]),
                (b"3", [dest("t:a", start=9999)]),
            ]
        )
        assert [await s.held_for(t) for t in ("t:a", "t:b", "t:none")] == [3, 1, 0]
        await s.hold([(b"4", [dest("t:b", start=5)])])  # counted while counting
        assert await s.held_for("t:b") == 2
        await s.claim_due(NOW + 20, 10, 100_000)  # claimed: not delivered yet
        assert await s.held_for("t:a") == 3
        await s.settle([(one, 0), (one, 0), (two, 0)])
        assert [await s.held_for("t:a"), await s.held_for("t:b")] == [1, 2]
        s = await h.reopen()
        assert [await s.held_for("t:a"), await s.held_for("t:b")] == [1, 2]
        await s.settle([(three, 0), (one, 1)])
        assert [await s.held_for("t:a"), await s.held_for("t:b")] == [0, 1]

    run(body)


def test_held_messages_survive_a_restart(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        payload = bytes(range(256)) * 3
        [a, b] = await s.hold([(payload, [dest("x", start=7, priority=2)]), (b"", [dest("y", start=3)])])
        s = await h.reopen()
        got = await s.claim_due(NOW + 10, 10, 1000)
        assert keys(got) == [(a, 0), (b, 0)]
        assert got[0].payload == payload and got[0].destination == dest("x", start=7, priority=2)

    run(body)


def test_invalid_destinations_are_refused(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        for bad in ([], [dest("t", priority=10)], [Destination("t", NOW, NOW - 1, 0)]):
            with pytest.raises(BadRequest):
                await s.hold([(b"x", bad)])
        assert (await s.stats()).held_messages == 0
        assert await s.next_due_ms() is None

    run(body)


# --- waiting ----------------------------------------------------------------------------------


def test_wait_returns_early_when_a_hold_is_due_sooner(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        other = await h.peer()
        await s.hold([(b"", [dest("t", start=3_600_000)])])
        assert await s.next_due_ms() == NOW + 3_600_000

        t0 = time.monotonic()
        await s.wait(0.2)  # nothing new: the full timeout
        assert time.monotonic() - t0 >= 0.19

        await s.next_due_ms()
        waiter = asyncio.ensure_future(s.wait(20))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        t0 = time.monotonic()
        await other.hold([(b"", [dest("t", start=0)])])  # another gateway, for Redis
        await asyncio.wait_for(waiter, 5)
        assert time.monotonic() - t0 < 5
        assert await s.next_due_ms() == NOW

    run(body)


def test_a_hold_between_next_due_and_wait_is_not_missed(run: Callable[[Body], None]) -> None:
    async def body(h: Harness) -> None:
        s = h.scheduler
        await s.hold([(b"", [dest("t", start=3_600_000)])])
        await s.next_due_ms()
        await s.hold([(b"", [dest("t", start=10)])])
        t0 = time.monotonic()
        await s.wait(10)
        assert time.monotonic() - t0 < 5

    run(body)


# --- hold keys (Redis: a hold that answered an error may have been written) ------------------


def test_a_keyed_hold_is_held_once_until_its_key_is_forgotten(run: Callable[[Body], None]) -> None:
    """A hold whose replica wait fell short answers `Unavailable` but is written; tried again
    (by this gateway or another) under the same key it holds nothing and answers the first seq.
    A forgotten key, or one whose time ran out, holds anew. (The embedded backends ignore keys:
    a hold there that raised was not written.)"""

    async def body(h: Harness) -> None:
        s = h.scheduler
        if not isinstance(s, RedisScheduler):
            return
        other = await h.peer()
        # More replicas than any test deployment has: every wait falls short.
        stalled = RedisScheduler(s.client, prefix=h.prefix, name="contract", wait=ReplicaWait(64, 10))
        lapsing = RedisScheduler(s.client, prefix=h.prefix, name="contract", keep_keys_ms=-1)
        for x in (stalled, lapsing):
            await x.open()
        with pytest.raises(Unavailable):
            await stalled.hold([(b"a", [dest("t")]), (b"b", [dest("t")])], ["ka", "kb"])
        [a, b] = [d.seq for d in await s.claim_due(NOW, 10, 1000)]  # written all the same
        items = [(b"a2", [dest("t")]), (b"c", [dest("t")]), (b"d", [dest("t")])]
        again = await other.hold(items, ["ka", "kc", ""])
        assert again[0] == a and again[1] > b and again[2] == again[1] + 1
        assert await s.hold([(b"b2", [dest("t")])], ["kb"]) == [b]
        stats = await s.stats()
        assert (stats.held_messages, stats.held_destinations) == (4, 4)
        assert sorted(d.payload for d in await s.claim_due(NOW, 10, 1000)) == [b"c", b"d"]
        with pytest.raises(ValueError):
            await s.hold([(b"x", [dest("t")])], ["k1", "k2"])

        await other.forget(["ka", "nothing"])
        [a3] = await s.hold([(b"a3", [dest("t")])], ["ka"])
        assert a3 > again[2]
        assert await s.hold([(b"b3", [dest("t")])], ["kb"]) == [b]  # still kept

        # A key whose time ran out goes with the next hold, keyed or not (kept until 1 ms ago).
        [e] = await lapsing.hold([(b"e", [dest("t")])], ["ke"])
        [e2] = await lapsing.hold([(b"e2", [dest("t")])], ["ke"])
        assert e2 > e
        assert await s.client.hlen(s.keys[9]) == 4  # ka, kb, kc and the second ke
        await s.hold([(b"f", [dest("t")])])
        assert await s.client.hlen(s.keys[9]) == 3
        assert await s.client.zcard(s.keys[10]) == 3
        for x in (stalled, lapsing):
            await x.close()

    run(body)
