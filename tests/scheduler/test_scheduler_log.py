"""Recovery of the embedded schedule log (SPEC S6) keeps a log that already is its compacted
form instead of writing the same bytes again, and rewrites every other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from mqgate.durable.group_commit import GroupCommitter
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.backends.embedded.log import replay
from mqgate.scheduler.interface import Destination

FAR_MS = 4_000_000_000_000  # due long after the test


def with_scheduler(directory: Path, body: Callable[[EmbeddedScheduler], Awaitable[None]]) -> None:
    async def go() -> None:
        committer = GroupCommitter(None)
        committer.start()
        s = EmbeddedScheduler(directory, committer)
        await s.open()
        try:
            await body(s)
        finally:
            await s.close()
            await committer.stop()

    asyncio.run(go())


def held_payloads(directory: Path) -> list[bytes]:
    out: list[bytes] = []

    async def body(s: EmbeddedScheduler) -> None:
        out.extend(a.payload for a in s._held.values())

    with_scheduler(directory, body)
    return out


def test_a_compact_log_is_kept_and_a_log_with_garbage_is_rewritten(tmp_path: Path) -> None:
    log_path = tmp_path / "schedule.log"

    async def fill(s: EmbeddedScheduler) -> None:
        seqs = await s.hold([(b"m%d" % i, [Destination("t", FAR_MS, 0, 0)]) for i in range(50)])
        await s.settle([(seq, 0) for seq in seqs[:20]])

    with_scheduler(tmp_path, fill)
    assert not replay(log_path.read_bytes()).already_compact  # adds, then deletes
    before = log_path.stat().st_ino
    assert held_payloads(tmp_path) == [b"m%d" % i for i in range(20, 50)]
    compacted = log_path.read_bytes()
    assert log_path.stat().st_ino != before  # rewritten to a new file, swapped in
    assert replay(compacted).already_compact

    inode = log_path.stat().st_ino
    assert held_payloads(tmp_path) == [b"m%d" % i for i in range(20, 50)]
    assert log_path.stat().st_ino == inode and log_path.read_bytes() == compacted  # kept as is

    async def more(s: EmbeddedScheduler) -> None:
        await s.hold([(b"late", [Destination("t", FAR_MS, 0, 0)])])

    with_scheduler(tmp_path, more)  # appends to the kept file
    assert held_payloads(tmp_path)[-1] == b"late"


def test_a_torn_tail_on_a_compact_log_is_cut_by_a_rewrite(tmp_path: Path) -> None:
    log_path = tmp_path / "schedule.log"

    async def fill(s: EmbeddedScheduler) -> None:
        await s.hold([(b"a", [Destination("t", FAR_MS, 0, 0)])])

    with_scheduler(tmp_path, fill)
    assert held_payloads(tmp_path) == [b"a"]
    intact = log_path.read_bytes()
    log_path.write_bytes(intact + b"\x00\x00\x01")  # half a header
    assert not replay(log_path.read_bytes()).already_compact
    assert held_payloads(tmp_path) == [b"a"]
    rewritten = replay(log_path.read_bytes())
    assert rewritten.already_compact and rewritten.valid_bytes == len(intact)  # the tail is gone
