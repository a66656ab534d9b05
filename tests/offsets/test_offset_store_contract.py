"""The offset-store contract, one suite for every backend (the Redis backend joins the list)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from mqgate import redisio
from mqgate.core.tokens import AckToken
from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import NotFound
from mqgate.model import QueueBounds
from mqgate.offsets.backends.embedded import EmbeddedOffsetStore
from mqgate.offsets.backends.redis import RedisOffsetStore
from mqgate.offsets.backends.remote import RemoteOffsetStore
from mqgate.offsets.interface import Lease, OffsetStore
from tests.conftest import require_service
from tests.storeproc.served import Served

NOW = 10_000_000
LEASE = {"max_count": 10, "lock_timeout_ms": 1000, "max_attempts": 3, "owner": "t"}


async def embedded(path: Path) -> tuple[OffsetStore, Callable[[], Awaitable[None]]]:
    committer = GroupCommitter(None)
    committer.start()
    store = EmbeddedOffsetStore(path, committer)
    await store.open()

    async def close() -> None:
        await store.close()
        await committer.stop()

    return store, close


REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"
# tmp_path -> the test's key prefix: a reopened store (a "restart") finds the same keys.
_REDIS_PREFIXES: dict[Path, str] = {}


async def redis_backend(path: Path) -> tuple[OffsetStore, Callable[[], Awaitable[None]]]:
    client = redisio.connect(REDIS_URL)
    store = RedisOffsetStore(client, broker="local", prefix=_REDIS_PREFIXES[path])
    await store.open()

    async def close() -> None:
        await store.close()
        await client.aclose()  # the store does not own its client

    return store, close


async def remote(path: Path) -> tuple[OffsetStore, Callable[[], Awaitable[None]]]:
    """The embedded offset store behind a store process's server (`serve --workers N`)."""
    served = await Served(path).start()
    store = RemoteOffsetStore(await served.client())
    await store.open()
    return store, served.stop


BACKENDS = {"embedded": embedded, "redis": redis_backend, "remote": remote}


def redis_test_prefix() -> str:
    return "mqtest-" + secrets.token_hex(8)


def fresh_redis_prefix() -> Iterator[str]:
    """A fixture's body: a key prefix on the machine's Redis for one test, its keys deleted after."""
    require_service(REDIS_HOST, REDIS_PORT, "Redis")
    prefix = redis_test_prefix()
    try:
        yield prefix
    finally:
        delete_redis_keys(prefix)


def delete_redis_keys(prefix: str) -> None:
    """Delete this test's keys only: the server is shared with other tests."""
    with redis.Redis(host=REDIS_HOST, port=REDIS_PORT) as client:
        keys = list(client.scan_iter(match=prefix + ":*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture(params=sorted(BACKENDS))
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[Path], Awaitable[tuple[OffsetStore, Any]]]]:
    if request.param != "redis":
        yield BACKENDS[request.param]
        return
    require_service(REDIS_HOST, REDIS_PORT, "Redis")
    prefix = _REDIS_PREFIXES[tmp_path] = redis_test_prefix()
    try:
        yield BACKENDS[request.param]
    finally:
        del _REDIS_PREFIXES[tmp_path]
        delete_redis_keys(prefix)


def bounds(*maxes: int) -> list[QueueBounds]:
    return [QueueBounds(queue=i, min=0, max=m) for i, m in enumerate(maxes)]


def token(lease: Lease, group: str = "g", client: str = "") -> AckToken:
    return AckToken(group, client, "local", lease.queue, lease.offset, lease.next_offset, lease.lock_ts)


def run(backend: Any, tmp_path: Path, body: Callable[[OffsetStore], Awaitable[None]]) -> None:
    async def go() -> None:
        store, close = await backend(tmp_path)
        try:
            await body(store)
        finally:
            await close()

    asyncio.run(go())


