"""One queue: an append-only log in size-rolled segments, with crash recovery.

Durability bookkeeping, from newest to oldest:
- `written_end`: next offset after the last write() (maybe only in the page cache);
- `synced`: what the last fsync covered (segment base, end offset, byte position);
- `visible_end`: what readers may see: `synced.end` with fsync=always, `written_end` otherwise;
- the checkpoint file: a synced prefix whose index is on disk, so start-up only verifies
  the records after it.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mqgate.durable.append_file import AppendFile
from mqgate.durable.framing import HEADER_BYTES, frame, iter_payloads
from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import CorruptRecord
from mqgate.store.backends.embedded.segment import LOG_SUFFIX, Segment

CHECKPOINT_FILE: Final = "checkpoint.json"


class QueueLog:
    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        committer: GroupCommitter,
        on_visible: Callable[[], None],
        timestamp_of: Callable[[bytes], int],
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.committer = committer
        self.on_visible = on_visible
        self.timestamp_of = timestamp_of
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self._file: AppendFile | None = None  # the active segment's log, open for appending
        self.visible_end = 0
        self._synced = (0, 0, 0)  # (segment base, end offset, byte position)
        self._pending_sync = (0, 0, 0)
        self._checkpointed = (0, 0, 0)
        self.bytes_since_checkpoint = 0

    # --- bounds -------------------------------------------------------------------------

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def min_offset(self) -> int:
        return self.segments[0].base

    @property
    def written_end(self) -> int:
        return self.active.end

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # --- start-up -----------------------------------------------------------------------

    def recover(self) -> int:
        """Open the log, verify what the checkpoint does not cover, truncate a torn or
        corrupt tail, and return how many bytes were cut off."""
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in self.directory.glob("*" + LOG_SUFFIX))
        if not bases:
            bases = [0]
            (self.directory / Segment(self.directory, 0).log_path.name).touch()
        checkpoint = self._read_checkpoint()
        self.segments = [Segment(self.directory, b) for b in bases]
        for seg in self.segments[:-1]:
            size = seg.log_path.stat().st_size
            seg.size = size
            seg.load_index()
            if not seg.index_matches_log(size):
                seg.clear_index()
                seg.size = seg.scan_tail(0)
                seg.write_index_tail()
        last = self.active
        file_size = last.log_path.stat().st_size
        if checkpoint is not None and checkpoint[0] == last.base and checkpoint[2] <= file_size:
            last.load_index(limit=checkpoint[1] - last.base)
            start = checkpoint[2] if len(last.positions) == checkpoint[1] - last.base else 0
            if start == 0:
                last.clear_index()
        else:
            last.load_index(limit=0)
            start = 0
        good_end = last.scan_tail(start)
        cut = file_size - good_end
        self._file = AppendFile.reopen(last.log_path, good_end)
        last.size = good_end
        self._bases = [s.base for s in self.segments]
        self._synced = (last.base, last.end, good_end)
        self.visible_end = last.end
        self.checkpoint()
        return cut

    # --- writing ------------------------------------------------------------------------

    def append(self, payloads: list[bytes], timestamp_ms: int) -> int:
        """Write records and return the first one's offset. Durability is the caller's
        `committer.durable()`; visibility follows `after_sync` (or is immediate)."""
        buf = b"".join([frame(p) for p in payloads])
        if self.active.size and self.active.size + len(buf) > self.segment_bytes:
            self._roll()
        seg = self.active
        assert self._file is not None
        self._file.append(buf)  # a failed write leaves the file, and so the index, as they were
        first = seg.end
        pos = seg.size
        positions = seg.positions
        for p in payloads:
            positions.append(pos)
            pos += HEADER_BYTES + len(p)
        seg.size = pos
        seg.max_timestamp_ms = timestamp_ms
        self.bytes_since_checkpoint += len(buf)
        self.committer.mark_dirty(self)
        if not self.committer.waits_for_fsync:
            self.visible_end = seg.end
            self.on_visible()
        return first

    def sync_fds(self) -> list[int]:
        seg = self.active
        self._pending_sync = (seg.base, seg.end, seg.size)
        assert self._file is not None
        return [self._file.fd]

    def after_sync(self) -> None:
        if self._pending_sync[1] <= self._synced[1]:
            return
        self._synced = self._pending_sync
        if self.committer.waits_for_fsync and self._synced[1] > self.visible_end:
            self.visible_end = self._synced[1]
            self.on_visible()

    def _roll(self) -> None:
        old = self.active
        sealed = self._file
        assert sealed is not None
        sealed.sync()  # once per segment: the sealed segment is durable as a whole
        old.write_index_tail()
        self.committer.close_after_next_sync(sealed.close)
        new = Segment(self.directory, old.end)
        self._file = AppendFile.create(new.log_path)
        self.segments.append(new)
        self._bases.append(new.base)
        self._synced = (new.base, new.base, 0)
        if self.visible_end < old.end:
            self.visible_end = old.end
            self.on_visible()
        self.checkpoint()

    # --- checkpoints --------------------------------------------------------------------

    def _checkpoint_path(self) -> Path:
        return self.directory / CHECKPOINT_FILE

    def _read_checkpoint(self) -> tuple[int, int, int] | None:
        try:
            data = json.loads(self._checkpoint_path().read_text())
            return int(data["base"]), int(data["end"]), int(data["pos"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def checkpoint(self) -> None:
        """Persist the index and declare the synced prefix verified."""
        synced = self._synced
        if synced == self._checkpointed:
            return
        seg = self.active
        if synced[0] != seg.base:
            return
        seg.write_index_tail()
        tmp = self._checkpoint_path().with_suffix(".tmp")
        tmp.write_text(json.dumps({"base": synced[0], "end": synced[1], "pos": synced[2]}))
        os.replace(tmp, self._checkpoint_path())
        self._checkpointed = synced
        self.bytes_since_checkpoint = 0

    # --- reading ------------------------------------------------------------------------

    def read(self, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        start = max(offset, self.min_offset)
        stop = min(start + max_count, self.visible_end)
        out: list[tuple[int, bytes]] = []
        i = bisect.bisect_right(self._bases, start) - 1
        while start < stop:
            seg = self.segments[i]
            seg_stop = min(stop, seg.end)
            if seg_stop > start:
                a, b = seg.byte_range(start, seg_stop)
                n = 0
                for _, payload in iter_payloads(seg.pread(a, b)):
                    out.append((start + n, payload))
                    n += 1
                if n != seg_stop - start:
                    raise CorruptRecord(f"corrupt record at offset {start + n} in {seg.log_path.name}")
            start = seg_stop
            i += 1
        return out

    # --- retention ----------------------------------------------------------------------

    def _segment_max_timestamp(self, seg: Segment) -> int:
        if seg.max_timestamp_ms is None:
            last = self.read_one_at(seg, seg.end - 1)
            seg.max_timestamp_ms = self.timestamp_of(last) if last is not None else 0
        return seg.max_timestamp_ms

    def read_one_at(self, seg: Segment, offset: int) -> bytes | None:
        if offset < seg.base or offset >= seg.end:
            return None
        a, b = seg.byte_range(offset, offset + 1)
        for _, payload in iter_payloads(seg.pread(a, b)):
            return payload
        return None

    def drop_old_segments(self, now_ms: int, retention_ms: int, retention_bytes: int | None) -> int:
        """Delete whole sealed segments past the age or size limit; the min offset moves."""
        dropped = 0
        total = self.size_bytes
        while len(self.segments) > 1:
            first = self.segments[0]
            too_old = self._segment_max_timestamp(first) < now_ms - retention_ms
            too_big = retention_bytes is not None and total > retention_bytes
            if not (too_old or too_big):
                break
            self.segments.pop(0)
            self._bases.pop(0)
            total -= first.size
            first.delete_files()
            dropped += 1
        return dropped

    def close(self) -> None:
        self.checkpoint()
        for seg in self.segments:
            seg.close()
        if self._file is not None:
            self._file.close()
            self._file = None
