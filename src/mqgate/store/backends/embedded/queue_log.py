"""One queue: an append-only log in size-rolled segments, with crash recovery.

Durability bookkeeping, from newest to oldest:
- `written_end`: next offset after the last write() (maybe only in the page cache);
- `synced`: what the last fsync covered (segment base, end offset, byte position);
- `visible_end`: what readers may see: `synced.end` with fsync=always, `written_end` otherwise;
- the checkpoint file: a synced prefix whose index is on disk, so start-up only verifies
  the records after it.

Damage is loud but costs only itself: start-up keeps the records after a damaged one (it
keeps its offset, and reads skip it), cuts only a torn tail, and reports both to `Health`.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple

from mqgate.durable.append_file import AppendFile
from mqgate.durable.framing import HEADER_BYTES, frame, iter_payloads, payload_at
from mqgate.durable.group_commit import GroupCommitter
from mqgate.durable.handles import FileHandles
from mqgate.health import Health
from mqgate.store.backends.embedded.segment import LOG_SUFFIX, Segment

CHECKPOINT_FILE: Final = "checkpoint.json"
COMPONENT: Final = "message_log"


class Mark(NamedTuple):
    """Where a queue's log ended before a write, to take that write back."""

    segments: int
    size: int
    records: int
    bytes_since_checkpoint: int


