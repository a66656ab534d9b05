"""Per-project routing of store calls (failover/routing.py, routed.py) on real embedded stores:
the gateway's own store and two embedded clusters, each in its own directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mqgate.backends import backends_for
from mqgate.core.layout import retry_topic
from mqgate.core.tokens import AckToken
from mqgate.failover.pool import ClusterPool, ClusterSpec
from mqgate.failover.routed import RoutedOffsets, RoutedStore
from mqgate.failover.routing import ClusterRouter
from mqgate.model import QueueBounds, StoredMessage
from mqgate.registry.records import ConsumerRecord, Snapshot, TopicRecord
from mqgate.settings import Settings
from mqgate.store.interface import TopicConfig
from mqgate.store.scope import request_scope


def _snapshot() -> Snapshot:
    topics = {
        "orders": TopicRecord("orders", 2, 3_600_000, None, 0, project="shop"),
        "other": TopicRecord("other", 2, 3_600_000, None, 0),
    }
    consumer = ConsumerRecord("orders-c", "orders", "cluster", "earliest", 30.0, 16, False, 0.0, 0, "", 0)
    return Snapshot(1, topics, {}, {"orders-c": consumer})


def _msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i}", 0, "p", f"m{i}", [], [], {})


def test_calls_go_to_the_active_cluster_and_a_request_keeps_its_cluster(tmp_path: Path) -> None:
    async def go() -> None:
        settings = Settings(data_dir=tmp_path / "gw")
        own = backends_for(settings)
        pool = ClusterPool(settings)
        await pool.add(ClusterSpec("p", f"embedded:{tmp_path / 'p'}"))
        await pool.add(ClusterSpec("b", f"embedded:{tmp_path / 'b'}"))
        await pool.start()
        await own.start()
        await own.store.open()
        await own.offsets.open()
        active = {"shop": "p"}
        router = ClusterRouter(own.store, own.offsets, pool, lambda: _snapshot())
        router.active = active.__getitem__
        store, offsets = RoutedStore(router), RoutedOffsets(router)
        try:
            # No project has clusters yet: everything is the gateway's own store.
            assert router.store_for("orders") == (own.store, None)
            router.assign({"shop": object()})
            for name in ("orders", "other", retry_topic("orders-c")):
                await store.create_topic(TopicConfig(name, 2, 3_600_000))
            p, b = pool.get("p").backends, pool.get("b").backends
            assert p.store.has_topic("orders") and p.store.has_topic(retry_topic("orders-c"))
            assert not own.store.has_topic("orders") and own.store.has_topic("other")
            await store.append("orders", 0, [_msg(1)])
            await store.append("other", 0, [_msg(2)])
            assert [m.msg_id for _, m in await p.store.read("orders", 0, 0, 10)] == ["id1"]
            assert [m.msg_id for _, m in await own.store.read("other", 0, 0, 10)] == ["id2"]

            # A switch: new calls go to b (the project is declared there first).
            await b.store.create_topic(TopicConfig("orders", 2, 3_600_000))
            active["shop"] = "b"
            await store.append("orders", 0, [_msg(3)])
            assert [m.msg_id for _, m in await b.store.read("orders", 0, 0, 10)] == ["id3"]
            assert store.broker == own.store.broker  # outside a request: the gateway's own

            # Inside a request the first cluster stays, even across a switch.
            with request_scope():
                await store.append("orders", 1, [_msg(4)])
                active["shop"] = "p"
                await store.append("orders", 1, [_msg(5)])
                assert store.broker == "b"
            assert [m.msg_id for _, m in await b.store.read("orders", 1, 0, 10)] == ["id4", "id5"]
            assert await p.store.read("orders", 1, 0, 10) == []

            # Offsets follow the consumer's topic; an ack follows the token's broker.
            await offsets.ensure_table("orders-c", "", [0, 0], 1)
            assert await p.offsets.table("orders-c", "") is not None
            assert await b.offsets.table("orders-c", "") is None
            bounds = [QueueBounds(0, 0, 1), QueueBounds(1, 0, 0)]
            lease = await offsets.lease(
                "orders-c",
                "",
                bounds,
                now_ms=10,
                max_count=10,
                lock_timeout_ms=30_000,
                max_attempts=5,
                owner="t",
            )
            assert lease is not None
            token = AckToken("orders-c", "", "p", lease.queue, lease.offset, lease.next_offset, lease.lock_ts)
            active["shop"] = "b"  # switched after the pull: the ack still goes where the lock is
            assert await offsets.ack(token, 20) is None
            table = await p.offsets.table("orders-c", "")
            assert table is not None and table[0].committed == 1
        finally:
            await pool.stop()
            await own.store.close()
            await own.offsets.close()
            await own.stop()

    asyncio.run(go())
