"""Issue 27: what an idle indexer costs is proportional to what was written, not to how many
trace topics exist (one per project: thousands). Its rounds look at the topics written since
the last one, its waits register nothing anew, and its lag is read without a walk over every
topic (a metrics scrape reads it).

The store is a real one; `CountingStore` only counts the calls the indexer makes to it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from mqgate.model import QueueBounds
from mqgate.store.interface import MessageStore
from mqgate.store.waiters import ANY_READER, Reader
from mqgate.tracing.events import trace_topic
from mqgate.tracing.index import TraceIndex
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.recorder import TraceRecorder
from tests.tracing.conftest import Stores, event, run_with_stores

TOPICS = 300


class CountingStore:
    """A real store, with the calls that cost per topic counted."""

    def __init__(self, inner: MessageStore) -> None:
        self.inner = inner
        self.bounds_calls = 0
        self.reads = 0
        self.waits = 0

    def reset(self) -> None:
        self.bounds_calls = self.reads = self.waits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def bounds(self, topic: str) -> list[QueueBounds]:
        self.bounds_calls += 1
        return await self.inner.bounds(topic)

    async def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        self.reads += 1
        return await self.inner.read_raw(topic, queue, offset, max_count)

    async def wait_for_data(
        self, topic: str, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        self.waits += 1
        await self.inner.wait_for_data(topic, timeout_s, reader, recheck_s)


async def until(predicate: Any, what: str, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_idle_rounds_look_at_no_topic_and_a_write_costs_one_topic(tmp_path: Path, index: TraceIndex) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        recorder = TraceRecorder(store)
        for i in range(TOPICS):
            await recorder.record([event(f"m{i}", "accepted", i, project=f"p{i}")])
        counting = CountingStore(store)
        indexer = TraceIndexer(cast(MessageStore, counting), index, idle_wait_s=0.02, gather_s=0)
        for i in range(TOPICS):
            indexer.add_topic(trace_topic(f"p{i}"))
        indexer.start()
        try:
            await until(lambda: indexer.counters.indexed == TOPICS, "the first catch-up")
            await until(lambda: counting.waits >= TOPICS, "every topic's watcher")

            # Idle: rounds go on (woken by pokes and time-outs) and look at nothing.
            counting.reset()
            rounds = indexer.counters.rounds
            for k in range(1, 6):
                indexer.poke()
                await until(lambda k=k: indexer.counters.rounds >= rounds + k, f"idle round {k}")
            assert indexer.counters.rounds >= rounds + 5
            # Before: every round read the bounds of all 300 topics and every idle wait
            # registered 300 waiters again (and read the bounds of all 300 once more).
            assert (counting.bounds_calls, counting.reads, counting.waits) == (0, 0, 0)

            # One project's trace topic is written: a round reads that topic alone.
            visited = indexer.counters.visited
            await recorder.record([event("late", "accepted", 1_000, project="p7")])
            await until(lambda: indexer.counters.indexed == TOPICS + 1, "the new event indexed")
            assert indexer.counters.visited - visited == 1
            assert counting.bounds_calls == 1 and counting.reads == 1
            assert counting.waits == 1  # p7's watcher waits again; no other registers anew
            assert await asyncio.to_thread(index.paths, msg_id="late") != []
        finally:
            await indexer.close()
            await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)


def test_the_lag_is_read_without_a_walk_over_every_topic(tmp_path: Path, index: TraceIndex) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        recorder = TraceRecorder(store)
        for i in range(TOPICS):
            await recorder.record([event(f"m{i}", "accepted", i, project=f"p{i}")])
        indexer = TraceIndexer(store, index)
        for i in range(TOPICS):
            indexer.add_topic(trace_topic(f"p{i}"))
        await indexer.run_until_caught_up()
        assert indexer.lag().events == 0 and indexer.lag().per_topic == {}
        await recorder.record([event(f"x{i}", "accepted", 2_000 + i, project="p3") for i in range(3)])
        lag = await indexer.lag_now(trace_topic("p3"))
        assert lag.events == 3
        # Only the topic that lags is named (before: all 300, each summed over all 300: a
        # scrape of /metrics cost 300 x 300 steps, seconds at thousands of projects).
        assert indexer.lag().per_topic == {trace_topic("p3"): 3} and indexer.lag().events == 3
        await indexer.run_until_caught_up()
        assert indexer.lag().events == 0 and indexer.counters.indexed == TOPICS + 3
        indexer.remove_topic(trace_topic("p3"))
        assert trace_topic("p3") not in indexer.topics
        await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)