class QueueLog:
    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        committer: GroupCommitter,
        on_visible: Callable[[], None],
        timestamp_of: Callable[[bytes], int],
        health: Health | None = None,
        handles: FileHandles | None = None,
    ) -> None:
        self.health = health or Health()
        self.handles = handles
        self._reported: set[int] = set()  # damaged offsets already counted
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

    def _segment(self, base: int) -> Segment:
        return Segment(self.directory, base, self.handles)

    def recover(self) -> int:
        """Open the log, verify what the checkpoint does not cover, truncate a torn tail, keep
        what follows damage, and return how many bytes were cut off."""
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in self.directory.glob("*" + LOG_SUFFIX))
        if not bases:
            bases = [0]
            self._segment(0).log_path.touch()
        checkpoint = self._read_checkpoint()
        self.segments = [self._segment(b) for b in bases]
        for seg in self.segments[:-1]:
            size = seg.log_path.stat().st_size
            seg.size = size
            seg.load_index()
            if not seg.index_matches_log(size):
                seg.clear_index()
                seg.size, damaged = seg.scan_tail(0)
                self._report_recovery(seg, size, damaged)
                if seg.size < size:  # a sealed segment is never appended to: left, ignored
                    self.health.fault(
                        COMPONENT,
                        "torn_tail_ignored",
                        f"{self.directory}/{seg.log_path.name}: {size - seg.size} bytes after {seg.size}",
                    )
                self._try(seg.write_index_tail, "index_write_failed", seg.index_path.name)
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
        good_end, damaged = last.scan_tail(start)
        self._report_recovery(last, file_size, damaged, good_end)
        cut = file_size - good_end
        self._file = AppendFile.reopen(last.log_path, good_end, self.handles)
        last.size = good_end
        self._bases = [s.base for s in self.segments]
        self._synced = (last.base, last.end, good_end)
        self.visible_end = last.end
        self.try_checkpoint()
        return cut

    def _report_recovery(
        self, seg: Segment, file_size: int, damaged: list[tuple[int, int]], good_end: int | None = None
    ) -> None:
        where = f"{self.directory}/{seg.log_path.name}"
        if damaged:
            spans = ", ".join(f"{n} bytes at {pos}" for pos, n in damaged[:5])
            self.health.fault(
                COMPONENT,
                "corrupt_record_skipped",
                f"{where}: {len(damaged)} damaged records kept as gaps, the ones after them kept ({spans})",
                len(damaged),
            )
            self._reported.update(seg.base + seg.positions.index(pos) for pos, _ in damaged)
        if good_end is not None and file_size > good_end:
            self.health.fault(
                COMPONENT, "torn_tail_cut", f"{where}: cut {file_size - good_end} bytes after byte {good_end}"
            )

    def _try(self, job: Callable[[], None], kind: str, what: str) -> bool:
        """Bookkeeping that can wait (an index, a checkpoint): a failure is reported, not raised."""
        try:
            job()
        except OSError as exc:
            self.health.fault(COMPONENT, kind, f"{self.directory}/{what}: {exc.strerror}")
            return False
        return True

    # --- writing ------------------------------------------------------------------------

    def mark(self) -> Mark:
        seg = self.active
        return Mark(len(self.segments), seg.size, len(seg.positions), self.bytes_since_checkpoint)

    def append(self, payloads: list[bytes], timestamp_ms: int) -> int:
        """Write records and return the first one's offset. Durability is the caller's
        `committer.durable()`; visibility follows `after_sync` (or is immediate). A write that
        fails (an OSError) takes no offset and leaves no bytes behind."""
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

    def take_back(self, mark: Mark) -> None:
        """Undo the writes since `mark`, made in this same step of the event loop (no reader
        and no fsync round ran since): the other queues of a batch whose write failed."""
        seg = self.active
        assert self._file is not None
        if len(self.segments) > mark.segments:  # a roll since: the new segment holds only them
            size, records = 0, 0
        else:
            size, records = mark.size, mark.records
        self._file.cut_back(size)
        del seg.positions[records:]
        seg.size = size
        self.visible_end = min(self.visible_end, seg.end)
        self.bytes_since_checkpoint = mark.bytes_since_checkpoint

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
        new = self._segment(old.end)
        # Open the new file before anything changes: if that fails, the old one stays active.
        self._file = AppendFile.create(new.log_path, self.handles)
        self.committer.close_after_next_sync(sealed.close)
        self.segments.append(new)
        self._bases.append(new.base)
        self._synced = (new.base, new.base, 0)
        if self.visible_end < old.end:
            self.visible_end = old.end
            self.on_visible()
        self.try_checkpoint()

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

    def try_checkpoint(self) -> bool:
        """A checkpoint that may fail (a full disk): reported, and tried again later; start-up
        then verifies more of the log, nothing is lost."""
        return self._try(self.checkpoint, "checkpoint_failed", CHECKPOINT_FILE)

    # --- reading ------------------------------------------------------------------------

    def read(self, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        """Up to `max_count` records from `offset`; a damaged record is skipped (reported),
        the good ones around it are returned."""
        start = max(offset, self.min_offset)
        stop = min(start + max_count, self.visible_end)
        out: list[tuple[int, bytes]] = []
        i = bisect.bisect_right(self._bases, start) - 1
        while start < stop:
            seg = self.segments[i]
            seg_stop = min(stop, seg.end)
            if seg_stop > start:
                a, b = seg.byte_range(start, seg_stop)
                data = seg.pread(a, b)
                n = len(out)
                out.extend((start + k, p) for k, (_, p) in enumerate(iter_payloads(data)))
                if len(out) - n != seg_stop - start:
                    del out[n:]
                    out.extend(self._read_around_damage(seg, start, seg_stop, data, a))
            start = seg_stop
            i += 1
        return out

    def _read_around_damage(
        self, seg: Segment, start: int, stop: int, data: bytes, base_pos: int
    ) -> list[tuple[int, bytes]]:
        """Check each record of `[start, stop)` on its own: the index says where each one is."""
        out = []
        for offset in range(start, stop):
            a, b = seg.byte_range(offset, offset + 1)
            payload = payload_at(data, a - base_pos, b - base_pos)
            if payload is not None:
                out.append((offset, payload))
            elif offset not in self._reported:
                self._reported.add(offset)
                self.health.fault(
                    COMPONENT,
                    "corrupt_record_skipped",
                    f"{self.directory}/{seg.log_path.name}: offset {offset} (byte {a}) fails its "
                    "check: skipped by reads",
                )
        return out

    # --- retention ----------------------------------------------------------------------

    def _segment_max_timestamp(self, seg: Segment) -> int:
        if seg.max_timestamp_ms is None:
            # The last record that can be read: a damaged last one must not make the segment
            # look older than it is (retention would drop it early).
            offset = seg.end - 1
            last = None
            while offset >= seg.base and last is None:
                last = self.read_one_at(seg, offset)
                offset -= 1
            seg.max_timestamp_ms = self.timestamp_of(last) if last is not None else 0
        return seg.max_timestamp_ms

    def read_one_at(self, seg: Segment, offset: int) -> bytes | None:
        if offset < seg.base or offset >= seg.end:
            return None
        a, b = seg.byte_range(offset, offset + 1)
        return payload_at(seg.pread(a, b), 0, b - a)

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
        self.try_checkpoint()
        for seg in self.segments:
            seg.close()
        if self._file is not None:
            self._file.close()
            self._file = None
