"""The store process's calls as workers see them: two connections are two workers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from mqgate.core.layout import Layout, grid_for, inbox_topic, retry_topic
from mqgate.core.tokens import AckToken
from mqgate.errors import StorageError, Unavailable
from mqgate.health import Health
from mqgate.model import QueueBounds, StoredMessage, encode_stored
from mqgate.offsets.backends.remote import RemoteOffsetStore
from mqgate.store.backends.embedded.file_span import FileSpan, read_file_span
from mqgate.store.backends.embedded.records import framed
from mqgate.store.backends.remote import RemoteStore
from mqgate.store.interface import TopicConfig
from mqgate.storeproc.health_mirror import UNREACHABLE, HealthMirror
from mqgate.storeproc.wire import CONTROL, HEADER, MAX_FRAME_BYTES, STORE, FrameReader, frame
from tests.conftest import run_bounded
from tests.storeproc.served import Served

WEEK_MS = 7 * 24 * 3600 * 1000


def msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i:08d}", 1_000, "p", f"m{i}", [], [], {})


def test_a_produce_through_one_worker_wakes_a_long_poll_of_another(tmp_path: Path) -> None:
    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            a, b = RemoteStore(await served.client(), "local"), RemoteStore(await served.client(), "local")
            await a.create_topic(TopicConfig("t", 2, WEEK_MS))
            waiter = asyncio.ensure_future(b.wait_for_data("t", 30))
            await asyncio.sleep(0)
            started = time.monotonic()
            await a.append("t", 0, [msg(1)])
            await asyncio.wait_for(waiter, 20)
            assert time.monotonic() - started < 20  # woken, not its 30 s timeout
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_a_cancelled_long_poll_takes_no_wake_up_from_a_live_one(tmp_path: Path) -> None:
    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            a, b = RemoteStore(await served.client(), "local"), RemoteStore(await served.client(), "local")
            await a.create_topic(TopicConfig("t", 1, WEEK_MS))
            reader = ("c", "")
            gone = asyncio.ensure_future(a.wait_for_data("t", 30, reader))
            await asyncio.sleep(0.05)  # registered, and longest waiting of its reader
            gone.cancel()
            live = asyncio.ensure_future(b.wait_for_data("t", 30, reader))
            await asyncio.sleep(0.05)
            # One queue written: one waiter of the reader is woken, which must be the live one.
            await a.append("t", 0, [msg(1)])
            await asyncio.wait_for(live, 20)
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_a_lost_store_process_is_a_503_and_the_next_call_reconnects(tmp_path: Path) -> None:
    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            client = await served.client()
            store = RemoteStore(client, "local")
            moved: list[str | None] = []
            store.watch(moved.append)
            await store.create_topic(TopicConfig("t", 1, WEEK_MS))
            await store.append("t", 0, [msg(1)])
            served.clients.remove(client)  # keep it open across the restart
            await served.restart()
            moved.clear()
            # The old connection is gone; the first call finds out, or connects anew.
            with contextlib.suppress(Unavailable):
                await store.bounds("t")
            assert [b.max for b in await store.bounds("t")] == [1]  # recovered from its files
            assert None in moved  # told that anything may have moved meanwhile
            await served.stop()
            with pytest.raises(Unavailable):
                await store.bounds("t")
            await client.close()
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_registry_notices_reach_every_other_worker(tmp_path: Path) -> None:
    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            a, b = await served.client(), await served.client()
            heard: asyncio.Queue[int] = asyncio.Queue()

            async def on_notice(version: int) -> None:
                await heard.put(version)

            await b.listen(on_notice)
            await a.announce(42)
            assert await asyncio.wait_for(heard.get(), 20) == 42
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_a_worker_shows_the_store_process_faults_and_when_it_cannot_reach_it(tmp_path: Path) -> None:
    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            client = await served.client()
            local = Health()
            mirror = HealthMirror(client, local)
            served_health = served.health
            assert served_health is not None
            served_health.fault("message_log", "torn_tail_cut", "q0 cut at 17", count=2)
            served_health.degrade("disk_full", "below the floor")
            await mirror.poll()
            assert local.count("message_log", "torn_tail_cut") == 2
            assert local.degraded == {"disk_full": "below the floor"}
            served_health.fault("message_log", "torn_tail_cut", "q1 cut at 9")
            served_health.restore("disk_full")
            await mirror.poll()
            assert local.count("message_log", "torn_tail_cut") == 3  # counted once each
            assert local.degraded == {}
            served.clients.remove(client)
            await served.stop()
            await mirror.poll()
            assert UNREACHABLE in local.degraded
            await client.close()
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_a_worker_can_call_the_contract_only(tmp_path: Path) -> None:
    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            client = await served.client()
            with pytest.raises(StorageError, match="no method"):
                await client.call(STORE, "close")  # the store process owns its backends' life
            with pytest.raises(StorageError, match="no method"):
                await client.call(STORE, "_topics")
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_frames_split_anywhere_are_read_whole_and_an_oversized_one_is_refused() -> None:
    data = frame((1, True, "x" * 1000)) + frame((2, False, None))
    reader = FrameReader()
    got = []
    for i in range(0, len(data), 7):
        got += reader.feed(data[i : i + 7])
    assert got == [(1, True, "x" * 1000), (2, False, None)]
    with pytest.raises(ValueError, match="frame of"):
        FrameReader().feed(HEADER.pack(MAX_FRAME_BYTES + 1))


async def consumed_topic(store: RemoteStore, messages: int) -> Layout:
    """Topic `t` of one queue holding `messages` messages, and the layout of its consumer `c`
    (with its retry and inbox topics)."""
    await store.create_topic(TopicConfig("t", 1, WEEK_MS))
    for retry_or_inbox in (retry_topic("c"), inbox_topic("c")):
        await store.create_topic(TopicConfig(retry_or_inbox, 1, WEEK_MS))
    await store.append("t", 0, [msg(i) for i in range(messages)])
    return Layout("c", "t", grid_for(((1, 1),)))


def test_a_lease_reads_a_first_deliverys_records_with_it_and_leaves_the_rest_to_the_worker(
    tmp_path: Path,
) -> None:
    """`lease(read_from=layout)` through the store process: one round trip gives the lease and
    the records `read_raw` would give; a batch delivered before, or to be dead lettered, comes
    without them (the worker reads it as its path needs)."""

    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            client = await served.client()
            store, offsets = RemoteStore(client, "local"), RemoteOffsetStore(client)
            layout = await consumed_topic(store, 5)
            bounds = [
                QueueBounds(i, b.min, b.max, layout.slot(i).lane)
                for i, b in enumerate(
                    [
                        *(await store.bounds("t")),
                        *(await store.bounds(retry_topic("c"))),
                        *(await store.bounds(inbox_topic("c"))),
                    ]
                )
            ]
            await offsets.ensure_table("c", "", [0, 0, 0], 0)
            args: dict[str, Any] = {"max_count": 3, "lock_timeout_ms": 1, "max_attempts": 2, "owner": "w"}
            first = await offsets.lease("c", "", bounds, now_ms=1, read_from=layout, **args)
            assert first is not None and (first.queue, first.offset, first.next_offset) == (0, 0, 3)
            assert first.records == await store.read_raw("t", 0, 0, 3)
            assert [o for o, _ in first.records] == [0, 1, 2]
            # The lock timed out: the same batch again (attempt 2), without its records.
            again = await offsets.lease("c", "", bounds, now_ms=10, read_from=layout, **args)
            assert again is not None and again.attempts == 2 and again.records is None
            # Its attempts used up: to be dead lettered, without them either.
            dead = await offsets.lease("c", "", bounds, now_ms=20, read_from=layout, **args)
            assert dead is not None and dead.dead_letter and dead.records is None
            # Without read_from, as every backend: no records.
            plain = await offsets.lease("c", "", bounds, now_ms=30, **args)
            assert plain is not None and plain.records is None
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_a_lease_without_bounds_takes_them_in_the_store_process_in_table_order(tmp_path: Path) -> None:
    """A worker's pull sends no bounds (`reads_bounds`): the store process takes the layout's
    three topics' bounds itself, in the table's order with each queue's lane, so the lease is
    the one the bounds the worker would have sent give (a higher lane's queue first)."""

    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            client = await served.client()
            store, offsets = RemoteStore(client, "local"), RemoteOffsetStore(client)
            assert offsets.reads_bounds
            await store.create_topic(TopicConfig("t", 4, WEEK_MS))
            for retry_or_inbox in (retry_topic("c"), inbox_topic("c")):
                await store.create_topic(TopicConfig(retry_or_inbox, 1, WEEK_MS))
            layout = Layout("c", "t", grid_for(((2, 2),)))  # lanes 0 and 1, two queues each
            await store.append("t", 1, [msg(i) for i in range(3)])  # lane 0
            await store.append("t", 3, [msg(i) for i in range(2)])  # lane 1: served first
            await store.append(inbox_topic("c"), 0, [msg(9)])
            sent = layout.queue_bounds([await store.bounds(t) for t in layout.store_topics])
            assert [(b.queue, b.max, b.lane) for b in sent] == [
                (0, 0, 0),
                (1, 3, 0),
                (2, 0, 0),  # retry
                (3, 1, 0),  # inbox
                (4, 0, 1),
                (5, 2, 1),
            ]
            await offsets.ensure_table("c", "", [0] * layout.size, 0)
            args: dict[str, Any] = {"max_count": 10, "lock_timeout_ms": 60_000, "max_attempts": 3}
            got = []
            for owner in ("a", "b", "c"):
                lease = await offsets.lease("c", "", None, now_ms=1, read_from=layout, owner=owner, **args)
                assert lease is not None and lease.records is not None
                got.append((lease.queue, lease.next_offset, [o for o, _ in lease.records]))
            assert got[0] == (5, 2, [0, 1])  # the lane-1 queue with messages
            assert sorted(got[1:]) == [(1, 3, [0, 1, 2]), (3, 1, [0])]
            assert await offsets.lease("c", "", None, now_ms=1, read_from=layout, owner="d", **args) is None
        finally:
            await served.stop()

    run_bounded(main(), 60)


def test_a_first_deliverys_records_are_read_by_the_worker_where_the_store_process_says(
    tmp_path: Path,
) -> None:
    """The store process answers a first delivery's lease with where its records are (a
    `FileSpan`), not the records; the worker reads them there, checked as the store's own reads
    check them. A file that is not the one named (made again since), or a record that fails its
    check, gives the lease without records: the worker then asks the store process."""

    async def main() -> None:
        served = await Served(tmp_path).start()
        try:
            client = await served.client()
            store, offsets = RemoteStore(client, "local"), RemoteOffsetStore(client)
            layout = await consumed_topic(store, 6)
            await offsets.ensure_table("c", "", [0, 0, 0], 0)
            args: dict[str, Any] = {
                "max_count": 3,
                "lock_timeout_ms": 60_000,
                "max_attempts": 5,
                "owner": "w",
            }
            answer = await client.call(CONTROL, "lease_read", "c", "", None, layout, {"now_ms": 1, **args})
            lease, span = answer
            assert isinstance(span, FileSpan) and lease.records is None
            assert (span.first, span.end) == (0, 3)
            assert read_file_span(span) == await store.read_raw("t", 0, 0, 3)
            # Acked; the worker's own lease of the next batch: its records, read from the file.
            assert await offsets.ack(AckToken("c", "", "local", 0, 0, 3, lease.lock_ts), 2) is None
            nxt = await offsets.lease("c", "", None, now_ms=3, read_from=layout, **args)
            assert nxt is not None and nxt.records == await store.read_raw("t", 0, 3, 3)

            # Other records at the same offsets and bytes, in the same file (inode) as a topic
            # deleted and made again may get: not the records the lease is of.
            path = Path(span.path)
            original = path.read_bytes()
            others = framed(0, [encode_stored(msg(i + 7)) for i in range(3)])  # same sizes, other ids
            assert len(others) == span.stop - span.start and others != original[span.start : span.stop]
            with open(path, "r+b") as f:
                f.seek(span.start)
                f.write(others)
            assert read_file_span(span) is None
            with open(path, "r+b") as f:
                f.seek(span.start)
                f.write(original[span.start : span.stop])
            assert read_file_span(span) == await store.read_raw("t", 0, 0, 3)

            # A byte of the second record flipped: the span no longer reads back whole.
            data = bytearray(path.read_bytes())
            second = span.start + (span.stop - span.start) // 2
            data[second] ^= 0xFF
            with open(path, "r+b") as f:
                f.seek(second)
                f.write(bytes([data[second]]))
            assert read_file_span(span) is None
            # Another file under the same name: not the one the store process named.
            path.unlink()
            path.write_bytes(bytes(data))
            assert read_file_span(span) is None
            path.unlink()  # gone
            assert read_file_span(span) is None
        finally:
            await served.stop()

    run_bounded(main(), 60)
