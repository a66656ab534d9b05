"""One segment file of a queue log and its in-memory offset index."""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Final

from mqgate.durable.framing import HEADER_BYTES, framed_size, scan
from mqgate.durable.handles import FileHandles, Handle

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".idx"
_POSITION_TYPE: Final = "Q"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    """Records `base .. base+len(positions)-1`; `positions[i]` is the byte position of
    record `base+i`, so a read from any offset seeks instead of scanning."""

    __slots__ = (
        "_handles",
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

    def pread(self, start: int, stop: int) -> bytes:
        return os.pread(self.read_fd(), stop - start, start)

    def byte_range(self, first: int, stop: int) -> tuple[int, int]:
        """Byte span of records `[first, stop)` (absolute offsets within this segment)."""
        start_pos = self.positions[first - self.base]
        i = stop - self.base
        stop_pos = self.positions[i] if i < len(self.positions) else self.size
        return start_pos, stop_pos

    def close(self) -> None:
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

    def scan_tail(self, from_pos: int) -> tuple[int, list[tuple[int, int]]]:
        """Verify records from `from_pos` and index them: (where the intact data ends, the
        damaged stretches skipped as (position, bytes)). A damaged stretch followed by intact
        records keeps one offset (reads skip it); the records after it keep theirs."""
        with open(self.log_path, "rb") as fh:
            fh.seek(from_pos)
            data = fh.read()
        good_end = from_pos
        positions = self.positions
        damaged: list[tuple[int, int]] = []
        for pos, end, payload in scan(data):
            positions.append(from_pos + pos)
            good_end = from_pos + end
            if payload is None:
                damaged.append((from_pos + pos, end - pos))
        return good_end, damaged

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
