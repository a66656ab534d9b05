"""Records that carry their offset (`store/backends/embedded/records.py`): what start-up and
`mqgate check --repair` make of damage no read of the index can explain, on real files."""

from __future__ import annotations

import asyncio
import subprocess
from array import array
from pathlib import Path

from mqgate.durable.framing import frame, iter_payloads
from mqgate.model import StoredMessage, encode_stored
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.backends.embedded.data_format import FORMAT
from mqgate.store.backends.embedded.records import TAG, decode, framed
from mqgate.store.backends.embedded.segment import Gap, index_records
from mqgate.store.interface import TopicConfig
from tests.conftest import MQGATE
from tests.durable.test_durable_compat import QUEUE, old_message, write_old_data_dir

WEEK_MS = 7 * 24 * 3600 * 1000
SEGMENT = "topics/t/0/00000000000000000000"


def msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i}", 1000 + i, "p", f"body {i} " + "z" * (i % 17), [], [], {})


async def written(root: Path, n: int) -> None:
    store = EmbeddedStore(root)
    await store.open()
    await store.create_topic(TopicConfig("t", 1, WEEK_MS))
    await store.append("t", 0, [msg(i) for i in range(n)])
    await store.close()


async def reopened(root: Path) -> tuple[list[str], int, int]:
    """(the ids read, the queue's end, the offset the next append gets)."""
    store = EmbeddedStore(root)
    await store.open()
    got = [m.msg_id for _, m in await store.read("t", 0, 0, 1000)]
    (bounds,) = await store.bounds("t")
    nxt = await store.append("t", 0, [msg(999)])
    await store.close()
    return got, bounds.max, nxt


def check(root: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [MQGATE, "check", "--data-dir", str(root), *args], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout + done.stderr


def positions(root: Path) -> list[int]:
    entries = array("Q")
    entries.frombytes((root / f"{SEGMENT}.idx").read_bytes())
    return list(entries)


def test_a_damaged_tail_the_checkpoint_vouches_for_is_kept_by_repair(tmp_path: Path) -> None:
    asyncio.run(written(tmp_path, 20))
    log = tmp_path / f"{SEGMENT}.log"
    at = positions(tmp_path)[17] + 5  # inside record 17, to the end: no intact record after it
    data = bytearray(log.read_bytes())
    data[at:] = bytes(len(data) - at)
    log.write_bytes(bytes(data))

    rc, out = check(tmp_path, "--repair")
    assert rc == 1, out  # kept: 3 damaged records
    assert "3 damaged records kept as gaps" in out and "torn tail" not in out, out
    assert log.stat().st_size == len(data)
    got, end, nxt = asyncio.run(reopened(tmp_path))
    assert got == [f"id{i}" for i in range(17)]
    assert (end, nxt) == (20, 20)


def test_stray_bytes_and_a_record_out_of_place_cost_no_offset() -> None:
    records = [framed(i, [b'{"m":%d}' % i]) for i in range(6)]
    # Seven stray bytes after record 1, and record 1 again after record 2 (an offset passed).
    data = (
        records[0] + records[1] + b"\xff" * 7 + records[2] + records[1] + records[3] + records[4] + records[5]
    )
    indexed = index_records(data, pos0=0, first=0)
    starts = [0, len(records[0]), len(records[0]) + len(records[1]) + 7]
    assert indexed.positions[:3] == starts
    assert len(indexed.positions) == 6 and indexed.end == len(data)
    stray = Gap(starts[1] + len(records[1]), 7, 2, 0)
    copied = Gap(starts[2] + len(records[2]), len(records[1]), 3, 0)
    assert indexed.gaps == [stray, copied]


def test_a_format_2_directory_is_read_and_marked_with_this_format(tmp_path: Path) -> None:
    root = write_old_data_dir(tmp_path / "old")
    done = subprocess.run(
        [MQGATE, "check", "--data-dir", str(root)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "marked" in done.stdout, done.stdout

    async def go() -> None:
        store = EmbeddedStore(root)
        await store.open()
        assert await store.read("t", 0, 0, 10) == [(i, old_message(i)) for i in range(3)]
        assert await store.append("t", 0, [old_message(3)]) == 3
        await store.close()

    old_bytes = (root / QUEUE / "00000000000000000000.log").read_bytes()
    asyncio.run(go())
    assert (root / "FORMAT").read_text().strip() == FORMAT
    # The old records are left as they were; the new one carries its offset.
    log = (root / QUEUE / "00000000000000000000.log").read_bytes()
    assert log == old_bytes + framed(3, [encode_stored(old_message(3))])
    done = subprocess.run(
        [MQGATE, "check", "--data-dir", str(root)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "marked" not in done.stdout, done.stdout


def test_a_run_of_records_is_each_message_framed_with_its_offset() -> None:
    """`framed` (one join for a batch) writes exactly the records `frame` makes one by one, and
    each reads back at its own offset."""
    for messages in ([], [b"{}"], [b"{" + bytes([i % 256]) * (i * 7 % 300) + b"}" for i in range(100)]):
        first = 2**40 + 17
        data = framed(first, messages)
        one_by_one = b"".join(
            frame(bytes([TAG]) + (first + i).to_bytes(8, "little") + m) for i, m in enumerate(messages)
        )
        assert data == one_by_one
        assert [decode(p) for _, p in iter_payloads(data)] == [(first + i, m) for i, m in enumerate(messages)]
