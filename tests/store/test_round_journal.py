"""The message store's round journal (store/backends/embedded/journal.py): with fsync=always a
round fsyncs one journal file instead of every queue file it wrote, and start-up writes again
from the journal whatever the queue files lost with the page cache.

A crash is a copy of the data directory taken while the store is open (what kill -9 leaves:
the page cache's bytes); a lost page cache is that copy with the queue files' unsynced tails
cut or overwritten."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import msgspec
import pytest

import mqgate.durable.group_commit as group_commit
from mqgate.cli.check_files import DataDirCheck
from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import StorageError
from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.backends.embedded.journal import JOURNAL_DIR, journal_files, read_entries
from mqgate.store.interface import TopicConfig
from tests.store.test_embedded_store import opened, run

WEEK_MS = 7 * 24 * 3600 * 1000
NEVER_S = 3600.0  # no settle unless asked: the journal holds every round
encode = msgspec.json.Encoder().encode


def msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i:08d}", 1_000 + i, "p", f"m{i}-" + "x" * 40, [], [], {})


def entries(root: Path) -> list[tuple[str, int, int]]:
    """(topic, queue, first offset) of every entry in the journal."""
    return [
        (e.topic, e.queue, e.chunk.first) for f in journal_files(root / JOURNAL_DIR) for e in read_entries(f)
    ]


async def everything(store: EmbeddedStore, topic: str, queues: int) -> dict[int, list[tuple[int, str]]]:
    out = {}
    for q in range(queues):
        out[q] = [(o, m.msg_id) for o, m in await store.read(topic, q, 0, 10_000)]
    return out


async def write_and_crash(root: Path, crashed: Path) -> dict[int, list[tuple[int, str]]]:
    """Messages in 4 queues over many rounds, none settled; `crashed` is what a kill -9 leaves."""
    store = await opened(root, journal_settle_interval_s=NEVER_S)
    await store.create_topic(TopicConfig("t", 4, WEEK_MS))
    n = 0
    for _ in range(6):
        await asyncio.gather(
            *(store.append("t", q, [msg(n + q * 10 + k) for k in range(3)]) for q in range(4))
        )
        n += 100
    assert store.journal is not None and store.journal.settles == 0
    written = await everything(store, "t", 4)
    assert [len(v) for v in written.values()] == [18] * 4
    shutil.copytree(root, crashed)
    await store.close()
    return written


def test_a_round_is_one_journal_entry_per_queue_and_a_settle_empties_the_journal(tmp_path: Path) -> None:
    async def go() -> None:
        store = await opened(tmp_path, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("t", 8, WEEK_MS))
        await store.append_many("t", {q: [msg(q), msg(q + 100)] for q in range(8)})
        assert sorted(entries(tmp_path)) == [("t", q, 0) for q in range(8)]
        assert store.checkpoints_due == set()  # no queue file fsynced yet: nothing to checkpoint
        assert store.journal is not None and store.committer is not None
        store.journal.want_settle()
        await store.committer.flush()
        assert entries(tmp_path) == [] and store.journal.settles == 1
        assert len(store.checkpoints_due) == 8  # fsynced now: due for their checkpoint
        assert [len(v) for v in (await everything(store, "t", 8)).values()] == [2] * 8
        await store.close()

    run(go)


def test_after_a_kill_9_the_journal_changes_nothing_and_is_gone(tmp_path: Path) -> None:
    async def go() -> None:
        crashed = tmp_path / "crashed"
        written = await write_and_crash(tmp_path / "live", crashed)
        assert len(entries(crashed)) == 24
        store = await opened(crashed)
        assert await everything(store, "t", 4) == written
        assert store.health.count("round_journal", "entry_does_not_fit") == 0
        await store.close()
        assert entries(crashed) == []

    run(go)


def test_what_the_page_cache_lost_is_written_again_from_the_journal(tmp_path: Path) -> None:
    async def go() -> None:
        crashed = tmp_path / "crashed"
        written = await write_and_crash(tmp_path / "live", crashed)
        log0 = crashed / "topics/t/0/00000000000000000000.log"
        log1 = crashed / "topics/t/1/00000000000000000000.log"
        log2 = crashed / "topics/t/2/00000000000000000000.log"
        size = log0.stat().st_size
        with open(log0, "r+b") as fh:  # its last pages never reached the disk
            fh.truncate(size // 3)
        log1.write_bytes(b"")
        with open(log2, "r+b") as fh:  # a page written as zeros
            fh.seek(200)
            fh.write(b"\0" * 700)
        store = await opened(crashed)
        assert await everything(store, "t", 4) == written
        assert store.health.count("message_log", "corrupt_record_skipped") >= 1  # said, then mended
        await store.close()
        # Written again for good: a second start finds them without any journal.
        assert entries(crashed) == []
        store = await opened(crashed)
        assert await everything(store, "t", 4) == written
        await store.close()

    run(go)


def test_a_torn_or_damaged_journal_is_reported_and_costs_nothing_the_queue_files_hold(tmp_path: Path) -> None:
    async def go() -> None:
        crashed = tmp_path / "crashed"
        written = await write_and_crash(tmp_path / "live", crashed)
        [journal] = journal_files(crashed / JOURNAL_DIR)
        data = bytearray(journal.read_bytes())
        data[40] ^= 0xFF  # inside the first entry
        journal.write_bytes(bytes(data) + b"\x40\x00\x00\x00torn")  # and a torn last entry
        store = await opened(crashed)
        assert await everything(store, "t", 4) == written
        assert store.health.count("round_journal", "corrupt_entry_skipped") == 1
        assert store.health.count("round_journal", "torn_tail_cut") == 1
        await store.close()

    run(go)


def test_a_deleted_topic_leaves_no_entry_to_replay_into_one_made_again_under_its_name(tmp_path: Path) -> None:
    async def go() -> None:
        store = await opened(tmp_path, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("t", 2, WEEK_MS))
        await store.append_many("t", {0: [msg(i) for i in range(5)], 1: [msg(9)]})
        assert entries(tmp_path)
        await store.delete_topic("t")
        assert entries(tmp_path) == []
        await store.create_topic(TopicConfig("t", 2, WEEK_MS))
        await store.append("t", 0, [msg(77)])
        shutil.copytree(tmp_path, tmp_path.parent / "crashed")
        await store.close()
        again = await opened(tmp_path.parent / "crashed")
        assert await everything(again, "t", 2) == {0: [(0, "id00000077")], 1: []}
        await again.close()

    run(go)


def test_with_an_fsync_interval_there_is_no_journal_and_one_left_behind_is_replayed(tmp_path: Path) -> None:
    async def go() -> None:
        crashed = tmp_path / "crashed"
        written = await write_and_crash(tmp_path / "live", crashed)
        with open(crashed / "topics/t/3/00000000000000000000.log", "r+b") as fh:
            fh.truncate(100)
        store = await opened(crashed, fsync_interval_ms=50)
        assert store.journal is None and entries(crashed) == []
        assert await everything(store, "t", 4) == written
        await store.close()

    run(go)


def fsynced_paths(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The files each round fsyncs, by path (read from /proc as the round begins its fsync)."""
    rounds: list[list[str]] = []
    real = group_commit._fsync_all

    def spy(fds: list[int]) -> None:
        rounds.append([os.readlink(f"/proc/self/fd/{fd}") for fd in fds])
        real(fds)

    monkeypatch.setattr(group_commit, "_fsync_all", spy)
    return rounds


