"""The schedule log (SPEC S4, S6): flagged records, replay, and the compacted rewrite.

Records are framed by `mqgate.durable.framing`, like the message logs, and hold one msgpack
array whose first element is the flag:
    ["h", next_seq]             high-water mark: no seq below it is ever assigned again
    ["a", seq, payload, dests]  add: a held message and its destinations
    ["m", seq, dests]           modify: the message's destinations from now on
    ["d", seq]                  delete: the message is gone
`dests` keeps every destination at its original position (a destination's index is its
identity) with nil where one was settled. A compacted log is one "h" record followed by one
"a" record per live message, in seq order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from mqgate.durable.framing import frame, framed_size, scan
from mqgate.scheduler.interface import Destination

# Write the compacted log in pieces of about this size (bounds the memory of one write).
_WRITE_CHUNK_BYTES: Final = 4 * 1024 * 1024

Dests = tuple[Destination | None, ...]


class Mark(msgspec.Struct, array_like=True, frozen=True, tag="h"):
    next_seq: int


# An Add record is also the in-memory form of a held message: immutable (a change replaces it),
# so a compaction can write a snapshot of the live set while intake goes on.
class Add(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="a"):
    seq: int
    payload: bytes
    dests: Dests


class Modify(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="m"):
    seq: int
    dests: Dests


class Delete(msgspec.Struct, array_like=True, frozen=True, tag="d"):
    seq: int


encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Mark | Add | Modify | Delete).decode


def framed(record: Mark | Add | Modify | Delete) -> bytes:
    return frame(encode(record))


class Replayed(msgspec.Struct):
    held: dict[int, Add]  # live messages in log order, which is seq order
    next_seq: int
    records: int  # intact records read
    valid_bytes: int  # where the intact records end (a torn or corrupt tail follows)
    dropped: list[str]  # damaged or unreadable records skipped (the ones after them are kept)
    compacted: list[bytes | memoryview]  # the compacted log, in pieces
    # The log already is its compacted form (one mark, then live unchanged adds, no torn tail):
    # recovery may keep the file instead of writing the same bytes again.
    already_compact: bool = False


def replay(data: bytes) -> Replayed:
    """Rebuild the live messages from a log's flags, skipping a damaged record (the ones after
    it count), stopping at a torn tail, and lay out the compacted log: unchanged add records
    are copied from `data` as they are."""
    held: dict[int, Add] = {}
    # Where each live message's add record starts, while no modify record has changed it.
    unchanged: dict[int, int] = {}
    next_seq = 1
    records = 0
    end = 0
    starts_with_mark = False
    dropped: list[str] = []
    # One pass, decoding every record in full. (Two passes, flags and seqs first and then only
    # the live records, cost less for a log of mostly deletes but 40% more for a compact one.)
    for pos, rec_end, payload in scan(data):
        end = rec_end
        if payload is None:
            dropped.append(f"{rec_end - pos} damaged bytes at {pos}")
            continue
        records += 1
        try:
            rec = _decode(payload)
        except msgspec.DecodeError as exc:  # intact (the CRC matched) but unreadable
            dropped.append(f"unreadable record at {pos}: {exc}")
            continue
        if type(rec) is Add:
            held[rec.seq] = rec
            unchanged[rec.seq] = pos
            if rec.seq >= next_seq:
                next_seq = rec.seq + 1
        elif type(rec) is Modify:
            old = held.get(rec.seq)
            if old is None:
                continue
            unchanged.pop(rec.seq, None)
            if any(d is not None for d in rec.dests):
                held[rec.seq] = Add(rec.seq, old.payload, rec.dests)
            else:
                del held[rec.seq]
        elif type(rec) is Delete:
            held.pop(rec.seq, None)
            unchanged.pop(rec.seq, None)
        elif type(rec) is Mark:
            next_seq = max(next_seq, rec.next_seq)
            starts_with_mark = starts_with_mark or records == 1
    compact = (
        starts_with_mark
        and not dropped
        and records == len(held) + 1 == len(unchanged) + 1
        and end == len(data)
    )
    compacted = _compacted(data, held, unchanged, next_seq)
    return Replayed(held, next_seq, records, end, dropped, compacted, compact)


def _compacted(
    data: bytes, held: dict[int, Add], unchanged: dict[int, int], next_seq: int
) -> list[bytes | memoryview]:
    view = memoryview(data)
    pieces: list[bytes | memoryview] = [framed(Mark(next_seq))]
    # Adjacent unchanged add records are copied as one slice: after a clean shutdown or an
    # earlier compaction the whole live set is a handful of slices.
    run_start = run_end = -1
    for seq, rec in held.items():
        pos = unchanged.get(seq)
        if pos is None:
            if run_end > run_start:
                pieces.append(view[run_start:run_end])
                run_start = run_end = -1
            pieces.append(framed(rec))
            continue
        rec_end = pos + framed_size(data, pos)
        if pos != run_end:
            if run_end > run_start:
                pieces.append(view[run_start:run_end])
            run_start = pos
        run_end = rec_end
    if run_end > run_start:
        pieces.append(view[run_start:run_end])
    return pieces


def snapshot_pieces(next_seq: int, held: Sequence[Add]) -> Iterable[bytes]:
    """The compacted log of a snapshot of the live set, in pieces of a few MB."""
    batch = [framed(Mark(next_seq))]
    size = 0
    for rec in held:
        piece = framed(rec)
        batch.append(piece)
        size += len(piece)
        if size >= _WRITE_CHUNK_BYTES:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)
