"""Data directories written before `mqgate.durable` existed still open, byte for byte.

The files below were written by the code of commit 37c6170 (framing in the message store's
backend, group commit in `mqgate.fsync`): one topic with three messages, an offsets journal
before its compaction and a schedule log with each kind of record.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from mqgate.durable.framing import frame, iter_payloads
from mqgate.durable.group_commit import GroupCommitter
from mqgate.model import StoredMessage
from mqgate.offsets.backends.embedded import EmbeddedOffsetStore
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.interface import Destination
from mqgate.store.backends.embedded import EmbeddedStore

QUEUE = "topics/t/0/"
OLD_FILES = {
    "FORMAT": "bXFnYXRlLWVtYmVkZGVkLTIganNvbi1yZWNvcmRzCg==",
    "topics/t/topic.json": (
        "eyJuYW1lIjogInQiLCAicXVldWVzIjogMSwgInJldGVudGlvbl9tcyI6IDYwNDgwMDAwMCwgInJldGVudGlvbl9i"
        "eXRlcyI6IG51bGx9"
    ),
    QUEUE + "00000000000000000000.log": (
        "eAAAAHTZKeF7Im1lc3NhZ2VJZCI6ImlkMCIsInRpbWVzdGFtcCI6MTAwMCwicHJvZHVjZXIiOiJwIiwibWVzc2Fn"
        "ZSI6ImJvZHktMCIsImtleXMiOlsiazAiXSwidGFncyI6WyJ4Il0sInByb3BlcnRpZXMiOnsiaSI6IjAifX14AAAA"
        "kG4DHnsibWVzc2FnZUlkIjoiaWQxIiwidGltZXN0YW1wIjoxMDAxLCJwcm9kdWNlciI6InAiLCJtZXNzYWdlIjoi"
        "Ym9keS0xIiwia2V5cyI6WyJrMSJdLCJ0YWdzIjpbIngiXSwicHJvcGVydGllcyI6eyJpIjoiMSJ9fXgAAAD9sA3E"
        "eyJtZXNzYWdlSWQiOiJpZDIiLCJ0aW1lc3RhbXAiOjEwMDIsInByb2R1Y2VyIjoicCIsIm1lc3NhZ2UiOiJib2R5"
        "LTIiLCJrZXlzIjpbImsyIl0sInRhZ3MiOlsieCJdLCJwcm9wZXJ0aWVzIjp7ImkiOiIyIn19"
    ),
    QUEUE + "00000000000000000000.idx": "AAAAAAAAAACAAAAAAAAAAAABAAAAAAAA",
    QUEUE + "checkpoint.json": "eyJiYXNlIjogMCwgImVuZCI6IDMsICJwb3MiOiAzODR9",
    # ensure_table g/"" and g/c1, advance g/"" to [7, 3], expire c1.
    "offsets/journal.log": (
        "DwAAAME7S8qWoXShZ6CSAACSAADNE4gRAAAA0bbdJJahdKFnomMxkgECkgAAzROIDAAAAM23OnmXoWOhZ6AABwDN"
        "F3AMAAAAqMLmR5ehY6FnoAEDAM0XcAgAAADB88Tsk6F4oWeiYzE="
    ),
    # mark, two adds, a modify settling destination 0 of seq 1, a delete of seq 2.
    "schedule/schedule.log": (
        "BAAAAF0QlDSSoWgBKwAAABbBJnKUoWEBxAZoZWxkLTGSlKd0b3BpYzphzScQAASUp3RvcGljOmLNKvjNTiAAGwAA"
        "AEQ2XnuUoWECxAZoZWxkLTKRlKd0b3BpYzpjzS7gAAkWAAAARkKvjJOhbQGSwJSndG9waWM6Ys0q+M1OIAAEAAAA"
        "6w4oAZKhZAI="
    ),
}


def old_message(i: int) -> StoredMessage:
    return StoredMessage(f"id{i}", 1000 + i, "p", f"body-{i}", [f"k{i}"], ["x"], {"i": str(i)})


def write_old_data_dir(root: Path) -> Path:
    for name, data in OLD_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
    return root


def test_the_frame_of_a_known_record_is_unchanged() -> None:
    # <u32 length 5><u32 crc32(b"hello") = 0x3610a686>, little-endian, then the payload.
    assert frame(b"hello") == bytes.fromhex("0500000086a61036") + b"hello"
    assert list(iter_payloads(frame(b"hello") + frame(b""))) == [(0, b"hello"), (13, b"")]


def test_an_old_message_log_reads_back_and_takes_new_records(tmp_path: Path) -> None:
    async def go(root: Path) -> None:
        store = EmbeddedStore(root)
        await store.open()
        assert store.recovered_bytes_cut == 0
        assert await store.read("t", 0, 0, 10) == [(i, old_message(i)) for i in range(3)]
        assert await store.append("t", 0, [old_message(3)]) == 3
        await store.close()
        store = EmbeddedStore(root)
        await store.open()
        assert await store.read("t", 0, 0, 10) == [(i, old_message(i)) for i in range(4)]
        await store.close()

    asyncio.run(go(write_old_data_dir(tmp_path / "with-checkpoint")))
    unverified = write_old_data_dir(tmp_path / "without-checkpoint")
    (unverified / QUEUE / "checkpoint.json").unlink()  # every record is verified on start
    asyncio.run(go(unverified))


def test_an_old_offsets_journal_replays(tmp_path: Path) -> None:
    async def go() -> None:
        committer = GroupCommitter(None)
        committer.start()
        offsets = EmbeddedOffsetStore(write_old_data_dir(tmp_path), committer)
        await offsets.open()
        assert await offsets.clients("g") == [""]
        table = await offsets.table("g", "")
        assert table is not None and [e.committed for e in table] == [7, 3]
        await offsets.close()
        await committer.stop()

    asyncio.run(go())


def test_an_old_schedule_log_replays(tmp_path: Path) -> None:
    async def go() -> None:
        committer = GroupCommitter(None)
        committer.start()
        scheduler = EmbeddedScheduler(write_old_data_dir(tmp_path) / "schedule", committer)
        await scheduler.open()
        stats = await scheduler.stats()
        assert (stats.held_messages, stats.held_destinations) == (1, 1)
        assert await scheduler.next_due_ms() == 11_000
        [due] = await scheduler.claim_due(11_000, 10, 1000)
        assert (due.seq, due.index, due.payload) == (1, 1, b"held-1")
        assert due.destination == Destination("topic:b", 11_000, 20_000, 0)
        assert await scheduler.hold([(b"new", [Destination("topic:c", 1, 0, 0)])]) == [3]
        await scheduler.close()
        await committer.stop()

    asyncio.run(go())
