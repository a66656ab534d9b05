"""The records of the offsets journal: what they hold and how replaying one changes the tables.

`t` is a whole table (committed offsets and dead-letter counts of every queue, and the
message-level windows), `c` one queue's commit, `x` a table removed (an expired broadcast
client). A message-level consumer's steps: `mr` messages received (their receipts and the
window's new end), `md` one deleted, `mv` one's visibility changed; replaying them takes the
same steps (core/message_window.py), so the committed offset follows as it did.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mqgate.core.message_window import InFlight, Received, Window, delete, window_from, window_state
from mqgate.durable.framing import scan
from mqgate.offsets.interface import OffsetEntry

TableKey = tuple[str, str]  # (consumer group, clientId; "" in cluster mode)


def table_record(key: TableKey, table: list[OffsetEntry], seen_ms: int) -> list[Any]:
    windows = {q: window_state(e.window) for q, e in enumerate(table) if e.window is not None}
    rec = ["t", key[0], key[1], [e.committed for e in table], [e.dead_lettered for e in table], seen_ms]
    return [*rec, windows] if windows else rec


def received_record(key: TableKey, queue: int, w: Window, got: list[Received]) -> list[Any]:
    """Messages received (and the window's front, which retention may have moved)."""
    flights = [[r.offset, w.inflight[r.offset].visible_ms, r.receives, r.first_ms] for r in got]
    return ["mr", key[0], key[1], queue, w.committed, w.end, flights]


def deleted_record(key: TableKey, queue: int, offset: int, dead: int, now_ms: int) -> list[Any]:
    return ["md", key[0], key[1], queue, offset, dead, now_ms]


def visibility_record(key: TableKey, queue: int, offset: int, visible_ms: int) -> list[Any]:
    return ["mv", key[0], key[1], queue, offset, visible_ms]


def commit_record(key: TableKey, queue: int, committed: int, dead: int, now_ms: int) -> list[Any]:
    return ["c", key[0], key[1], queue, committed, dead, now_ms]


def apply_record(
    tables: dict[TableKey, list[OffsetEntry]], seen_ms: dict[TableKey, int], rec: list[Any]
) -> None:
    """Replay one journal record onto the tables (at start-up)."""
    kind = rec[0]
    if kind == "t":
        _, group, client, committed, dead, seen = rec[:6]
        windows = rec[6] if len(rec) > 6 else {}
        tables[(group, client)] = [
            OffsetEntry(
                committed=c, dead_lettered=d, window=window_from(c, windows[q]) if q in windows else None
            )
            for q, (c, d) in enumerate(zip(committed, dead, strict=True))
        ]
        seen_ms[(group, client)] = seen
    elif kind == "c":
        _, group, client, queue, committed, dead, seen = rec
        table = tables.get((group, client))
        if table is not None and queue < len(table):
            table[queue].committed = committed
            table[queue].dead_lettered = dead
            table[queue].window = None
            seen_ms[(group, client)] = seen
    elif kind in ("mr", "md", "mv"):
        _apply_message_step(tables, seen_ms, rec)
    elif kind == "x":
        tables.pop((rec[1], rec[2]), None)
        seen_ms.pop((rec[1], rec[2]), None)


def _apply_message_step(
    tables: dict[TableKey, list[OffsetEntry]], seen_ms: dict[TableKey, int], rec: list[Any]
) -> None:
    table = tables.get((rec[1], rec[2]))
    queue = rec[3]
    if table is None or not 0 <= queue < len(table):
        return
    e = table[queue]
    w = e.window if e.window is not None else Window(e.committed, e.committed)
    e.window = w
    if rec[0] == "mr":
        w.clamp(rec[4])
        w.end = max(w.end, rec[5])
        for offset, visible, receives, first in rec[6]:
            if offset >= w.committed and offset not in w.deleted:
                w.hide(offset, InFlight(visible, receives, first))
    elif rec[0] == "md":
        _, _, _, _, offset, dead, now = rec
        f = w.inflight.get(offset)
        if f is not None:
            delete(w, offset, f.receives, f.first_ms)
        e.dead_lettered = dead
        seen_ms[(rec[1], rec[2])] = now
    else:
        offset, visible = rec[4], rec[5]
        f = w.inflight.get(offset)
        if f is not None:
            w.hide(offset, InFlight(visible, f.receives, f.first_ms))
    e.committed = w.committed


_decode = msgspec.msgpack.Decoder().decode


class Replayed(msgspec.Struct):
    """What a journal holds: the tables, the records that apply, and what could not be read."""

    tables: dict[TableKey, list[OffsetEntry]] = msgspec.field(default_factory=dict)
    seen_ms: dict[TableKey, int] = msgspec.field(default_factory=dict)
    good: list[bytes] = msgspec.field(default_factory=list)  # the payloads of the records that applied
    dropped: list[str] = msgspec.field(default_factory=list)  # where each damaged record was
    valid_bytes: int = 0  # the end of the last whole frame: a torn tail follows it


def replay(data: bytes) -> Replayed:
    """Replay a journal, record by record: a damaged record costs that record only."""
    out = Replayed()
    for pos, end, payload in scan(data):
        out.valid_bytes = end
        if payload is None:
            out.dropped.append(f"{end - pos} damaged bytes at {pos}")
            continue
        try:
            apply_record(out.tables, out.seen_ms, _decode(payload))
        except (msgspec.DecodeError, ValueError, TypeError, IndexError) as exc:
            out.dropped.append(f"unreadable record at {pos}: {exc}")
            continue
        out.good.append(payload)
    return out
