"""A batch redelivered through the retry queue (SPEC S5) is held once on Redis with a replica
wait, although its hold answered an error after it was written.

With MQGATE_REDIS_WAIT_REPLICAS, a hold whose replica wait times out answers `Unavailable`, but
the primary has it. The pull fails, the batch stays locked, and once its lock runs out it is
leased again and held again: each failed try used to add one more copy of every message to the
retry queue, so a consumer acked one copy and then got the next (the Sentinel failover test's
`delivered_again_after_ack`). The gateway's own redelivery code runs here on the real Redis
backends of 127.0.0.1:6379: waiting for one replica more than the server has makes every wait
fall short, as while a failover's new primary has no replica yet; stores without the wait play
the replica that is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqgate import redisio
from mqgate.errors import Unavailable
from mqgate.metrics import Metrics
from mqgate.model import QueueBounds, StoredMessage, decode_stored
from mqgate.offsets.backends.redis import RedisOffsetStore
from mqgate.offsets.interface import Lease
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import ConsumerRecord
from mqgate.registry.sql import SqlRegistry
from mqgate.scheduler.backends.redis import RedisScheduler
from mqgate.services.context import Context, now_ms
from mqgate.services.observers import Observers
from mqgate.services.qos import delivered_form
from mqgate.services.redelivery import DELIVERIES_PROPERTY, Redelivery
from mqgate.settings import load_settings
from mqgate.store.backends.redis import RedisStore
from tests.conftest import run_bounded
from tests.offsets.test_offset_store_contract import (
    REDIS_URL,
    fresh_redis_prefix,
)

BROKER = "local"
LOCK_MS = 1000
BATCH = 5
CONSUMER = ConsumerRecord(
    name="c",
    topic="t",
    mode="cluster",
    start="earliest",
    lock_timeout_s=LOCK_MS / 1000,
    max_attempts=16,
    paused=False,
    rate_limit_per_s=0,
    alert_backlog=0,
    token_hash="",
    created_ms=0,
)


@pytest.fixture
def prefix() -> Iterator[str]:
    yield from fresh_redis_prefix()


def message(offset: int) -> tuple[int, StoredMessage]:
    return offset, StoredMessage(f"id{offset}", 1, "p", f"body{offset}", [], [], {})


def test_a_hold_written_despite_its_error_is_not_held_again_when_the_batch_comes_back(
    prefix: str, tmp_path: Path
) -> None:
    async def go() -> None:
        client = redisio.connect(REDIS_URL)
        replicas = int((await client.info("replication"))["connected_slaves"])
        short = redisio.ReplicaWait(replicas + 1, 10)  # every replica wait falls short
        settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
        registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
        store = RedisStore(client, broker=BROKER, prefix=prefix)  # only wakes readers here

        def gateway(wait: redisio.ReplicaWait | None) -> tuple[Redelivery, RedisOffsetStore, RedisScheduler]:
            offsets = RedisOffsetStore(client, broker=BROKER, prefix=prefix, wait=wait)
            scheduler = RedisScheduler(client, prefix=prefix, wait=wait)
            ctx = Context(settings, store, offsets, scheduler, registry, Metrics(), b"k" * 32)
            return Redelivery(ctx, Observers()), offsets, scheduler

        stalled, stalled_offsets, stalled_scheduler = gateway(short)
        back, offsets, scheduler = gateway(None)
        for s in (stalled_offsets, stalled_scheduler, offsets, scheduler):
            await s.open()
        t0 = now_ms()
        bounds = [QueueBounds(0, 0, BATCH)]

        async def lease(at: int, attempts: int) -> Lease:
            got = await offsets.lease(
                "c", "", bounds, now_ms=at, max_count=100, lock_timeout_ms=LOCK_MS, max_attempts=16, owner="g"
            )
            assert (
                got is not None and got.attempts == attempts and (got.offset, got.next_offset) == (0, BATCH)
            )
            return got

        async def redeliver(via: Redelivery, lease: Lease) -> None:
            msgs = [message(o) for o in range(lease.offset, lease.next_offset)]
            await via.later(CONSUMER, "", lease, msgs, lease.attempts - 1)

        try:
            await offsets.ensure_table("c", "", [0], t0)
            first = await lease(t0, 1)  # delivered, never acked: its lock runs out
            # Each later lease is taken once the lock before it ran out (leases pass their
            # clock; the commit's real clock is before the last deadline).
            for attempt in (2, 3):
                again = await lease(t0 + (attempt - 1) * LOCK_MS, attempt)
                assert again.first_lock_ts == first.lock_ts  # one round of deliveries
                with pytest.raises(Unavailable):
                    await redeliver(stalled, again)  # the hold is written, its wait falls short
            await redeliver(back, await lease(t0 + 3 * LOCK_MS, 4))  # held (once) and committed

            # Each message waits once for the retry queue, with the delivery count of the
            # first hold; before, each failed try had added a copy (3 of each).
            stats = await scheduler.stats()
            assert (stats.held_messages, stats.held_destinations) == (BATCH, BATCH)
            due = await scheduler.claim_due(t0 + 3_600_000, 100, 1000)
            bodies = []
            for d in due:
                stored, _ = delivered_form(d.payload, d.destination)
                m = decode_stored(stored[1])
                bodies.append((m.body, m.properties[DELIVERIES_PROPERTY]))
            assert sorted(bodies) == [(f"body{o}", "1") for o in range(BATCH)]
            await scheduler.settle([(d.seq, d.index) for d in due])
            table = await offsets.table("c", "")
            assert table is not None and table[0].committed == BATCH
            # The commit is in: the hold keys are forgotten.
            assert await client.hlen(scheduler.keys[9]) == 0

            # The same offsets again (a consumer rewound) are a new round: held anew.
            await offsets.reset("c", "", 0, 0)
            t1 = t0 + 10 * LOCK_MS
            rewound = await lease(t1, 1)
            assert rewound.first_lock_ts == rewound.lock_ts > first.lock_ts
            await redeliver(back, await lease(t1 + LOCK_MS, 2))
            assert (await scheduler.stats()).held_destinations == BATCH
        finally:
            await store.close()
            for s in (stalled_scheduler, scheduler):
                await s.close()
            await client.aclose()

    run_bounded(go(), 60)