def test_a_settle_fsyncs_every_queue_file_even_when_their_handles_are_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = fsynced_paths(monkeypatch)

    async def go() -> None:
        # 4 open files at most: collecting 8 queue files' descriptors reopens and evicts some.
        store = await opened(tmp_path, max_open_files=4, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("t", 8, WEEK_MS))
        await store.append_many("t", {q: [msg(q)] for q in range(8)})
        assert store.journal is not None and store.committer is not None
        rounds.clear()
        store.journal.want_settle()
        await store.committer.flush()
        assert store.journal.settles == 1
        [settle] = rounds
        for q in range(8):
            assert str(tmp_path / f"topics/t/{q}/00000000000000000000.log") in settle
        await store.close()

    run(go)


def test_records_written_outside_a_round_are_fsynced_by_the_round_that_answers_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = fsynced_paths(monkeypatch)

    async def go() -> None:
        store = await opened(tmp_path, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("t", 1, WEEK_MS))
        [queue_log] = store._topic("t").queues
        store._write_all("t", {0: ([encode(msg(1))], 1)})  # a writer waiting for its round
        queue_log._reindex(queue_log.active)  # a read met a wrong index entry: it writes them
        store._write_all("t", {0: ([encode(msg(2))], 2)})  # a second writer, journaled
        assert store.committer is not None
        rounds.clear()
        await store.committer.durable()
        assert len(entries(tmp_path)) == 1  # only the second writer's record is journaled
        assert str(tmp_path / "topics/t/0/00000000000000000000.log") in rounds[-1]
        await store.close()

    run(go)


def test_entries_that_cannot_be_applied_are_kept_aside_and_shown(tmp_path: Path) -> None:
    async def go() -> None:
        crashed = tmp_path / "crashed"
        written = await write_and_crash(tmp_path / "live", crashed)
        meta = crashed / "topics/t/topic.json"
        good = meta.read_bytes()
        meta.write_bytes(b"{not json")  # the topic is not served at this start
        store = await opened(crashed)
        assert store.health.count("round_journal", "entry_without_queue") == 24
        assert "round journal" in store.health.degraded
        await store.close()
        [kept] = (crashed / JOURNAL_DIR / "unapplied").glob("*.jnl")
        assert len(read_entries(kept)) == 24 and entries(crashed) == []
        [report] = [r for r in DataDirCheck(crashed, repair=True).run() if "unapplied" in r.path]
        assert report.kept and not report.repaired and kept.exists()  # an operator's, not --repair's
        # What an operator does once topic.json is mended: the kept file back in the journal.
        meta.write_bytes(good)
        kept.rename(crashed / JOURNAL_DIR / kept.name)
        store = await opened(crashed)
        assert await everything(store, "t", 4) == written
        await store.close()

    run(go)


