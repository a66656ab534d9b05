"""The trace recorder on real stores: concurrent calls coalesce into few appends, recorded events
survive a reopen, buffered events flush by themselves, a full buffer and a failed store are
counted, never silent."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from mqgate.model import StoredMessage
from mqgate.store.interface import Encoded, MessageStore
from mqgate.tracing.events import TraceEvent, decode_event, trace_topic
from mqgate.tracing.recorder import TRACE_PRODUCER, TraceRecorder
from tests.conftest import RedisServer
from tests.tracing.conftest import Stores, event, run_with_stores


class CountingStore:
    """A real store, with its trace appends counted (a spy, not a stand-in)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.appends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append_encoded(self, topic: str, batches: dict[int, list[Encoded]]) -> dict[int, int]:
        self.appends += 1
        return await self.store.append_encoded(topic, batches)


async def stored_events(store: MessageStore, project: str) -> list[tuple[StoredMessage, TraceEvent]]:
    found = []
    for bounds in await store.bounds(trace_topic(project)):
        for _offset, message in await store.read(trace_topic(project), bounds.queue, 0, 1_000_000):
            found.append((message, decode_event(message.body)))
    return found


async def poll(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_concurrent_records_coalesce_and_survive_a_reopen(store_kind: str, tmp_path: Path) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        counting = CountingStore(store)
        recorder = TraceRecorder(counting, queues=2)  # type: ignore[arg-type]
        calls = 300
        await asyncio.gather(
            *(recorder.record([event(f"m{i}", "accepted", 1000 + i, keys=[f"k{i}"])]) for i in range(calls))
        )
        # The first call goes out alone; every other one joins an append already waiting.
        assert counting.appends <= 10, counting.appends
        assert recorder.counters.recorded == calls and recorder.counters.dropped == 0
        await recorder.close()

        reopened = await stores.reopen(store)
        found = await stored_events(reopened, "shop")
        assert sorted(e.msg_id for _, e in found) == sorted(f"m{i}" for i in range(calls))
        for message, e in found:  # one event per stored message, as a Spark reader sees them
            assert (
                message.producer == TRACE_PRODUCER and message.keys == [e.msg_id] and message.tags == [e.hop]
            )
        # One message's events stay in one queue, in order.
        queues = {q.queue for q in await reopened.bounds(trace_topic("shop")) if q.max > 0}
        assert queues == {0, 1}

    run_with_stores(store_kind, tmp_path / "data", body)


def test_each_project_gets_its_own_trace_topic_and_the_callback_hears_of_it(tmp_path: Path) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        told: list[str] = []

        async def on_new_topic(topic: str) -> None:
            told.append(topic)

        recorder = TraceRecorder(store, on_new_topic=on_new_topic)
        await recorder.record(
            [event("a1", "accepted", 1, project="shop"), event("b1", "accepted", 1, project="bank")]
        )
        await recorder.record([event("a2", "accepted", 2, project="shop")])
        assert sorted(told) == ["%TRACE%bank", "%TRACE%shop"]
        assert [e.msg_id for _, e in await stored_events(store, "shop")] == ["a1", "a2"]
        assert [e.msg_id for _, e in await stored_events(store, "bank")] == ["b1"]
        await recorder.close()

    run_with_stores("embedded", tmp_path / "data", body)


def test_buffered_events_flush_within_the_interval_and_a_full_buffer_counts_drops(tmp_path: Path) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        recorder = TraceRecorder(store, flush_interval_ms=20, max_pending_events=10)
        assert recorder.record_nowait([event(f"m{i}", "acked", i) for i in range(25)]) == 10
        assert recorder.counters.dropped == 15 and recorder.counters.pending == 10

        async def all_there() -> bool:
            # The counters move when the recorder's append returns, a turn of the loop after the
            # stored events became visible: the flush is done when both say so.
            return (
                store.has_topic(trace_topic("shop"))
                and (await store.bounds(trace_topic("shop")))[0].max == 10
                and recorder.counters.pending == 0
            )

        await poll(all_there, 5.0, "the buffered events to be flushed")  # no flush call: the timer did it
        assert recorder.counters.pending == 0 and recorder.counters.recorded == 10
        assert recorder.record_nowait([event("late", "acked", 99)]) == 1  # room again
        await recorder.close()  # close flushes what is buffered
        assert [e.msg_id for _, e in await stored_events(store, "shop")][-1] == "late"
        assert recorder.record_nowait([event("after-close", "acked", 100)]) == 0
        assert recorder.counters.dropped == 16

    run_with_stores("embedded", tmp_path / "data", body)


def test_a_failing_store_raises_to_record_and_retries_buffered_events(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        recorder = TraceRecorder(store, flush_interval_ms=20)
        await recorder.record([event("before", "accepted", 1)])
        own_redis.kill9()
        with pytest.raises(Exception):  # noqa: B017 - the store's own error, whatever it is
            await recorder.record([event("during", "accepted", 2)])
        assert recorder.record_nowait([event("buffered", "acked", 3)]) == 1

        async def failed_again() -> bool:
            return recorder.counters.append_failures >= 3

        await poll(failed_again, 20.0, "the buffered append to be retried")
        assert recorder.counters.pending == 1 and recorder.counters.dropped == 0
        own_redis.start()

        async def flushed() -> bool:
            return recorder.counters.pending == 0

        await poll(flushed, 30.0, "the buffered event to reach the restarted Redis")
        await recorder.close()
        ids = [e.msg_id for _, e in await stored_events(store, "shop")]
        assert ids == ["before", "buffered"]  # "during" was refused to its caller, not stored
        assert recorder.counters.dropped == 0

    async def go() -> None:
        stores = Stores("redis", tmp_path, redis_url=own_redis.url)
        try:
            await body(stores, await stores.open())
        finally:
            await stores.cleanup()

    asyncio.run(go())
