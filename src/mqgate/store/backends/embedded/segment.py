"""One segment file of a queue log and its in-memory offset index, and how a segment's bytes
are indexed: each record at the offset it carries (`records.py`)."""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Final, NamedTuple

from mqgate.durable.framing import HEADER_BYTES, framed_size, payload_from, scan
from mqgate.durable.handles import FileHandles, Handle
from mqgate.store.backends.embedded.records import LEGACY, NOT_A_RECORD, decode, own_offset

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".idx"
_POSITION_TYPE: Final = "Q"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Gap(NamedTuple):
    """Damaged bytes and the offsets they held: those offsets stay, and reads skip them."""

    pos: int
    size: int
    first: int
    held: int  # how many offsets; 0: stray bytes that held no record

    def describe(self) -> str:
        held = {0: "no record", 1: f"offset {self.first}"}.get(
            self.held, f"offsets {self.first}-{self.first + self.held - 1}"
        )
        return f"{self.size} bytes at byte {self.pos} ({held})"


class Indexed(NamedTuple):
    positions: list[int]  # of the offsets from the first one asked for, gaps included
    end: int  # where the bytes to keep end; after them, a torn tail
    gaps: list[Gap]
    legacy: int  # format-2 records among them, numbered by their place


def describe_gaps(gaps: list[Gap]) -> str:
    """'N damaged records kept as gaps: …' for the log, /healthz and `mqgate check`."""
    lost = sum(g.held for g in gaps)
    return f"{lost} damaged records kept as gaps, reads skip them: " + ", ".join(
        g.describe() for g in gaps[:5]
    )


def index_records(
    data: bytes | memoryview, *, pos0: int, first: int, known: tuple[int, int] | None = None
) -> Indexed:
    """Index the records of `data`, a segment's bytes from byte `pos0` on, from offset `first`:
    each record at the offset it carries, so damaged bytes keep the offsets they held (the
    ones between the intact records around them) and no offset after them moves. A record out
    of order (an offset already passed) counts as damage. A format-2 record takes the next
    offset, and damage before it one offset, as that format cannot tell more.

    `known`: (end offset, end byte) the segment is known to hold (a sealed segment: the next
    one's base and its size; the active one: its checkpoint). Damage there is not a torn write:
    its bytes stay and its offsets up to the end offset are kept as a gap, so the queue's end
    never goes back; a record there claiming an offset past it counts as damage."""
    end_offset, end_pos = known if known is not None else (-1, -1)
    positions: list[int] = []
    gaps: list[Gap] = []
    expected = first
    good_end = pos0
    damaged_at = -1
    legacy = 0
    for rel_pos, rel_end, payload in scan(data):
        pos = pos0 + rel_pos
        own = NOT_A_RECORD if payload is None else own_offset(payload)
        if own == LEGACY:
            legacy += 1
            own = expected + (damaged_at >= 0)
        if own < expected or (pos < end_pos and own >= end_offset):
            damaged_at = pos if damaged_at < 0 else damaged_at
            continue
        at = pos if damaged_at < 0 else damaged_at
        if at < pos or own > expected:
            gaps.append(Gap(at, pos - at, expected, own - expected))
            positions.extend([at] * (own - expected))
        positions.append(pos)
        expected = own + 1
        good_end = pos0 + rel_end
        damaged_at = -1
    if known is not None and (good_end < end_pos or expected < end_offset):
        lost = max(0, end_offset - expected)
        gaps.append(Gap(good_end, max(0, end_pos - good_end), expected, lost))
        positions.extend([good_end] * lost)
        good_end = max(good_end, end_pos)
    return Indexed(positions, good_end, gaps, legacy)


