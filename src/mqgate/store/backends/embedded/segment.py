"""One segment file of a queue log and its in-memory offset index."""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Final

from mqgate.durable.framing import HEADER_BYTES, framed_size, iter_payloads

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".idx"
_POSITION_TYPE: Final = "Q"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    """Records `base .. base+len(positions)-1`; `positions[i]` is the byte position of
    record `base+i`, so a read from any offset seeks instead of scanning."""

    __slots__ = (
        "_read_fd",
        "base",
        "indexed_on_disk",
        "log_path",
        "max_timestamp_ms",
        "positions",
        "size",
    )

    def __init__(self, directory: Path, base: int) -> None:
        self.base = base
        self.log_path = directory / (segment_name(base) + LOG_SUFFIX)
        self.positions: array[int] = array(_POSITION_TYPE)
        self.size = 0
        self.indexed_on_disk = 0  # how many positions the .idx file holds
        self.max_timestamp_ms: int | None = None
        self._read_fd: int | None = None

    @property
    def index_path(self) -> Path:
        return self.log_path.with_suffix(INDEX_SUFFIX)

    @property
    def end(self) -> int:
        return self.base + len(self.positions)

    def read_fd(self) -> int:
        if self._read_fd is None:
            self._read_fd = os.open(self.log_path, os.O_RDONLY)
        return self._read_fd

    def pread(self, start: int, stop: int) -> bytes:
        return os.pread(self.read_fd(), stop - start, start)

    def byte_range(self, first: int, stop: int) -> tuple[int, int]:
        """Byte span of records `[first, stop)` (absolute offsets within this segment)."""
        start_pos = self.positions[first - self.base]
        i = stop - self.base
        stop_pos = self.positions[i] if i < len(self.positions) else self.size
        return start_pos, stop_pos

    def close(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None

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

    def scan_tail(self, from_pos: int) -> int:
        """Verify records from `from_pos`, index them, and return where the intact data ends."""
        with open(self.log_path, "rb") as fh:
            fh.seek(from_pos)
            data = fh.read()
        good_end = from_pos
        positions = self.positions
        for pos, payload in iter_payloads(data):
            positions.append(from_pos + pos)
            good_end = from_pos + pos + HEADER_BYTES + len(payload)
        return good_end

    def write_index_tail(self) -> None:
        """Append the positions not yet in the .idx file and fsync it."""
        fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            offset_bytes = self.indexed_on_disk * self.positions.itemsize
            os.ftruncate(fd, offset_bytes)
            os.pwrite(fd, self.positions[self.indexed_on_disk :].tobytes(), offset_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.indexed_on_disk = len(self.positions)

    def delete_files(self) -> None:
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)
