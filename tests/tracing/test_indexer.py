"""The indexer between a real store and a real index: events recorded are found by the query
service, lag says when a path may be incomplete, malformed records are counted and passed, new
trace topics are picked up, and a kill -9 in the middle indexes every event exactly once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import sqlalchemy as sa

from mqgate.model import StoredMessage
from mqgate.store.interface import MessageStore, TopicConfig
from mqgate.tracing.events import trace_topic
from mqgate.tracing.index import TraceIndex
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.query import TraceQuery
from mqgate.tracing.recorder import TraceRecorder
from tests.conftest import ROOT, kill9, wait_until
from tests.tracing.conftest import Stores, event, run_with_small_segments, run_with_stores

HOPS = ["accepted", "scheduled", "due", "stored", "delivered", "released", "redelivered", "dead_lettered"]


def test_recorded_hops_are_found_by_the_query_once_indexed(
    store_kind: str, tmp_path: Path, index: TraceIndex
) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        indexer = TraceIndexer(store, index, batch_events=3)
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        query = TraceQuery(index, indexer)
        await recorder.record(
            [
                event("m1", "accepted", 100, producer="p1", keys=["order-1"]),
                event("m1", "scheduled", 101),
                event("m1", "due", 600),
                event("m1", "stored", 601, queue=2, offset=0),
                event("m1", "delivered", 650, consumer="c1", client_id="cl", request_id="req-9"),
                event("m1", "released", 700, consumer="c1", request_id="req-9"),
                event("m1", "redelivered", 800, consumer="c1", attempt=2),
                event("m1", "dead_lettered", 900, status="error", error_type="max_attempts", consumer="c1"),
            ]
        )
        answer = await query.find(msg_id="m1")
        assert answer.may_be_incomplete and answer.index_lag_events == 8 and answer.paths == []
        assert await indexer.step() == 3  # batches of at most batch_events
        assert indexer.lag().events == 5
        await indexer.run_until_caught_up()
        for found in (
            await query.find(msg_id="m1"),
            await query.find(request_id="req-9"),
            await query.find(key="order-1"),
        ):
            assert not found.may_be_incomplete and found.index_lag_events == 0
            [path] = found.paths
            assert [h.hop for h in path.hops] == HOPS
            assert [h.latency_ms for h in path.hops] == [None, 1, 499, 1, 49, 50, 100, 100]
            assert path.failures[0].failure is not None and path.failures[0].failure.cause == "max_attempts"
        assert indexer.counters.indexed == 8 and indexer.counters.malformed == 0
        await recorder.close()

    run_with_stores(store_kind, tmp_path / "data", body)


def test_malformed_records_are_counted_and_passed(tmp_path: Path, index: TraceIndex) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        topic = trace_topic("shop")
        recorder = TraceRecorder(store)
        await recorder.record([event("good-1", "accepted", 1)])
        await store.append(topic, 0, [StoredMessage("x1", 2, "p", "not json", [], [], {})])
        await store.append(topic, 0, [StoredMessage("x2", 3, "p", '{"msgId": "no-hop"}', [], [], {})])
        await store.append_encoded(topic, {0: [(4, b"\xff\xfe not a stored message")]})
        await recorder.record([event("good-2", "accepted", 5)])
        indexer = TraceIndexer(store, index)
        indexer.add_topic(topic)
        await indexer.run_until_caught_up()
        assert indexer.counters.malformed == 3 and indexer.counters.indexed == 2
        assert index.positions() == {(topic, 0): 5}
        assert index.paths(msg_id="good-2") != []
        await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)


def test_new_trace_topics_are_discovered(tmp_path: Path, index: TraceIndex) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        known: list[str] = []

        async def discover() -> list[str]:
            return list(known)

        indexer = TraceIndexer(store, index, discover=discover, discover_every_s=0, idle_wait_s=0.05)
        indexer.start()
        recorder = TraceRecorder(store)
        await recorder.record([event("b1", "accepted", 1, project="bank")])
        known.extend([trace_topic("bank"), "orders"])  # a data topic is not a trace topic: ignored
        deadline = asyncio.get_running_loop().time() + 10
        while not await asyncio.to_thread(index.paths, msg_id="b1"):
            assert asyncio.get_running_loop().time() < deadline, "the new topic was not indexed"
            await asyncio.sleep(0.02)
        assert indexer.topics == {"%TRACE%bank"}
        await indexer.close()
        await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)


def test_events_dropped_by_store_retention_are_counted(tmp_path: Path, index: TraceIndex) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        topic = trace_topic("shop")
        # Tiny segments and a retention of 1 ms: older segments go at the next enforcement.
        await store.create_topic(TopicConfig(topic, 1, 1))
        recorder = TraceRecorder(store)
        for i in range(200):
            await recorder.record([event(f"m{i}", "accepted", i, body="x" * 400)])
        await store.enforce_retention(now_ms=2**62)
        low = (await store.bounds(topic))[0].min
        assert low > 0
        indexer = TraceIndexer(store, index)
        indexer.add_topic(topic)
        await indexer.run_until_caught_up()
        assert indexer.counters.skipped_by_retention == low and indexer.counters.indexed == 200 - low
        await recorder.close()

    run_with_small_segments(tmp_path / "data", body)


INDEXER_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from mqgate.store.backends.embedded import EmbeddedStore
    from mqgate.tracing.index import TraceIndex
    from mqgate.tracing.indexer import TraceIndexer

    async def main() -> None:
        store = EmbeddedStore(Path(sys.argv[1]))
        await store.open()
        index = TraceIndex(sys.argv[2])
        index.create_schema()
        indexer = TraceIndexer(store, index, batch_events=int(sys.argv[3]))
        indexer.add_topic("%TRACE%shop")
        while True:
            await indexer.step()

    asyncio.run(main())
    """
)


