"""The embedded log: framing, segments, index, recovery, retention, group commit."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mqgate.errors import StorageError
from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.backends.embedded.file_span import read_file_span
from mqgate.store.interface import TopicConfig

WEEK_MS = 7 * 24 * 3600 * 1000


def msg(i: int, ts: int = 1_000, size: int = 50) -> StoredMessage:
    return StoredMessage(f"id{i:08d}", ts, "p", f"m{i}-" + "é" * size, [f"k{i}"], ["t"], {"i": str(i)})


def run(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return asyncio.run(fn(*args))


async def opened(path: Path, **kw: Any) -> EmbeddedStore:
    store = EmbeddedStore(path, **kw)
    await store.open()
    return store


def queue_dir(root: Path, topic: str = "t", queue: int = 0) -> Path:
    return root / "topics" / topic / str(queue)


def test_append_and_read_back_exact_records(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        first = await s.append("t", 1, [msg(i) for i in range(10)])
        assert first == 0
        assert await s.append("t", 1, [msg(10)]) == 10
        got = await s.read("t", 1, 3, 4)
        assert [o for o, _ in got] == [3, 4, 5, 6]
        assert [m for _, m in got] == [msg(i) for i in range(3, 7)]
        assert [(b.min, b.max) for b in await s.bounds("t")] == [(0, 0), (0, 11)]
        assert await s.read("t", 1, 11, 10) == []
        await s.close()

    run(go)


def test_segments_roll_and_reads_seek_across_them(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path, segment_bytes=2048)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        for i in range(200):
            await s.append("t", 0, [msg(i)])
        assert len(list(queue_dir(tmp_path).glob("*.log"))) > 5
        got = await s.read("t", 0, 95, 50)
        assert [m.msg_id for _, m in got] == [f"id{i:08d}" for i in range(95, 145)]
        await s.close()
        s = await opened(tmp_path, segment_bytes=2048)
        got = await s.read("t", 0, 0, 1000)
        assert [m for _, m in got] == [msg(i) for i in range(200)]
        await s.close()

    run(go)


def test_torn_tail_is_truncated_on_start(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.append("t", 0, [msg(i) for i in range(5)])
        await s.close()
        (log,) = queue_dir(tmp_path).glob("*.log")
        intact = log.stat().st_size
        with open(log, "ab") as fh:
            fh.write((1000).to_bytes(4, "little") + b"\0\0\0\0" + b"partial")
        s = await opened(tmp_path)
        assert s.recovered_bytes_cut == 15
        assert log.stat().st_size == intact
        assert [m for _, m in await s.read("t", 0, 0, 100)] == [msg(i) for i in range(5)]
        assert await s.append("t", 0, [msg(5)]) == 5
        await s.close()

    run(go)


def test_corrupt_record_after_the_checkpoint_is_cut_not_served(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.append("t", 0, [msg(i) for i in range(5)])
        await s.close()
        qdir = queue_dir(tmp_path)
        (qdir / "checkpoint.json").unlink()  # as if the process died before checkpointing
        (log,) = qdir.glob("*.log")
        data = bytearray(log.read_bytes())
        data[-3] ^= 0xFF  # inside the last record's payload: its CRC no longer matches
        log.write_bytes(bytes(data))
        s = await opened(tmp_path)
        assert s.recovered_bytes_cut > 0
        got = await s.read("t", 0, 0, 100)
        assert [m for _, m in got] == [msg(i) for i in range(4)]
        await s.close()

    run(go)


def test_corruption_inside_a_sealed_segment_is_never_served(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path, segment_bytes=1024)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        for i in range(40):
            await s.append("t", 0, [msg(i)])
        await s.close()
        first = sorted(queue_dir(tmp_path).glob("*.log"))[0]
        data = bytearray(first.read_bytes())
        data[20] ^= 0xFF
        first.write_bytes(bytes(data))
        s = await opened(tmp_path, segment_bytes=1024)
        # The damaged record is skipped (and counted), the good ones around it are served.
        assert [m for _, m in await s.read("t", 0, 0, 5)] == [msg(i) for i in range(1, 5)]
        assert s.health.count("message_log", "corrupt_record_skipped") == 1
        await s.close()

    run(go)


def test_retention_by_size_and_age_moves_the_min_offset(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path, segment_bytes=1024)
        await s.create_topic(TopicConfig("sized", 1, WEEK_MS, retention_bytes=3000))
        await s.create_topic(TopicConfig("aged", 1, 60_000))
        for i in range(60):
            await s.append("sized", 0, [msg(i)])
            await s.append("aged", 0, [msg(i, ts=1_000 if i < 50 else 100_000)])
        dropped = await s.enforce_retention(now_ms=100_000)
        assert dropped > 0
        (sized,) = await s.bounds("sized")
        assert sized.min > 0 and sized.max == 60
        assert sum(p.stat().st_size for p in queue_dir(tmp_path, "sized").glob("*.log")) <= 3000 + 1024
        (aged,) = await s.bounds("aged")
        assert 0 < aged.min <= 50 and aged.max == 60
        got = await s.read("aged", 0, 0, 100)
        assert got[0][0] == aged.min  # reading below min starts at min
        await s.close()

    run(go)


def test_offset_for_time(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        for i in range(100):
            await s.append("t", 0, [msg(i, ts=1000 + 10 * i)])
        assert await s.offset_for_time("t", 0, 0) == 0
        assert await s.offset_for_time("t", 0, 1500) == 50
        assert await s.offset_for_time("t", 0, 1501) == 51
        assert await s.offset_for_time("t", 0, 10**12) == 100
        await s.close()

    run(go)


def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 4, WEEK_MS))
        assert s.committer is not None
        before = s.committer.rounds
        offsets = await asyncio.gather(*(s.append("t", i % 4, [msg(i)]) for i in range(400)))
        rounds = s.committer.rounds - before
        assert sorted(offsets) == sorted(list(range(100)) * 4)
        assert rounds < 40, f"{rounds} fsync rounds for 400 appends: group commit is not grouping"
        await s.close()

    run(go)


def test_fsync_interval_mode_makes_writes_visible_without_waiting(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path, fsync_interval_ms=50)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.append("t", 0, [msg(1)])
        assert (await s.bounds("t"))[0].max == 1
        await s.close()

    run(go)


def test_long_poll_waiter_wakes_on_write(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiter = asyncio.create_task(s.wait_for_data("t", 10))
        await asyncio.sleep(0.05)
        await s.append("t", 0, [msg(1)])
        await asyncio.wait_for(waiter, 1)
        assert loop.time() - started < 1
        await s.close()

    run(go)


def test_one_process_per_data_directory(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        with pytest.raises(StorageError):
            await opened(tmp_path)
        await s.close()

    run(go)


def test_queue_count_of_an_existing_topic_cannot_shrink(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        with pytest.raises(Exception, match="2 queues"):
            await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.close()

    run(go)


def test_index_file_is_rebuilt_when_it_does_not_match(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path, segment_bytes=1024)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        for i in range(30):
            await s.append("t", 0, [msg(i)])
        await s.close()
        idx = sorted(queue_dir(tmp_path).glob("*.idx"))[0]
        os.truncate(idx, 8)
        s = await opened(tmp_path, segment_bytes=1024)
        assert [m for _, m in await s.read("t", 0, 0, 100)] == [msg(i) for i in range(30)]
        await s.close()

    run(go)


def test_a_data_directory_of_another_format_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.close()
        (tmp_path / "FORMAT").write_text("mqgate-embedded-1\n")
        with pytest.raises(StorageError, match="format"):
            await opened(tmp_path)
        (tmp_path / "FORMAT").unlink()  # an unmarked directory with topics is the old format
        with pytest.raises(StorageError, match="format"):
            await opened(tmp_path)

    run(go)


def test_a_damaged_read_while_records_wait_for_their_round_keeps_them(tmp_path: Path) -> None:
    """With fsync=always records wait for their group-commit round to be written. A read that
    meets damage has the active segment indexed again from the file: the waiting records go to
    the file first, so the new index keeps them and the round makes them readable."""

    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.append("t", 0, [msg(i) for i in range(5)])
        log_file = next(queue_dir(tmp_path).glob("*.log"))
        data = bytearray(log_file.read_bytes())
        data[40] ^= 0xFF  # inside record 0
        log_file.write_bytes(bytes(data))
        queue_log = s._queue("t", 0)
        queue_log.append([msgspec.json.encode(msg(i)) for i in (5, 6)], 1_000)  # waits for its round
        got = await s.read("t", 0, 0, 10)  # meets the damage: indexed again
        assert [o for o, _ in got] == [1, 2, 3, 4]  # 5 and 6 are not visible before their round
        assert s.committer is not None
        await s.committer.flush()
        got = await s.read("t", 0, 0, 10)
        assert [o for o, _ in got] == [1, 2, 3, 4, 5, 6]
        assert [m.msg_id for _, m in got[-2:]] == [msg(5).msg_id, msg(6).msg_id]
        await s.close()

    run(go)


def test_records_a_failed_round_takes_back_after_a_checkpoint_leave_the_index_right(tmp_path: Path) -> None:
    """A checkpoint writes the .idx tail of every record the index holds, waiting ones too; a
    round that then fails takes them back, and the next records (other sizes, the same offsets)
    must replace their entries, so that a restart reads them without indexing anything again."""

    async def go() -> None:
        s = await opened(tmp_path)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.append("t", 0, [msg(0)])
        queue_log = s._queue("t", 0)
        mark = queue_log.mark()
        queue_log.append([msgspec.json.encode(msg(i, size=300)) for i in (1, 2)], 1_000)  # waiting
        queue_log.checkpoint()  # its .idx tail holds the waiting records' positions
        queue_log.drop_unsynced(mark)  # as a round whose write failed
        await s.append("t", 0, [msg(3, size=5)])
        await s.append("t", 0, [msg(4, size=5)])
        queue_log.checkpoint()
        await s.close()
        again = await opened(tmp_path)
        got = await again.read("t", 0, 0, 10)
        assert [m.msg_id for _, m in got] == [msg(i).msg_id for i in (0, 3, 4)]
        last = await again.read("t", 0, 2, 10)  # found by its own index entry
        assert [m.msg_id for _, m in last] == [msg(4).msg_id]
        assert again.health.count("message_log", "index_rebuilt") == 0
        await again.close()

    run(go)


def test_a_span_names_where_read_raws_records_are_or_none_across_segments(tmp_path: Path) -> None:
    """`EmbeddedStore.span` (for a worker of `serve --workers N`): the file, inode and bytes of
    exactly the records `read_raw` gives, clamped alike to the queue's bounds; None where they
    are not in one segment, or nothing is there to read."""

    async def go() -> None:
        s = await opened(tmp_path, segment_bytes=2048, fsync_interval_ms=None)
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        for i in range(60):
            await s.append("t", 0, [msg(i)])
        found = 0
        for offset in range(0, 64):
            raw = await s.read_raw("t", 0, offset, 5)
            span = s.span("t", 0, offset, 5)
            if span is None:  # across segments, or past the end
                assert not raw or len({p.name for p in _segments_of(tmp_path, raw)}) > 1
                continue
            found += 1
            assert (span.first, span.end) == (raw[0][0], raw[-1][0] + 1)
            assert read_file_span(span) == raw
            assert os.stat(span.path).st_ino == span.inode
        assert found > 30
        assert s.span("t", 0, 60, 5) is None  # nothing to read there
        await s.close()

    run(go)


def _segments_of(root: Path, raw: list[tuple[int, bytes]]) -> list[Path]:
    """The segment files holding the offsets of `raw` (by their base offsets in the names)."""
    bases = sorted(int(p.stem) for p in queue_dir(root).glob("*.log"))
    return [queue_dir(root) / f"{max(b for b in bases if b <= offset):020d}.log" for offset, _ in raw]
