"""What moved, for the lag gauges and the alert checks (services/changes.py), through the
failover's facades that every gateway's store calls go through: the own store's moves are told;
while a project has clusters (whose moves nobody here hears) readers must look at everything,
and each change of the projects with clusters tells everything. Real embedded backends."""

from __future__ import annotations

from pathlib import Path

from mqgate.backends import backends_for
from mqgate.failover.pool import ClusterPool
from mqgate.failover.routed import RoutedOffsets, RoutedStore
from mqgate.failover.routing import ClusterRouter
from mqgate.registry.cache import Removed
from mqgate.registry.records import ConsumerRecord, Snapshot, TopicRecord
from mqgate.services.changes import Changes, Moved
from mqgate.settings import Settings
from mqgate.store.interface import TopicConfig
from tests.conftest import run_bounded


def consumer(name: str, topic: str) -> ConsumerRecord:
    return ConsumerRecord(name, topic, "cluster", "earliest", 30.0, 16, False, 0.0, 0, "", 0)


def test_moves_are_told_to_readers_and_unheard_ones_mean_everything(tmp_path: Path) -> None:
    async def go() -> None:
        settings = Settings(data_dir=tmp_path / "gw")
        own = backends_for(settings)
        pool = ClusterPool(settings)
        await pool.start()
        await own.start()
        await own.store.open()
        await own.offsets.open()
        router = ClusterRouter(own.store, own.offsets, pool, lambda: Snapshot(1, {}, {}, {}))
        changes = Changes(RoutedStore(router), RoutedOffsets(router))
        reader = changes.reader()
        try:
            assert changes.exact and reader.take().everything  # a new reader: everything
            t = TopicRecord("t", 1, 3_600_000, None, 0)
            changes.registry_changed(Snapshot(2, {"t": t}, {}, {"c": consumer("c", "t")}), Removed())
            assert reader.take() == Moved(False, {"c"}, set())
            # A topic's write is its consumers' move; a retry queue's, its consumer's; an offsets
            # group's, the consumer's of that name (another group is nobody's).
            await changes.store.create_topic(TopicConfig("t", 1, 3_600_000))
            await changes.store.create_topic(TopicConfig("%RETRY%c", 1, 3_600_000))
            await changes.store.create_topic(TopicConfig("other", 1, 3_600_000))
            assert reader.take() == Moved(False, {"c"}, {"t", "%RETRY%c", "other"})
            await changes.offsets.ensure_table("c", "", [0], 0)
            await changes.offsets.ensure_table("%REDRIVE%c", "", [0], 0)
            assert reader.take() == Moved(False, {"c"}, set())
            assert reader.take() == Moved(False)
            changes.registry_changed(Snapshot(3, {}, {}, {}), Removed(consumers=frozenset({"c"})))
            await changes.store.create_topic(TopicConfig("t", 2, 3_600_000))
            assert reader.take() == Moved(False, {"c"}, {"t"})  # deleted: its gauge goes; t is nobody's
            router.assign({"shop": object()})
            assert not changes.exact and reader.take().everything
            router.assign({})
            assert changes.exact and reader.take().everything
        finally:
            reader.close()
            await pool.stop()
            await own.store.close()
            await own.offsets.close()
            await own.stop()

    run_bounded(go(), 60)