def test_lease_locks_the_fullest_queue_and_ack_commits(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        assert await s.ensure_table("g", "", [0, 0], NOW)
        assert not await s.ensure_table("g", "", [5, 5], NOW)
        a = await s.lease("g", "", bounds(3, 20), now_ms=NOW, **LEASE)
        assert a is not None and (a.queue, a.offset, a.next_offset, a.attempts) == (1, 0, 10, 1)
        b = await s.lease("g", "", bounds(3, 20), now_ms=NOW, **LEASE)
        assert b is not None and b.queue == 0  # queue 1 is locked
        assert await s.lease("g", "", bounds(3, 20), now_ms=NOW, **LEASE) is None
        assert await s.ack(token(a), NOW + 1) is None
        table = await s.table("g", "")
        assert table is not None and table[1].committed == 10 and table[1].attempts == 0
        assert await s.ack(token(a), NOW + 2) == "already_acked"

    run(backend, tmp_path, body)


def test_a_retried_ack_is_already_acked_not_a_lost_lock(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await s.lease("g", "", bounds(30), now_ms=NOW, **LEASE)
        assert first is not None and await s.ack(token(first), NOW + 1) is None
        # The next batch of the same queue is leased before the retry of the first ack arrives.
        second = await s.lease("g", "", bounds(30), now_ms=NOW + 2, **LEASE)
        assert second is not None and second.offset == 10
        assert await s.ack(token(first), NOW + 3) == "already_acked"
        assert await s.release(token(first), NOW + 3) == "already_acked"
        assert await s.extend(token(first), NOW + 3, 5) == "already_acked"
        assert await s.ack(token(second), NOW + 4) is None
        assert await s.ack(token(first), NOW + 5) == "offset_moved"  # only the last commit is known
        # A lost lock is still told apart: a lease taken over after its lock expired.
        third = await s.lease("g", "", bounds(30), now_ms=NOW + 6, **LEASE)
        assert third is not None
        fourth = await s.lease("g", "", bounds(30), now_ms=NOW + 2000, **LEASE)
        assert fourth is not None and fourth.offset == third.offset
        assert await s.ack(token(fourth), NOW + 2001) is None
        assert await s.ack(token(third), NOW + 2002) == "offset_moved"
        assert await s.ack(token(fourth), NOW + 2003) == "already_acked"

    run(backend, tmp_path, body)


def test_ack_and_lease_acks_then_leases_whatever_the_ack_answered(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await s.lease("g", "", bounds(25), now_ms=NOW, **LEASE)
        assert first is not None
        # The ack frees the queue, so the lease in the same step takes its next batch.
        got = await s.ack_and_lease(token(first), "g", "", bounds(25), now_ms=NOW + 1, **LEASE)
        second = got.lease
        assert got.refusal is None and got.lease_error is None
        assert second is not None and (second.queue, second.offset, second.next_offset) == (0, 10, 20)
        table = await s.table("g", "")
        assert table is not None and table[0].committed == 10 and table[0].acked_lock_ts == first.lock_ts
        # A retried ack is refused, and the lease still runs: the queue is locked, nothing is free.
        got = await s.ack_and_lease(token(first), "g", "", bounds(25), now_ms=NOW + 2, **LEASE)
        assert (got.refusal, got.lease, got.lease_error) == ("already_acked", None, None)
        # A refused ack leaves the lock alone; its lease takes what is free.
        await s.ensure_table("g", "", [0, 0], NOW + 3)
        got = await s.ack_and_lease(token(first), "g", "", bounds(25, 5), now_ms=NOW + 3, **LEASE)
        assert got.refusal == "already_acked" and got.lease is not None and got.lease.queue == 1
        got = await s.ack_and_lease(token(second), "g", "", bounds(25, 5), now_ms=NOW + 4, **LEASE)
        last = got.lease
        assert (
            got.refusal is None
            and last is not None
            and (last.queue, last.offset, last.next_offset) == (0, 20, 25)
        )
        # An ack without a table fails, and nothing is done.
        with pytest.raises(NotFound):
            await s.ack_and_lease(token(last, group="h"), "h", "", bounds(25), now_ms=NOW + 5, **LEASE)

    run(backend, tmp_path, body)


def test_ack_and_lease_with_a_token_of_another_client_acks_its_table(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "a", [0], NOW)
        await s.ensure_table("g", "b", [0], NOW)
        la = await s.lease("g", "a", bounds(4), now_ms=NOW, **LEASE)
        assert la is not None
        got = await s.ack_and_lease(token(la, client="a"), "g", "b", bounds(4), now_ms=NOW + 1, **LEASE)
        lb = got.lease
        assert got.refusal is None and lb is not None and lb.offset == 0
        tables = await s.table("g", "a"), await s.table("g", "b")
        assert tables[0] is not None and tables[0][0].committed == 4
        assert tables[1] is not None and tables[1][0].committed == 0 and tables[1][0].lock_ts == lb.lock_ts
        # The lease's table is gone (an expired client): the ack is done and answered, and the
        # lease's error comes with it.
        la = await s.lease("g", "a", bounds(8), now_ms=NOW + 2, **LEASE)
        assert la is not None
        got = await s.ack_and_lease(token(la, client="a"), "g", "gone", bounds(8), now_ms=NOW + 3, **LEASE)
        assert got.refusal is None and got.lease is None and isinstance(got.lease_error, NotFound)
        table = await s.table("g", "a")
        assert table is not None and table[0].committed == 8

    run(backend, tmp_path, body)


def test_expired_lock_is_reclaimed_and_old_token_refused(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await s.lease("g", "", bounds(5), now_ms=NOW, **LEASE)
        assert first is not None
        assert await s.ack(token(first), NOW + 1500) == "lock_expired"
        second = await s.lease("g", "", bounds(5), now_ms=NOW + 1500, **LEASE)
        assert second is not None and second.offset == 0 and second.attempts == 2
        assert second.lock_ts != first.lock_ts
        assert await s.ack(token(first), NOW + 1600) == "lock_taken"
        assert await s.ack(token(second), NOW + 1600) is None

    run(backend, tmp_path, body)


def test_release_makes_the_batch_available_at_once(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await s.lease("g", "", bounds(5), now_ms=NOW, **LEASE)
        assert first is not None
        assert await s.release(token(first), NOW) is None
        again = await s.lease("g", "", bounds(5), now_ms=NOW, **LEASE)
        assert again is not None and again.offset == 0 and again.attempts == 2
        assert again.lock_ts > first.lock_ts
        assert await s.release(token(first), NOW) == "lock_taken"

    run(backend, tmp_path, body)


def test_extend_keeps_the_lock(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        lease = await s.lease("g", "", bounds(5), now_ms=NOW, **LEASE)
        assert lease is not None
        assert await s.extend(token(lease), NOW + 900, 10) is None
        assert await s.lease("g", "", bounds(5), now_ms=NOW + 5000, **LEASE) is None
        assert await s.ack(token(lease), NOW + 9000) is None

    run(backend, tmp_path, body)


def test_attempts_run_out_into_a_dead_letter_lease(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        now = NOW
        for attempt in (1, 2, 3):
            lease = await s.lease("g", "", bounds(5), now_ms=now, **LEASE)
            assert lease is not None and lease.attempts == attempt and not lease.dead_letter
            now += 2000
        dead = await s.lease("g", "", bounds(5), now_ms=now, **LEASE)
        assert dead is not None and dead.dead_letter and (dead.offset, dead.next_offset) == (0, 5)
        assert await s.record_dead_letters(token(dead), 5, now) is None
        table = await s.table("g", "")
        assert table is not None and table[0].committed == 5 and table[0].dead_lettered == 5

    run(backend, tmp_path, body)


def test_a_batch_s_redeliveries_keep_the_lock_ts_of_its_first_delivery(backend: Any, tmp_path: Path) -> None:
    """`first_lock_ts` names one batch's round of deliveries (what the retry holds are keyed
    by): the same on each redelivery and the dead-letter lease, new for the next batch and for
    the same offsets leased again after a reset."""

    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await s.lease("g", "", bounds(5), now_ms=NOW, **LEASE)
        assert first is not None and first.first_lock_ts == first.lock_ts
        now, leases = NOW, []
        for _ in range(3):  # two redeliveries, then the dead-letter lease (max_attempts 3)
            now += 2000
            lease = await s.lease("g", "", bounds(5), now_ms=now, **LEASE)
            assert lease is not None and lease.lock_ts > first.lock_ts
            leases.append(lease)
        assert [(x.attempts, x.dead_letter, x.first_lock_ts) for x in leases] == [
            (2, False, first.lock_ts),
            (3, False, first.lock_ts),
            (3, True, first.lock_ts),
        ]
        assert await s.record_dead_letters(token(leases[-1]), 5, now) is None
        table = await s.table("g", "")
        assert table is not None and table[0].first_lock_ts == first.lock_ts
        await s.reset("g", "", 0, 0)
        again = await s.lease("g", "", bounds(5), now_ms=now, **LEASE)
        assert again is not None and again.offset == 0 and again.first_lock_ts == again.lock_ts > now - 1

    run(backend, tmp_path, body)


def test_broadcast_clients_have_their_own_offsets_and_expire(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "a", [0], NOW)
        await s.ensure_table("g", "b", [0], NOW + 5000)
        la = await s.lease("g", "a", bounds(4), now_ms=NOW, **LEASE)
        lb = await s.lease("g", "b", bounds(4), now_ms=NOW + 5000, **LEASE)
        assert la is not None and lb is not None and la.offset == lb.offset == 0
        assert await s.ack(token(la, client="a"), NOW + 1) is None
        assert await s.clients("g") == ["a", "b"]
        assert await s.expire_clients("g", idle_before_ms=NOW + 4000) == ["a"]
        assert await s.clients("g") == ["b"]

    run(backend, tmp_path, body)


def test_reset_moves_the_offset_and_drops_the_lock(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        lease = await s.lease("g", "", bounds(50), now_ms=NOW, **LEASE)
        assert lease is not None
        await s.reset("g", "", 0, 40)
        assert await s.ack(token(lease), NOW + 1) == "offset_moved"
        again = await s.lease("g", "", bounds(50), now_ms=NOW + 2, **LEASE)
        assert again is not None and (again.offset, again.next_offset, again.attempts) == (40, 50, 1)

    run(backend, tmp_path, body)


def test_advance_only_raises_committed_offsets_and_survives_a_restart(backend: Any, tmp_path: Path) -> None:
    async def first(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 5, 0], NOW)
        assert await s.advance("g", "", {0: 30, 1: 2}, NOW) == {0: 30, 1: 5}  # 1 is not lowered
        assert await s.advance("g", "", {0: 30, 1: 2}, NOW) == {0: 30, 1: 5}  # a replay changes nothing
        with pytest.raises(IndexError):
            await s.advance("g", "", {2: 9, 3: 1}, NOW)
        table = await s.table("g", "")
        assert table is not None and [e.committed for e in table] == [30, 5, 0]  # nothing half-done
        lease = await s.lease("g", "", bounds(40, 5, 0), now_ms=NOW, **LEASE)
        assert lease is not None and (lease.queue, lease.offset) == (0, 30)
        await s.advance("g", "", {0: 40}, NOW)
        assert await s.ack(token(lease), NOW + 1) == "offset_moved"  # never moves it back

    async def second(s: OffsetStore) -> None:
        table = await s.table("g", "")
        assert table is not None and [e.committed for e in table] == [40, 5, 0]

    run(backend, tmp_path, first)
    run(backend, tmp_path, second)


def test_committed_offsets_and_clients_survive_a_restart(backend: Any, tmp_path: Path) -> None:
    async def first(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0], NOW)
        await s.ensure_table("b", "c1", [3], NOW)
        lease = await s.lease("g", "", bounds(7, 0), now_ms=NOW, **LEASE)
        assert lease is not None
        assert await s.ack(token(lease), NOW) is None

    async def second(s: OffsetStore) -> None:
        table = await s.table("g", "")
        assert table is not None and [e.committed for e in table] == [7, 0]
        assert await s.clients("b") == ["c1"]

    run(backend, tmp_path, first)
    run(backend, tmp_path, second)


def test_a_table_grows_when_the_topic_gains_queues(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        assert await s.ensure_table("g", "", [0, 0], NOW)
        lease = await s.lease("g", "", bounds(3, 0), now_ms=NOW, **LEASE)
        assert lease is not None and await s.ack(token(lease), NOW) is None
        assert not await s.ensure_table("g", "", [9, 9, 4], NOW)
        table = await s.table("g", "")
        assert table is not None and [e.committed for e in table] == [3, 0, 4]

    run(backend, tmp_path, body)


def test_an_unacked_batch_comes_back_as_the_same_range(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await s.lease("g", "", bounds(4), now_ms=NOW, **LEASE)
        assert first is not None and (first.offset, first.next_offset) == (0, 4)
        assert await s.release(token(first), NOW) is None
        # More messages arrived, but the redelivery is the batch that was not acked.
        again = await s.lease("g", "", bounds(30), now_ms=NOW, **LEASE)
        assert again is not None and (again.offset, again.next_offset, again.attempts) == (0, 4, 2)
        # A smaller pull cuts it.
        assert await s.release(token(again), NOW) is None
        small = await s.lease("g", "", bounds(30), now_ms=NOW, **{**LEASE, "max_count": 2})
        assert small is not None and (small.offset, small.next_offset, small.attempts) == (0, 2, 3)
        assert await s.ack(token(small), NOW) is None
        fresh = await s.lease("g", "", bounds(30), now_ms=NOW, **LEASE)
        assert fresh is not None and (fresh.offset, fresh.next_offset, fresh.attempts) == (2, 12, 1)

    run(backend, tmp_path, body)


def test_a_higher_lane_is_served_first(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0, 0], NOW)
        lanes = [QueueBounds(0, 0, 50, lane=0), QueueBounds(1, 0, 2, lane=1), QueueBounds(2, 0, 3, lane=1)]
        order = []
        for _ in range(3):
            lease = await s.lease("g", "", lanes, now_ms=NOW, **LEASE)
            assert lease is not None
            order.append(lease.queue)
        assert order == [2, 1, 0]  # lane 1 first (fuller queue first), then lane 0

    run(backend, tmp_path, body)


def test_the_rate_limit_bucket_is_shared_and_refills(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        assert await s.take_tokens("g", 10.0, 25, NOW) == (10, 0.0)
        granted, retry = await s.take_tokens("g", 10.0, 5, NOW)
        assert granted == 0 and 0 < retry <= 0.1
        await s.return_tokens("g", 10.0, 4)
        assert (await s.take_tokens("g", 10.0, 25, NOW))[0] == 4
        assert (await s.take_tokens("g", 10.0, 25, NOW + 500))[0] == 5  # 0.5 s at 10/s
        assert (await s.take_tokens("other", 10.0, 3, NOW))[0] == 3

    run(backend, tmp_path, body)


def test_dropping_a_group_removes_every_table_and_survives_a_restart(backend: Any, tmp_path: Path) -> None:
    async def first(s: OffsetStore) -> None:
        await s.ensure_table("gone", "", [0, 0], NOW)
        await s.ensure_table("gone", "c1", [0], NOW)
        await s.ensure_table("kept", "", [5], NOW)
        lease = await s.lease("gone", "", bounds(3, 0), now_ms=NOW, **LEASE)
        assert lease is not None and await s.ack(token(lease, "gone"), NOW) is None
        await s.drop_group("gone")
        assert await s.table("gone", "") is None and await s.clients("gone") == []
        await s.drop_group("never-there")  # nothing to drop is not an error

    async def second(s: OffsetStore) -> None:
        assert await s.table("gone", "") is None and await s.table("gone", "c1") is None
        kept = await s.table("kept", "")
        assert kept is not None and [e.committed for e in kept] == [5]
        assert await s.ensure_table("gone", "", [1, 1], NOW)  # a new group of the same name starts anew

    run(backend, tmp_path, first)
    run(backend, tmp_path, second)
