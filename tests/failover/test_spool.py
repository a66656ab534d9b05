"""The producer spool: durable, bounded, ordered per queue, replayed once (failover/spool.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqgate.failover.replay import Replayer
from mqgate.failover.spool import MARKS, QueueKey, Spool, SpoolFull, SpoolRecord
from tests.conftest import ROOT

KEY_A: QueueKey = ("proj", "orders", "q:1")
KEY_B: QueueKey = ("proj", "orders", "k:user-7")


async def opened(directory: Path, max_bytes: int = 1 << 20, segment_bytes: int = 4096) -> Spool:
    spool = Spool(directory, max_bytes, segment_bytes=segment_bytes)
    await spool.open()
    return spool


def test_append_replay_in_order_and_never_again(tmp_path: Path) -> None:
    async def go() -> None:
        spool = await opened(tmp_path)
        for i in range(300):
            await spool.append(*(KEY_A if i % 3 else KEY_B), f"m{i}", f"body {i}".encode())
        assert spool.has_pending(*KEY_A) and spool.queues() == [KEY_B, KEY_A]
        assert spool.stats().pending == 300 and spool.stats().disk_bytes > 4096  # several segments
        got: dict[QueueKey, list[str]] = {}

        async def send(key: QueueKey, records: list[SpoolRecord]) -> None:
            got.setdefault(key, []).extend(r.msg_id for r in records)

        result = await Replayer(spool, batch=7).replay(send)
        assert result.resent == 300 and not result.failed
        assert got[KEY_B] == [f"m{i}" for i in range(300) if i % 3 == 0]
        assert got[KEY_A] == [f"m{i}" for i in range(300) if i % 3]
        stats = spool.stats()
        assert (stats.pending, stats.resent_total, stats.possible_duplicates) == (0, 300, 0)
        await spool.close()
        # Sent segments are gone; a restart resends nothing.
        assert len(list(tmp_path.glob("*.spool"))) == 1
        again = await opened(tmp_path)
        assert again.stats().pending == 0 and again.queues() == []
        seq = await again.append(*KEY_A, "next", b"x")
        assert seq == 301  # numbering goes on
        await again.close()

    asyncio.run(go())


def test_failed_send_stops_the_queue_keeps_order_and_counts_duplicates(tmp_path: Path) -> None:
    async def go() -> None:
        spool = await opened(tmp_path)
        for i in range(10):
            await spool.append(*KEY_A, f"a{i}", b"a")
            await spool.append(*KEY_B, f"b{i}", b"b")
        sent: list[str] = []
        calls = 0

        async def flaky(key: QueueKey, records: list[SpoolRecord]) -> None:
            nonlocal calls
            calls += 1
            if key == KEY_A and calls <= 3:
                raise ConnectionError("cluster away")
            sent.extend(r.msg_id for r in records)

        replayer = Replayer(spool, batch=4, concurrency=1)
        first = await replayer.replay(flaky)
        assert KEY_A in first.failed and first.resent == 10  # B went on, A stopped at once
        assert spool.queues() == [KEY_A]
        assert spool.stats().possible_duplicates == 0
        # A batch that failed may have been stored: sending it again is a possible duplicate.
        await spool.close()
        spool = await opened(tmp_path)
        assert spool.stats().pending == 10
        second = await Replayer(spool, batch=4).replay(flaky)
        assert second.resent == 10 and not second.failed
        assert [m for m in sent if m.startswith("a")] == [f"a{i}" for i in range(10)]
        assert spool.stats().possible_duplicates == 4  # the one batch tried before the restart
        await spool.close()

    asyncio.run(go())


def test_bound_in_bytes(tmp_path: Path) -> None:
    async def go() -> None:
        spool = await opened(tmp_path, max_bytes=2000, segment_bytes=1000)
        n = 0
        with pytest.raises(SpoolFull) as caught:
            while True:
                await spool.append(*KEY_A, f"m{n}", b"x" * 100)
                n += 1
        assert caught.value.http_status == 503 and caught.value.retry_after_s
        assert spool.stats().disk_bytes <= 2000 and n >= 10

        async def send(key: QueueKey, records: list[SpoolRecord]) -> None:
            return None

        await Replayer(spool).replay(send)
        await spool.append(*KEY_A, "after", b"x" * 100)  # room again once replayed
        await spool.close()

    asyncio.run(go())


def test_torn_tail_is_cut_and_damage_inside_is_skipped(tmp_path: Path) -> None:
    async def go() -> None:
        spool = await opened(tmp_path, segment_bytes=1 << 20)
        for i in range(20):
            await spool.append(*KEY_A, f"m{i}", b"payload-%d" % i)
        await spool.close()
        (segment,) = tmp_path.glob("*.spool")
        data = bytearray(segment.read_bytes())
        segment.write_bytes(data[:-5])  # the last record torn (a crash mid-write)
        spool = await opened(tmp_path)
        stats = spool.stats()
        assert (stats.pending, stats.torn_tails_cut) == (19, 1)
        assert segment.stat().st_size < len(data) - 5  # cut back to the last intact record
        await spool.append(*KEY_A, "m19b", b"again")  # appended after the cut, readable
        await spool.close()
        # A flipped byte inside: that record is skipped and counted, the others stay.
        data = bytearray(segment.read_bytes())
        data[60] ^= 0xFF
        segment.write_bytes(bytes(data))
        spool = await opened(tmp_path)
        assert spool.stats().corrupt_skipped == 1 and spool.stats().pending == 19
        assert spool.head(KEY_A, 100)[-1].msg_id == "m19b"
        await spool.close()

    asyncio.run(go())


WRITER = """
import asyncio, sys
from pathlib import Path
from mqgate.failover.spool import Spool