def test_a_kill_9_in_the_middle_indexes_every_event_exactly_once(tmp_path: Path, index_url: str) -> None:
    total = 20_000
    data = tmp_path / "data"

    async def fill(stores: Stores, store: MessageStore) -> None:
        recorder = TraceRecorder(store)
        for start in range(0, total, 1000):
            await recorder.record(
                [event(f"m{i}", "accepted", i, keys=[f"k{i % 97}"]) for i in range(start, start + 1000)]
            )
        await recorder.close()

    run_with_stores("embedded", data, fill)

    index = TraceIndex(index_url)
    index.create_schema()
    proc = subprocess.Popen(
        [sys.executable, "-c", INDEXER_PROCESS, str(data), index_url, "200"],
        env={"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    try:

        def midway() -> bool:
            done = index.positions().get(("%TRACE%shop", 0), 0)
            return 2_000 <= done < total - 2_000

        wait_until(midway, 60, "the indexer process to be midway")
    finally:
        kill9(proc)
    stopped_at = index.positions()[("%TRACE%shop", 0)]
    assert stopped_at < total

    async def finish(stores: Stores, store: MessageStore) -> None:
        indexer = TraceIndexer(store, index, batch_events=1000)
        indexer.add_topic("%TRACE%shop")
        await indexer.run_until_caught_up()
        assert indexer.counters.indexed == total - stopped_at  # resumed exactly where it stopped

    run_with_stores("embedded", data, finish)
    with index.engine.connect() as conn:
        count, distinct = conn.execute(
            sa.text("SELECT count(*), count(DISTINCT msg_id) FROM mqgate_trace_events")
        ).one()
    assert (count, distinct) == (total, total)
    assert len(index.paths(key="k5")) == 100  # max_paths of the key's 206 messages
    index.dispose()


def test_an_idle_indexer_wakes_on_a_write_and_prunes_by_its_retention(
    tmp_path: Path, index: TraceIndex
) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        topic = trace_topic("shop")
        recorder = TraceRecorder(store)
        await recorder.record([event("first", "accepted", 1)])
        # A long idle wait: only the store's wake-up can make the next write show up quickly.
        indexer = TraceIndexer(store, index, idle_wait_s=30, max_events=3, prune_every_s=0)
        indexer.add_topic(topic)
        indexer.start()
        loop = asyncio.get_running_loop()

        async def indexed(msg_id: str) -> None:
            deadline = loop.time() + 5
            while not await asyncio.to_thread(index.paths, msg_id=msg_id):
                assert loop.time() < deadline, f"{msg_id} was not indexed within 5 s"
                await asyncio.sleep(0.01)

        await indexed("first")
        for i in range(5):
            await recorder.record([event(f"m{i}", "accepted", 10 + i)])
            await indexed(f"m{i}")
        deadline = loop.time() + 5
        # Pruned after the rounds that indexed them; the count is taken once the prune's thread
        # is back, a moment after its rows are gone (CI read 2 of 3 in between).
        while index.event_count() > 3 or index.counters.pruned < 3:
            assert loop.time() < deadline, "the index was not pruned to max_events"
            await asyncio.sleep(0.01)
        assert index.paths(msg_id="first") == [] and index.counters.pruned == 3
        await indexer.close()
        await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)


def test_a_broken_index_is_retried_with_backoff_not_once_per_write(tmp_path: Path) -> None:
    # Before: the failed round's wait read the index's positions outside the guard, and the
    # indexer's task died on the first failure (a restart was needed to index again).
    async def body(stores: Stores, store: MessageStore) -> None:
        # An index whose database cannot be opened: every round fails.
        broken = TraceIndex(f"sqlite:///{tmp_path}/no-such-dir/trace-index.sqlite")
        health: list[str] = []
        indexer = TraceIndexer(
            store,
            broken,
            gather_s=0.05,
            max_backoff_s=0.4,
            on_failure=lambda detail: health.append("failed"),
            on_recovery=lambda: health.append("recovered"),
        )
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        await recorder.record([event("m0", "accepted", 1)])
        indexer.start()
        loop = asyncio.get_running_loop()
        until = loop.time() + 1.5
        writes = 0
        while loop.time() < until:  # a busy gateway: trace records keep coming
            await recorder.record([event(f"m{writes}", "accepted", 2)])
            writes += 1
            await asyncio.sleep(0.005)
        assert indexer._task is not None and not indexer._task.done(), "the indexer died"
        # 0.1, 0.2, 0.4, 0.4 ... s apart: a handful in 1.5 s, not one per write.
        assert 2 <= indexer.counters.failures <= 7 < writes, (indexer.counters.failures, writes)
        assert health == ["failed"] * indexer.counters.failures
        # The database can be opened again: the indexer catches up by itself and says so.
        (tmp_path / "no-such-dir").mkdir()
        broken.create_schema()
        while indexer.counters.indexed < writes + 1:
            assert loop.time() < until + 10, "the indexer did not recover"
            await asyncio.sleep(0.05)
        assert health[-1] == "recovered"
        await indexer.close()
        await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)
