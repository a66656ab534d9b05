"""The records of the offsets journal: what they hold and how replaying one changes the tables.

`t` is a whole table (committed offsets and dead-letter counts of every queue), `c` one queue's
commit, `x` a table removed (an expired broadcast client).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from mqgate.durable.framing import scan
from mqgate.offsets.interface import OffsetEntry

TableKey = tuple[str, str]  # (consumer group, clientId; "" in cluster mode)


def table_record(key: TableKey, table: list[OffsetEntry], seen_ms: int) -> list[Any]:
    return ["t", key[0], key[1], [e.committed for e in table], [e.dead_lettered for e in table], seen_ms]


def commit_record(key: TableKey, queue: int, committed: int, dead: int, now_ms: int) -> list[Any]:
    return ["c", key[0], key[1], queue, committed, dead, now_ms]


def apply_record(
    tables: dict[TableKey, list[OffsetEntry]], seen_ms: dict[TableKey, int], rec: list[Any]
) -> None:
    """Replay one journal record onto the tables (at start-up)."""
    kind = rec[0]
    if kind == "t":
        _, group, client, committed, dead, seen = rec
        tables[(group, client)] = [
            OffsetEntry(committed=c, dead_lettered=d) for c, d in zip(committed, dead, strict=True)
        ]
        seen_ms[(group, client)] = seen
    elif kind == "c":
        _, group, client, queue, committed, dead, seen = rec
        table = tables.get((group, client))
        if table is not None and queue < len(table):
            table[queue].committed = committed
            table[queue].dead_lettered = dead
            seen_ms[(group, client)] = seen
    elif kind == "x":
        tables.pop((rec[1], rec[2]), None)
        seen_ms.pop((rec[1], rec[2]), None)


_decode = msgspec.msgpack.Decoder().decode


@dataclass(slots=True)
class Replayed:
    """What a journal holds: the tables, the records that apply, and what could not be read."""

    tables: dict[TableKey, list[OffsetEntry]] = field(default_factory=dict)
    seen_ms: dict[TableKey, int] = field(default_factory=dict)
    good: list[bytes] = field(default_factory=list)  # the payloads of the records that applied
    dropped: list[str] = field(default_factory=list)  # where each damaged record was
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