class Segment:
    """Records `base .. base+len(positions)-1`; `positions[i]` is the byte position of
    record `base+i`, so a read from any offset seeks instead of scanning."""

    __slots__ = (
        "_handles",
        "_identity",
        "_reader",
        "base",
        "indexed_on_disk",
        "log_path",
        "max_timestamp_ms",
        "positions",
        "size",
    )

    def __init__(self, directory: Path, base: int, handles: FileHandles | None = None) -> None:
        self._handles = handles
        self.base = base
        self.log_path = directory / (segment_name(base) + LOG_SUFFIX)
        self.positions: array[int] = array(_POSITION_TYPE)
        self.size = 0
        self.indexed_on_disk = 0  # how many positions the .idx file holds
        self.max_timestamp_ms: int | None = None
        self._reader: Handle | None = None
        self._identity: tuple[str, int] | None = None

    @property
    def index_path(self) -> Path:
        return self.log_path.with_suffix(INDEX_SUFFIX)

    @property
    def end(self) -> int:
        return self.base + len(self.positions)

    def read_fd(self) -> int:
        if self._reader is None:
            self._reader = Handle(self.log_path, os.O_RDONLY, os.O_RDONLY, self._handles)
        return self._reader.fd

    def identity(self) -> tuple[str, int]:
        """The log file's absolute path and inode: how a reader in another process opens it
        and knows it for the same file (not one made since under its name)."""
        if self._identity is None:
            self._identity = (str(self.log_path.absolute()), os.fstat(self.read_fd()).st_ino)
        return self._identity

    def pread(self, start: int, stop: int) -> bytes:
        return os.pread(self.read_fd(), stop - start, start)

    def read_at(self, offset: int) -> bytes | None:
        """The message at `offset`, checked on its own: the record the index leads to must be
        intact and carry this offset (a format-2 record: span exactly its index entry), else
        None (a gap, damage, or an index entry that is wrong)."""
        i = offset - self.base
        start = self.positions[i]
        # A wrong entry may point anywhere: never past the segment's end.
        stop = min(self.positions[i + 1] if i + 1 < len(self.positions) else self.size, self.size)
        if stop <= start:
            return None
        found = payload_from(self.pread(start, stop))
        if found is None:
            return None
        own, message = decode(found[0])
        return message if own == offset or (own == LEGACY and found[1] == stop - start) else None

    def byte_range(self, first: int, stop: int) -> tuple[int, int]:
        """Byte span of records `[first, stop)` (absolute offsets within this segment)."""
        start_pos = self.positions[first - self.base]
        i = stop - self.base
        stop_pos = self.positions[i] if i < len(self.positions) else self.size
        return start_pos, stop_pos

    def close(self) -> None:
        self._identity = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    # --- index file -------------------------------------------------------------------

    def load_index(self, limit: int | None = None) -> None:
        try:
            raw = self.index_path.read_bytes()
        except FileNotFoundError:
            raw = b""
        usable = len(raw) - len(raw) % self.positions.itemsize
        self.positions = array(_POSITION_TYPE)
        self.positions.frombytes(raw[:usable])
        if limit is not None and len(self.positions) > limit:
            del self.positions[limit:]
        self.indexed_on_disk = len(self.positions)

    def clear_index(self) -> None:
        self.positions = array(_POSITION_TYPE)
        self.indexed_on_disk = 0

    def index_matches_log(self, log_size: int) -> bool:
        """True if the index covers the log exactly: its last entry's record ends at EOF."""
        if not self.positions:
            return log_size == 0
        last = self.positions[-1]
        if last + HEADER_BYTES > log_size:
            return False
        with open(self.log_path, "rb") as fh:
            fh.seek(last)
            header = fh.read(HEADER_BYTES)
        return last + framed_size(header) == log_size

    def scan_tail(self, from_pos: int, known: tuple[int, int] | None = None) -> Indexed:
        """Verify the records from byte `from_pos` on and index them after the ones indexed
        (`index_records`)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(from_pos)
            data = fh.read()
        indexed = index_records(data, pos0=from_pos, first=self.end, known=known)
        self.positions.extend(indexed.positions)
        return indexed

    def reindex(self) -> Indexed:
        """The whole segment indexed again from its records, keeping its offsets and size."""
        return index_records(self.pread(0, self.size), pos0=0, first=self.base, known=(self.end, self.size))

    def use_index(self, positions: list[int]) -> None:
        """Take these positions instead of the index (its file is written again in full)."""
        self.positions = array(_POSITION_TYPE, positions)
        self.indexed_on_disk = 0

    def write_index_tail(self) -> None:
        """Append the positions not yet in the .idx file and fsync it."""
        fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            offset_bytes = self.indexed_on_disk * self.positions.itemsize
            os.ftruncate(fd, offset_bytes)
            data = memoryview(self.positions[self.indexed_on_disk :].tobytes())
            done = 0
            while done < len(data):  # a short write is followed by another try (or its error)
                done += os.pwrite(fd, data[done:], offset_bytes + done)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.indexed_on_disk = len(self.positions)

    def delete_files(self) -> None:
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)
