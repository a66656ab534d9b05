"""The message-level mode's offset-store contract (issue 30), one suite for every backend: each
message received, hidden, deleted or shown again by its own receipt; the committed offset over
the deleted prefix; redelivery with the receive count raised; dead letters after the attempts;
a stuck message holding back no other; the state surviving a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqgate.core.message_window import Received
from mqgate.model import QueueBounds
from mqgate.offsets.interface import OffsetStore
from tests.offsets import test_offset_store_contract as contract
from tests.offsets.test_offset_store_contract import NOW, run

backend = contract.backend  # the contract suite's fixture: every backend
VIS = 30_000
RECEIVE = {"visibility_ms": VIS, "max_attempts": 3, "window": 1000, "first_queue": 0}


def bounds(*maxes: int, mins: tuple[int, ...] | None = None) -> list[QueueBounds]:
    low = mins or (0,) * len(maxes)
    return [QueueBounds(queue=i, min=low[i], max=m) for i, m in enumerate(maxes)]


async def receive(s: OffsetStore, b: list[QueueBounds], now: int, n: int, **kw: Any) -> list[Received]:
    return await s.receive("g", "", b, now_ms=now, max_count=n, **{**RECEIVE, **kw})


async def delete(s: OffsetStore, r: Received, now: int = NOW) -> str:
    return await s.delete_message("g", "", r.queue, r.offset, r.receives, r.first_ms, now)


async def committed(s: OffsetStore) -> list[int]:
    table = await s.table("g", "")
    assert table is not None
    return [e.committed for e in table]


def test_each_message_is_received_once_and_deleted_by_its_receipt(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0], NOW)
        got = await receive(s, bounds(3, 2), NOW, 4)
        assert [(r.queue, r.offset, r.receives) for r in got] == [(0, 0, 1), (0, 1, 1), (0, 2, 1), (1, 0, 1)]
        more = await receive(s, bounds(3, 2), NOW, 10)
        assert [(r.queue, r.offset) for r in more] == [(1, 1)]  # the others are hidden
        assert await receive(s, bounds(3, 2), NOW + 1, 10) == []
        # Deleted out of order: the committed offset moves over the deleted prefix only.
        assert await delete(s, got[1]) == "deleted"
        assert await committed(s) == [0, 0]
        assert await delete(s, got[0]) == "deleted"
        assert await committed(s) == [2, 0]
        assert await delete(s, got[0]) == "already_deleted"  # a retried delete
        assert await delete(s, got[2]) == "deleted"
        assert await committed(s) == [3, 0]

    run(backend, tmp_path, body)


def test_an_unacked_message_comes_back_after_its_timeout_with_its_count_raised(
    backend: Any, tmp_path: Path
) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        first = await receive(s, bounds(2), NOW, 1)
        assert [(r.offset, r.receives) for r in first] == [(0, 1)]
        assert [r.offset for r in await receive(s, bounds(2), NOW + VIS - 1, 1)] == [1]
        again = await receive(s, bounds(2), NOW + VIS, 5)
        assert [(r.offset, r.receives, r.first_ms) for r in again] == [(0, 2, NOW)]
        assert await delete(s, first[0]) == "stale_receipt"  # received again since: not deleted
        assert await committed(s) == [0]
        assert await delete(s, again[0]) == "deleted"
        assert await committed(s) == [1]

    run(backend, tmp_path, body)


def test_visibility_changes_by_receipt(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        (r,) = await receive(s, bounds(1), NOW, 1)
        change = s.change_visibility
        assert await change("g", "", 0, 0, r.receives, r.first_ms, NOW, NOW + 90_000) == "changed"
        assert await receive(s, bounds(1), NOW + VIS, 1) == []  # kept hidden past the first timeout
        assert await change("g", "", 0, 0, r.receives, r.first_ms, NOW + 1, NOW + 1) == "changed"  # release
        (back,) = await receive(s, bounds(1), NOW + 1, 1)
        assert back.receives == 2
        assert await change("g", "", 0, 0, r.receives, r.first_ms, NOW + 2, NOW + 60_000) == "stale_receipt"
        late = NOW + 1 + VIS
        assert await change("g", "", 0, 0, back.receives, back.first_ms, late, late + 5) == "not_in_flight"

    run(backend, tmp_path, body)


def test_a_message_out_of_receives_comes_back_as_a_dead_letter(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        at = NOW
        for n in (1, 2, 3):
            (r,) = await receive(s, bounds(1), at, 1)
            assert (r.receives, r.dead_letter) == (n, False)
            at += VIS
        (dead,) = await receive(s, bounds(1), at, 1)
        assert dead.dead_letter and dead.receives == 3
        assert await receive(s, bounds(1), at, 1) == []  # hidden while the caller moves it
        assert (
            await s.delete_message("g", "", 0, 0, dead.receives, dead.first_ms, at, dead_letter=True)
            == "deleted"
        )
        table = await s.table("g", "")
        assert table is not None and (table[0].committed, table[0].dead_lettered) == (1, 1)

    run(backend, tmp_path, body)


def test_a_stuck_message_holds_back_no_other(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0], NOW)
        got = await receive(s, bounds(50, 50), NOW, 100)
        assert len(got) == 100
        stuck = got[0]
        for r in got[1:]:  # every message but the first of queue 0 is deleted
            assert await delete(s, r) == "deleted"
        assert await committed(s) == [0, 50]  # queue 0 waits on its first, queue 1 does not
        # New messages of both queues are still handed out, past the stuck one.
        fresh = await receive(s, bounds(60, 60), NOW + 1, 100)
        assert sorted((r.queue, r.offset) for r in fresh) == [(q, o) for q in (0, 1) for o in range(50, 60)]
        assert await delete(s, stuck) == "deleted"
        assert (await committed(s))[0] == 50

    run(backend, tmp_path, body)


def test_the_window_bounds_what_a_queue_keeps(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        got = await receive(s, bounds(100), NOW, 100, window=10)
        assert [r.offset for r in got] == list(range(10))  # no more than the window past committed
        await delete(s, got[0])
        assert [r.offset for r in await receive(s, bounds(100), NOW, 100, window=10)] == [10]

    run(backend, tmp_path, body)


def test_receipts_and_positions_survive_a_restart(backend: Any, tmp_path: Path) -> None:
    kept: dict[str, list[Received]] = {}

    async def first(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0], NOW)
        kept["got"] = got = await receive(s, bounds(3, 1), NOW, 4)
        assert await delete(s, got[0]) == "deleted"
        assert await delete(s, got[2]) == "deleted"
        r = got[3]
        await s.change_visibility("g", "", r.queue, r.offset, r.receives, r.first_ms, NOW, NOW + 5)

    async def second(s: OffsetStore) -> None:
        got = kept["got"]
        assert await committed(s) == [1, 0]
        assert await receive(s, bounds(3, 1), NOW + 1, 10) == []  # still hidden after the restart
        assert [(r.queue, r.offset) for r in await receive(s, bounds(3, 1), NOW + 5, 10)] == [(1, 0)]
        back = await receive(s, bounds(3, 1), NOW + VIS, 10)
        assert [(r.queue, r.offset, r.receives) for r in back] == [(0, 1, 2)]  # the one never deleted
        assert await delete(s, got[2]) == "already_deleted"
        assert await delete(s, back[0]) == "deleted"
        assert await committed(s) == [3, 0]

    run(backend, tmp_path, first)
    run(backend, tmp_path, second)


def test_a_reset_drops_the_receipts_of_its_queue(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        got = await receive(s, bounds(5), NOW, 5)
        await s.reset("g", "", 0, 2)
        assert await committed(s) == [2]
        assert await delete(s, got[3]) == "stale_receipt"  # the reset forgot it
        again = await receive(s, bounds(5), NOW + 1, 10)
        assert [(r.offset, r.receives) for r in again] == [(2, 1), (3, 1), (4, 1)]

    run(backend, tmp_path, body)


def test_retention_moves_the_window_past_what_it_removed(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0], NOW)
        got = await receive(s, bounds(4), NOW, 2)
        again = await receive(s, bounds(6, mins=(3,)), NOW + 1, 10)
        assert [r.offset for r in again] == [3, 4, 5]
        assert await committed(s) == [3]
        assert await delete(s, got[0]) == "already_deleted"  # below the committed offset now

    run(backend, tmp_path, body)


def test_receipt_counts_are_the_hidden_and_the_deleted_ahead(backend: Any, tmp_path: Path) -> None:
    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0], NOW)
        assert await s.receipt_counts("g", "", NOW) == {}
        got = await receive(s, bounds(3, 2), NOW, 4)  # 0:0, 0:1, 0:2, 1:0
        assert await delete(s, got[1]) == "deleted"  # past a message still hidden: counted
        counts = await s.receipt_counts("g", "", NOW)
        assert counts[0] == (2, 1) and counts[1] == (1, 0)
        # Past their visibility they are no longer hidden; deleted in order, no longer counted.
        assert await delete(s, got[0]) == "deleted"
        later = await s.receipt_counts("g", "", NOW + VIS)
        assert later.get(0, (0, 0)) == (0, 0) and later.get(1, (0, 0)) == (0, 0)

    run(backend, tmp_path, body)


def test_an_ordered_receive_hands_a_queue_out_in_order_one_batch_at_a_time(
    backend: Any, tmp_path: Path
) -> None:
    """SQS FIFO: while any message of a queue is hidden the queue gives nothing more; once its
    batch is deleted or visible again, its oldest not deleted go out first, in offset order."""

    async def body(s: OffsetStore) -> None:
        await s.ensure_table("g", "", [0, 0], NOW)
        b = bounds(5, 3)
        first = await receive(s, b, NOW, 3, ordered=True)
        assert [(r.queue, r.offset) for r in first] == [(0, 0), (0, 1), (0, 2)]
        # Queue 0 is held while its batch is hidden: queue 1 goes on.
        assert [(r.queue, r.offset) for r in await receive(s, b, NOW, 10, ordered=True)] == [
            (1, 0),
            (1, 1),
            (1, 2),
        ]
        assert await receive(s, b, NOW + 1, 10, ordered=True) == []
        # Offset 1 deleted, 0 and 2 let go: back in order, then the new ones.
        assert await delete(s, first[1]) == "deleted"
        for r in (first[0], first[2]):
            visible = await s.change_visibility("g", "", r.queue, r.offset, r.receives, r.first_ms, NOW, NOW)
            assert visible == "changed"
        again = await receive(s, b, NOW + 2, 10, ordered=True)
        assert [(r.queue, r.offset, r.receives) for r in again] == [
            (0, 0, 2),
            (0, 2, 2),
            (0, 3, 1),
            (0, 4, 1),
        ]
        # A visibility timeout running out frees a queue as a delete does.
        assert [(r.queue, r.offset) for r in await receive(s, b, NOW + VIS, 10, ordered=True)] == [
            (1, 0),
            (1, 1),
            (1, 2),
        ]
        for r in again:
            assert await delete(s, r) == "deleted"
        assert await committed(s) == [5, 0]
        # An unordered receive of the same consumer is unaffected.
        assert [r.offset for r in await receive(s, b, NOW + 2 * VIS, 10)] == [0, 1, 2]

    run(backend, tmp_path, body)