def test_after_a_failed_fsync_the_next_start_writes_every_entry_again_sealed_segments_too(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        live, crashed = tmp_path / "live", tmp_path / "crashed"
        store = await opened(live, journal_settle_interval_s=NEVER_S, segment_bytes=1024)
        await store.create_topic(TopicConfig("t", 1, WEEK_MS))
        for i in range(30):
            await store.append("t", 0, [msg(i)])
        written = await everything(store, "t", 1)
        assert store.journal is not None
        store.journal.fsync_failed()  # as a settle's or a roll's fsync error does
        assert store.journal.keep_all and "round journal" in store.health.degraded
        shutil.copytree(live, crashed)
        await store.close()
        assert journal_files(live / JOURNAL_DIR)  # kept: not deleted by the closing settle
        # The disk never got a sealed segment's pages (the page cache still showed them).
        sealed = sorted((crashed / "topics/t/0").glob("*.log"))[0]
        data = bytearray(sealed.read_bytes())
        data[100:400] = b"\0" * 300
        sealed.write_bytes(bytes(data))
        again = await opened(crashed)
        assert await everything(again, "t", 1) == written
        await again.close()
        assert not (crashed / JOURNAL_DIR / "FSYNC_FAILED").exists() and entries(crashed) == []

    run(go)


def test_a_store_closing_on_a_shared_committer_answers_each_write_truly(tmp_path: Path) -> None:
    async def go() -> None:
        committer = GroupCommitter(None)  # shared with other stores, as the gateway's is
        committer.start()
        store = await opened(tmp_path, committer=committer)
        await store.create_topic(TopicConfig("t", 2, WEEK_MS))
        loop = asyncio.get_running_loop()
        early = loop.create_task(store.append("t", 0, [msg(1)]))
        closing = loop.create_task(store.close())
        late = loop.create_task(store.append("t", 1, [msg(2)]))
        results = await asyncio.gather(early, closing, late, return_exceptions=True)
        assert results[0] == 0 and results[1] is None
        assert isinstance(results[2], StorageError)  # refused, not acknowledged and dropped
        await committer.stop()
        again = await opened(tmp_path)
        assert await everything(again, "t", 2) == {0: [(0, "id00000001")], 1: []}
        await again.close()

    run(go)


def test_a_settle_of_many_queues_keeps_its_open_files_bounded_and_fsyncs_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = fsynced_paths(monkeypatch)

    async def go() -> None:
        store = await opened(tmp_path, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("t", 150, WEEK_MS))
        await store.append_many("t", {q: [msg(q)] for q in range(150)})
        assert store.journal is not None and store.committer is not None
        rounds.clear()
        while store.journal.settles == 0:
            store.journal.want_settle()
            await store.committer.flush()
        assert len(rounds) == 3  # 64 + 64 + 22 queue files
        assert (
            max(len(r) for r in rounds) <= store.journal.SETTLE_FILES + 3
        )  # both journal files, their directory
        logs = {p for r in rounds for p in r if p.endswith(".log")}
        assert logs == {str(tmp_path / f"topics/t/{q}/00000000000000000000.log") for q in range(150)}
        assert entries(tmp_path) == []  # the cycle's journal file deleted after its last round
        await store.close()

    run(go)


def test_a_deleted_topic_settled_early_in_a_long_settle_leaves_no_entry_behind(tmp_path: Path) -> None:
    async def go() -> None:
        live, crashed = tmp_path / "live", tmp_path / "crashed"
        store = await opened(live, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("d", 1, WEEK_MS))
        await store.create_topic(TopicConfig("a", 140, WEEK_MS))
        await store.append("d", 0, [msg(1), msg(2), msg(3)])  # fsynced in the settle's first batch
        await store.append_many("a", {q: [msg(q)] for q in range(140)})
        await store.delete_topic("d")
        assert [e for e in entries(live) if e[0] == "d"] == []
        await store.create_topic(TopicConfig("d", 1, WEEK_MS))
        await store.append("d", 0, [msg(7)])
        shutil.copytree(live, crashed)
        await store.close()
        again = await opened(crashed)
        assert (await everything(again, "d", 1))[0] == [(0, "id00000007")]
        await again.close()

    run(go)


def test_the_round_that_begins_a_settle_fsyncs_the_journal_file_its_entries_went_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = fsynced_paths(monkeypatch)

    async def go() -> None:
        store = await opened(tmp_path, journal_settle_interval_s=NEVER_S)
        await store.create_topic(TopicConfig("t", 2, WEEK_MS))
        await store.append("t", 0, [msg(0)])
        assert store.journal is not None and store.committer is not None
        [first] = journal_files(tmp_path / JOURNAL_DIR)
        store.journal.want_settle()  # the next round begins a settle, and carries a write
        rounds.clear()
        await store.append("t", 1, [msg(1)])
        assert str(first) in rounds[0]  # where that write's entry went
        await store.close()

    run(go)
