"""`queue_bytes` through the failover facade (failover/routed.py): the gateway's own store while
no project has clusters, the project's active cluster once it has them; and every call of the
store contract is one the facade has."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

from mqgate.backends import backends_for
from mqgate.failover.pool import ClusterPool, ClusterSpec
from mqgate.failover.routed import RoutedStore
from mqgate.failover.routing import ClusterRouter
from mqgate.model import StoredMessage
from mqgate.registry.records import Snapshot, TopicRecord
from mqgate.settings import Settings
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.backends.redis import RedisStore
from mqgate.store.interface import MessageStore, TopicConfig


def _snapshot() -> Snapshot:
    topics = {"orders": TopicRecord("orders", 2, 3_600_000, None, 0, project="shop")}
    return Snapshot(1, topics, {}, {})


def _msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i}", 0, "p", "x" * 100, [], [], {})


def test_every_store_and_the_facade_have_every_call_of_the_contract() -> None:
    calls = {n for n, f in inspect.getmembers(MessageStore, inspect.isfunction) if not n.startswith("_")}
    assert "queue_bytes" in calls
    for cls in (EmbeddedStore, RedisStore, RoutedStore):
        assert calls <= set(dir(cls)), (cls.__name__, calls - set(dir(cls)))


def test_queue_bytes_follow_the_topic_to_its_cluster(tmp_path: Path) -> None:
    async def go() -> None:
        settings = Settings(data_dir=tmp_path / "gw")
        own = backends_for(settings)
        pool = ClusterPool(settings)
        await pool.add(ClusterSpec("p", f"embedded:{tmp_path / 'p'}"))
        await pool.start()
        await own.start()
        await own.store.open()
        router = ClusterRouter(own.store, own.offsets, pool, _snapshot)
        router.active = {"shop": "p"}.__getitem__
        store = RoutedStore(router)
        try:
            await store.create_topic(TopicConfig("orders", 2, 3_600_000))
            await store.append("orders", 1, [_msg(1)])
            own_bytes = await store.queue_bytes("orders")  # direct: the gateway's own store
            assert own_bytes[0] == 0 and own_bytes[1] > 100
            router.assign({"shop": object()})
            cluster = pool.get("p").backends.store
            await cluster.create_topic(TopicConfig("orders", 2, 3_600_000))
            assert await store.queue_bytes("orders") == [0, 0]
            await store.append("orders", 0, [_msg(2), _msg(3)])
            routed = await store.queue_bytes("orders")
            assert routed == await cluster.queue_bytes("orders") and routed[0] > 200 and routed[1] == 0
        finally:
            await pool.stop()
            await own.store.close()
            await own.stop()

    asyncio.run(go())