async def main() -> None:
    spool = Spool(Path(sys.argv[1]), 1 << 30, segment_bytes=64 * 1024)
    await spool.open()
    async def one(i: int) -> None:
        seq = await spool.append("proj", "t", f"q:{i % 4}", f"m{i}", b"%d" % i * 50)
        print(seq, i, flush=True)
    i = 0
    while True:  # 8 appends at a time: they share fsyncs, as produces do
        await asyncio.gather(*(one(i + k) for k in range(8)))
        i += 8

asyncio.run(main())
"""


def test_kill9_of_the_writer_loses_no_appended_record(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    assert proc.stdout is not None
    acked: dict[int, int] = {}
    with proc.stdout:
        deadline = time.monotonic() + 30
        while len(acked) < 2000:
            line = proc.stdout.readline()
            assert line, "the writer stopped"
            seq, i = map(int, line.split())
            acked[seq] = i
            assert time.monotonic() < deadline
        proc.send_signal(signal.SIGKILL)  # mid-way: appends are in flight
        proc.wait(10)
        for line in proc.stdout:  # acknowledged before the kill, read after it
            if not line.endswith("\n"):
                break  # the kill cut this acknowledgement short: it was not given
            seq, i = map(int, line.split())
            acked[seq] = i

    async def check() -> None:
        spool = await opened(tmp_path)
        found: dict[int, str] = {}
        for key in spool.queues():
            records = spool.head(key, 1 << 20)
            seqs = [r.seq for r in records]
            assert seqs == sorted(seqs)  # per-queue order
            for r in records:
                assert r.payload == r.msg_id[1:].encode() * 50
                found[r.seq] = r.msg_id
        missing = [s for s in acked if s not in found]
        assert missing == [], f"{len(missing)} acknowledged records lost"
        assert all(found[s] == f"m{i}" for s, i in acked.items())
        print(f"\nkill -9: {len(acked)} acknowledged, {len(found)} on disk, torn tails cut "
              f"{spool.stats().torn_tails_cut}")  # fmt: skip
        await spool.close()

    asyncio.run(check())
    assert (tmp_path / MARKS).exists()


def test_append_throughput_and_fsync_cost(tmp_path: Path) -> None:
    """Figures for docs/FAILOVER.md: one writer at a time (one fsync per append) and 64 at a
    time (group commit)."""

    async def go() -> None:
        spool = await opened(tmp_path, max_bytes=1 << 30, segment_bytes=4 << 20)
        body = b"x" * 200
        n = 300
        start = time.perf_counter()
        for i in range(n):
            await spool.append(*KEY_A, f"s{i}", body)
        serial = time.perf_counter() - start
        start = time.perf_counter()
        rounds = spool.committer.rounds
        total = 0
        for r in range(40):
            await asyncio.gather(
                *(spool.append("p", "t", f"q:{k % 8}", f"g{r}-{k}", body) for k in range(64))
            )
            total += 64
        grouped = time.perf_counter() - start
        rounds = spool.committer.rounds - rounds
        print(
            f"\nspool: 1 writer {n / serial:.0f} appends/s ({serial / n * 1000:.2f} ms each, one fsync); "
            f"64 writers {total / grouped:.0f} appends/s ({rounds} fsyncs for {total})"
        )
        assert rounds < total / 4  # appends share fsyncs
        await spool.close()

    asyncio.run(go())


def test_each_process_of_a_gateway_spools_in_a_slot_of_its_own_and_a_dead_ones_is_taken_over(
    tmp_path: Path,
) -> None:
    """`serve --workers N`: the processes share the data directory; two spools on one directory
    would append to the same segment and each replay the other's records."""
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from mqgate.failover.spool import Spool\n"
        "async def main():\n"
        "    spool = Spool(Path(sys.argv[1]), 1 << 20)\n"
        "    await spool.open()\n"
        "    await spool.append('proj', 'orders', 'q:1', 'from-the-worker', b'x')\n"
        "    print(spool.directory, flush=True)\n"
        "    sys.stdin.readline()\n"  # held until killed
        "asyncio.run(main())\n"
    )

    async def go() -> None:
        first = await opened(tmp_path)
        await first.append(*KEY_A, "from-the-first", b"y")
        with subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        ) as worker:
            try:
                assert worker.stdout is not None
                slot = Path(worker.stdout.readline().decode().strip())
                assert slot != first.directory == tmp_path  # a slot of its own
                # Still held by the worker: a third process takes yet another slot.
                third = await opened(tmp_path)
                assert third.directory not in (tmp_path, slot)
                await third.close()
            finally:
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
        # The slot the dead worker held is free: the next process takes it and replays it.
        successor = await opened(tmp_path)
        assert successor.directory == slot
        assert [r.msg_id for r in successor.head(KEY_A, 10)] == ["from-the-worker"]
        assert [r.msg_id for r in first.head(KEY_A, 10)] == ["from-the-first"]
        await successor.close()
        await first.close()

    asyncio.run(go())
