"""Issue 27 item 4: a produce refused by the spool (full: 503 `spool_full`; or a failed write:
507 on a full disk, 503 otherwise) had part of its batch kept, and later delivered: 206
records for 205 receipts. A batch is spooled whole or refused whole.

The produce path's entry is `Failover.spool_produce`. Two ways a batch was cut:
- batches spooled at the same moment all passed the room check before any of them was
  written; the last ones then ran into the bound record by record;
- a write failing part-way through a batch (here: the next segment file cannot be created,
  a real OSError) left the records written before it."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from mqgate.errors import StorageError
from mqgate.failover.replay import Replayer
from mqgate.failover.spool import Spool, SpoolFull
from mqgate.model import StoredMessage
from tests.conftest import run_bounded
from tests.failover.conftest import FailoverRedis
from tests.failover.harness import InProcess, in_process

BODY = "x" * 500


def batch(tag: str, n: int) -> dict[int, list[StoredMessage]]:
    ts = int(time.time() * 1000)
    return {q: [StoredMessage(f"{tag}-{q}-{i}", ts, "p", BODY, [], [], {}) for i in range(n)] for q in (0, 1)}


def pending_ids(spool: Spool) -> set[str]:
    return {r.msg_id for key in spool.queues() for r in spool.head(key, 1_000_000)}


def ids(b: dict[int, list[StoredMessage]]) -> set[str]:
    return {m.msg_id for msgs in b.values() for m in msgs}


async def use_spool(h: InProcess, directory: Path, max_bytes: int, segment_bytes: int) -> Spool:
    """The failover service on a spool of the test's size."""
    await h.failover.spool.close()
    spool = Spool(directory, max_bytes, segment_bytes=segment_bytes)
    await spool.open()
    h.failover.spool = spool
    h.failover.replayer = Replayer(spool)
    return spool


def test_batches_spooled_at_once_near_the_bound_are_kept_or_refused_whole(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url) as h:
            spool = await use_spool(h, tmp_path / "spool", 64 * 1024, 1 << 20)
            batches = [batch(f"b{i}", 20) for i in range(3)]  # each ~40% of the bound
            outcomes = await asyncio.gather(
                *(h.failover.spool_produce("shop", "orders", b, tried=False) for b in batches),
                return_exceptions=True,
            )
            kept = pending_ids(spool)
            # A batch kept answers its records' `tried` (False here); a refused one, SpoolFull.
            for b, outcome in zip(batches, outcomes, strict=True):
                if outcome is False:
                    assert ids(b) <= kept
                else:
                    assert isinstance(outcome, SpoolFull), outcome
                    assert not ids(b) & kept, f"{len(ids(b) & kept)} of a refused batch kept"
            assert sum(o is False for o in outcomes) == 2  # two fit, the third does not
            assert spool.stats().pending == len(kept) == 80

    run_bounded(go(), 120)


def test_a_write_failing_part_way_keeps_nothing_of_the_batch(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url) as h:
            directory = tmp_path / "spool"
            spool = await use_spool(h, directory, 1 << 20, 16 * 1024)
            first = batch("first", 10)  # ~11 KB of the 16 KB segment
            await h.failover.spool_produce("shop", "orders", first, tried=False)
            # The next segment file cannot be made: a directory sits where each could go.
            after = spool.stats().spooled_total + 1
            blockers = [directory / f"{seq:020d}.spool" for seq in range(after, after + 40)]
            for path in blockers:
                path.mkdir()
            second = batch("second", 10)  # crosses the segment bound
            with pytest.raises(Exception) as refused:  # its kind is checked below
                await h.failover.spool_produce("shop", "orders", second, tried=False)
            kept = pending_ids(spool) & ids(second)
            assert not kept, f"{len(kept)} of {len(ids(second))} refused messages kept"
            assert pending_ids(spool) == ids(first)
            assert isinstance(refused.value, StorageError), repr(refused.value)  # 503, said why
            for path in blockers:
                shutil.rmtree(path)
            # Nor is any of it found on disk by the next start.
            await spool.close()
            again = Spool(directory, 1 << 20, segment_bytes=16 * 1024)
            await again.open()
            h.failover.spool = again
            assert pending_ids(again) == ids(first)

    run_bounded(go(), 120)
