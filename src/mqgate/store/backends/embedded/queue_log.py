"""One queue: an append-only log in size-rolled segments, with crash recovery.

Durability bookkeeping, from newest to oldest:
- `written_end`: next offset after the last write() (maybe only in the page cache);
- `synced`: what the last fsync covered (segment base, end offset, byte position);
- `visible_end`: what readers may see: `synced.end` with fsync=always, `written_end` otherwise;
- the checkpoint file: a synced prefix whose index is on disk, so start-up only verifies
  the records after it.

Damage is loud but costs only itself, and never moves an offset: each record carries its
offset (`records.py`), so start-up indexes the records after damaged bytes at their own
offsets and keeps the offsets the damage held as a gap (reads skip it); it cuts only a torn
tail, never what a checkpoint or a sealed segment vouches for. A read checks each record
against the offset it asked for; an index entry that leads elsewhere has the segment indexed
again from its records. All of it is reported to `Health`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple

from mqgate.durable.append_file import AppendFile, fsync_dir
from mqgate.durable.framing import HEADER_BYTES
from mqgate.durable.group_commit import GroupCommitter
from mqgate.durable.handles import FileHandles
from mqgate.health import Health
from mqgate.store.backends.embedded.file_span import FileSpan
from mqgate.store.backends.embedded.journal import Chunk, RoundJournal
from mqgate.store.backends.embedded.records import OVERHEAD, framed, read_span
from mqgate.store.backends.embedded.segment import (
    LOG_SUFFIX,
    Gap,
    Indexed,
    Segment,
    describe_gaps,
    index_records,
)

CHECKPOINT_FILE: Final = "checkpoint.json"
COMPONENT: Final = "message_log"


def read_checkpoint(path: Path) -> tuple[int, int, int] | None:
    """A queue's checkpoint: (segment base, end offset, end byte) verified, or None."""
    try:
        data = json.loads(path.read_text())
        return int(data["base"]), int(data["end"]), int(data["pos"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def vouched_by(checkpoint: tuple[int, int, int] | None, base: int, size: int) -> tuple[int, int] | None:
    """What a checkpoint vouches for in the segment at `base` of `size` bytes: (end offset,
    end byte) synced and verified, or None if it is about another segment. Whatever is wrong
    before them is damage, not a torn write: cutting it would hand its offsets out again."""
    if checkpoint is None or checkpoint[0] != base:
        return None
    return checkpoint[1], min(checkpoint[2], size)


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
        on_synced: Callable[[QueueLog], None] | None = None,
    ) -> None:
        self.health = health or Health()
        self.on_synced = on_synced  # told when a sync takes it past its checkpoint
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
        # With fsync=always, records wait here for their group-commit round, which writes each
        # queue's in one write() (one per request cost a fifth of the event loop's time);
        # `_unwritten`: the index before the first of them, where a failed round takes it back.
        self._pending: list[tuple[bytes, int]] = []  # (framed records, how many)
        self._unwritten: Mark | None = None
        # With fsync=always, the store's round journal (journal.py): a round fsyncs it instead
        # of this file, which its settles fsync.
        self.journal: RoundJournal | None = None
        self.unjournaled = False  # records written outside a round since the last fsync
        self._rewritten_sealed: set[Segment] = set()  # by the round journal's replay
        self._restored_active = False

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
        checkpoint = read_checkpoint(self._checkpoint_path())
        self.segments = [self._segment(b) for b in bases]
        for seg, after in itertools.pairwise(self.segments):
            size = seg.log_path.stat().st_size
            seg.size = size
            seg.load_index()
            if seg.end != after.base or not seg.index_matches_log(size):
                # Sealed: it holds the offsets up to the next one's base, in all its bytes.
                seg.clear_index()
                self._report_recovery(seg, size, seg.scan_tail(0, known=(after.base, size)))
                self._try(seg.write_index_tail, "index_write_failed", seg.index_path.name)
        last = self.active
        file_size = last.log_path.stat().st_size
        known = vouched_by(checkpoint, last.base, file_size)
        start = 0
        if checkpoint is not None and known is not None:
            last.load_index(limit=checkpoint[1] - last.base)
            if checkpoint[2] <= file_size and len(last.positions) == checkpoint[1] - last.base:
                start = checkpoint[2]
        if start == 0:
            last.clear_index()
        indexed = last.scan_tail(start, known=known if start == 0 else None)
        self._report_recovery(last, file_size, indexed)
        good_end = indexed.end
        cut = file_size - good_end
        self._file = AppendFile.reopen(last.log_path, good_end, self.handles)
        last.size = good_end
        self._bases = [s.base for s in self.segments]
        self._synced = (last.base, last.end, good_end)
        self.visible_end = last.end
        self.try_checkpoint()
        return cut

    def _report_recovery(self, seg: Segment, file_size: int, indexed: Indexed) -> None:
        self._note_gaps(seg, indexed.gaps)
        cut = file_size - indexed.end
        if cut > 0:
            detail = f"{self.directory}/{seg.log_path.name}: cut {cut} bytes after byte {indexed.end}"
            self.health.fault(COMPONENT, "torn_tail_cut", detail)

    def _note_gaps(self, seg: Segment, gaps: list[Gap]) -> None:
        """Count the damage a scan found (each lost offset once, stray bytes once a scan);
        reads then skip those offsets without counting them again."""
        new = [o for g in gaps for o in range(g.first, g.first + g.held) if o not in self._reported]
        count = len(new) + sum(1 for g in gaps if g.held == 0)
        if count:
            detail = f"{self.directory}/{seg.log_path.name}: {describe_gaps(gaps)}"
            self.health.fault(COMPONENT, "corrupt_record_skipped", detail, count)
            self._reported.update(new)

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
        size = sum(map(len, payloads)) + OVERHEAD * len(payloads)
        if self.active.size and self.active.size + size > self.segment_bytes:
            self._roll()
        seg = self.active
        assert self._file is not None
        first = seg.end
        if self.committer.waits_for_fsync:
            if not self._pending:
                self._unwritten = self.mark()
            self._pending.append((framed(first, payloads), len(payloads)))
        else:
            # A failed write leaves the file, and so the index, as they were.
            self._file.append(framed(first, payloads))
        pos = seg.size
        positions = seg.positions
        for p in payloads:
            positions.append(pos)
            pos += OVERHEAD + len(p)
        seg.size = pos
        seg.max_timestamp_ms = timestamp_ms
        self.bytes_since_checkpoint += size
        if self.journal is not None:
            self.journal.mark_dirty(self)
        else:
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
        written = self._file.size
        if written > size:
            self._file.cut_back(size)
        # Records not written yet: those after the mark go (pending is in record order).
        if self._pending:
            unwritten = self._unwritten
            assert unwritten is not None
            if unwritten.segments != len(self.segments) or records <= unwritten.records:
                self._pending, self._unwritten = [], None
            else:
                keep = records - unwritten.records  # records of waiting batches before the mark
                kept: list[tuple[bytes, int]] = []
                for chunk in self._pending:
                    if keep <= 0:
                        break
                    kept.append(chunk)
                    keep -= chunk[1]
                self._pending = kept
        del seg.positions[records:]
        # A checkpoint since the mark may have put their positions in the .idx file: its next
        # tail is written from here, over them.
        seg.indexed_on_disk = min(seg.indexed_on_disk, records)
        seg.size = size
        self.visible_end = min(self.visible_end, seg.end)
        self.bytes_since_checkpoint = mark.bytes_since_checkpoint

    def unwritten_mark(self) -> Mark | None:
        """Where the records waiting for their round begin (None: none wait)."""
        return self._unwritten if self._pending else None

    def write_pending(self) -> None:
        """Write the records waiting for their round, in one write(). On an OSError the file is
        cut back to where it was and they keep waiting (the round decides their fate)."""
        if self.take_pending() is not None and self.journal is not None:
            self.unjournaled = True  # not in the journal: the next round fsyncs the file

    def settle_fd(self) -> int:
        """For the round journal: a descriptor of the active segment for this round's fsync
        (the caller closes it), what it covers noted for `after_sync`."""
        self.write_pending()
        seg = self.active
        fd = os.open(seg.log_path, os.O_RDONLY)
        self._pending_sync = (seg.base, seg.end, seg.size)
        self.unjournaled = False
        return fd

    def take_pending(self) -> Chunk | None:
        """For the round journal: write the records waiting for their round, and say what was
        written where (None: none wait). On an OSError as `write_pending`."""
        if not self._pending:
            return None
        assert self._file is not None and self._unwritten is not None
        pending = self._pending
        data = pending[0][0] if len(pending) == 1 else b"".join([d for d, _ in pending])
        count = pending[0][1] if len(pending) == 1 else sum(n for _, n in pending)
        seg = self.active
        chunk = Chunk(seg.base, self._file.size, seg.base + self._unwritten.records, count, data)
        self._file.append(data)
        self._pending, self._unwritten = [], None
        return chunk

    def journaled(self, end: int) -> None:
        """The records before offset `end` are durable in the round journal."""
        if end > self.visible_end:
            self.visible_end = end
            self.on_visible()

    def restore(self, chunk: Chunk, *, force: bool = False) -> bool | None:
        """At start-up, a round journal's entry for this log: the bytes it holds, written again
        where the file lacks them or holds others (its page cache lost); False if the file holds
        them already; None if the entry does not fit (beyond the file's end, or a segment this
        log does not have). `force`: written again even where the file seems to hold them (a
        failed fsync may have left pages the disk never got in the page cache), in a sealed
        segment too."""
        seg = self.active
        if chunk.base != seg.base:
            # An older segment was fsynced whole when it was sealed, unless an fsync failed.
            if chunk.base > seg.base or not force:
                return None if chunk.base > seg.base else False
            if chunk.base < self.min_offset:
                return False  # its segment was dropped by retention
            i = bisect.bisect_right(self._bases, chunk.base) - 1
            sealed = self.segments[i] if i >= 0 else None
            if sealed is None or sealed.base != chunk.base or chunk.pos + len(chunk.data) > sealed.size:
                return None
            _pwrite_all(sealed.log_path, chunk.data, chunk.pos)
            self._rewritten_sealed.add(sealed)
            return True
        size = seg.size
        end = chunk.pos + len(chunk.data)
        if chunk.pos > size:
            return None
        held = min(end, size) - chunk.pos
        if not force and end <= size and seg.pread(chunk.pos, end) == chunk.data:
            return False
        assert self._file is not None
        if held > 0:
            _pwrite_all(seg.log_path, memoryview(chunk.data)[:held], chunk.pos)
        if end > size:
            self._file.append(chunk.data[held:])
            seg.size = end
        self._restored_active = True
        return True

    def restored(self) -> None:
        """After the round journal wrote records again: index the active segment from its
        records, fsync it, show and checkpoint it."""
        for sealed in self._rewritten_sealed:
            fd = os.open(sealed.log_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            # What recovery found damaged there may be whole again: indexed from its records.
            indexed = sealed.reindex()
            if not indexed.legacy:
                sealed.use_index(indexed.positions)
                self._reported.difference_update(range(sealed.base, sealed.end))
                self._note_gaps(sealed, indexed.gaps)
                self._try(sealed.write_index_tail, "index_write_failed", sealed.index_path.name)
        self._rewritten_sealed.clear()
        if not self._restored_active:
            return
        self._restored_active = False
        seg = self.active
        assert self._file is not None
        indexed = index_records(seg.pread(0, seg.size), pos0=0, first=seg.base)
        seg.use_index(indexed.positions)
        self._report_recovery(seg, seg.size, indexed)
        if indexed.end < seg.size:
            self._file.cut_back(indexed.end)
            seg.size = indexed.end
        seg.max_timestamp_ms = None
        self._file.sync()
        self._synced = (seg.base, seg.end, seg.size)
        self.visible_end = seg.end
        self.try_checkpoint()

    def drop_unsynced(self, mark: Mark) -> None:
        """A failed round: take back every record since `mark`, written in it or waiting."""
        self.take_back(mark)
        self._pending, self._unwritten = [], None

    def sync_fds(self) -> list[int]:
        self.write_pending()
        seg = self.active
        self._pending_sync = (seg.base, seg.end, seg.size)
        assert self._file is not None
        return [self._file.fd]

    def after_sync(self) -> None:
        if self._pending_sync[1] <= self._synced[1]:
            return
        self._synced = self._pending_sync
        if self.on_synced is not None:
            self.on_synced(self)
        if self.committer.waits_for_fsync and self._synced[1] > self.visible_end:
            self.visible_end = self._synced[1]
            self.on_visible()

    def _roll(self) -> None:
        # The old segment's waiting records go to its file first (if that fails, the append that
        # would roll fails and they keep waiting for their round).
        pending, unwritten = self._pending, self._unwritten
        self.write_pending()
        old = self.active
        sealed = self._file
        assert sealed is not None
        try:
            sealed.sync()  # once per segment: the sealed segment is durable as a whole
        except OSError:
            if self.journal is not None:
                self.journal.fsync_failed()
                if unwritten is not None:
                    # Not in the journal: they wait for their round again, which journals them.
                    sealed.cut_back(unwritten.size)
                    self._pending, self._unwritten = pending, unwritten
                    self.unjournaled = False
            raise
        old.write_index_tail()
        new = self._segment(old.end)
        # Open the new file before anything changes: if that fails, the old one stays active.
        file = AppendFile.create(new.log_path, self.handles)
        if self.journal is not None:
            # Its name durable before a round acknowledges records in it from the journal alone.
            try:
                fsync_dir(self.directory)
            except OSError:
                file.close()
                new.log_path.unlink(missing_ok=True)  # a stray empty segment would end the log
                raise
        self._file = file
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

    @property
    def checkpoint_due(self) -> bool:
        """Synced past its last checkpoint."""
        return self._synced != self._checkpointed

    def try_checkpoint(self) -> bool:
        """A checkpoint that may fail (a full disk): reported, and tried again later; start-up
        then verifies more of the log, nothing is lost."""
        return self._try(self.checkpoint, "checkpoint_failed", CHECKPOINT_FILE)

    # --- reading ------------------------------------------------------------------------

    def read(self, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        """Up to `max_count` messages from `offset`, each checked against its offset; a damaged
        record is skipped (reported), the good ones around it are returned."""
        start = max(offset, self.min_offset)
        stop = min(start + max_count, self.visible_end)
        out: list[tuple[int, bytes]] = []
        i = bisect.bisect_right(self._bases, start) - 1
        while start < stop:
            seg = self.segments[i]
            seg_stop = min(stop, seg.end)
            if seg_stop > start and not self._read_span(seg, start, seg_stop, out):
                self._read_each(seg, start, seg_stop, out)
            start = seg_stop
            i += 1
        return out

    def span(self, offset: int, max_count: int) -> FileSpan | None:
        """Where the records `read(offset, max_count)` gives are, for a reader in another
        process: when one segment holds them all, in a byte range its index vouches for
        (visible records are in the file: a round writes them before they are visible). None:
        read them here."""
        start = max(offset, self.min_offset)
        stop = min(start + max_count, self.visible_end)
        if start >= stop:
            return None
        seg = self.segments[bisect.bisect_right(self._bases, start) - 1]
        if stop > seg.end:
            return None
        a, b = seg.byte_range(start, stop)
        if not a < b <= seg.size:
            return None
        path, inode = seg.identity()
        head = seg.pread(a, a + HEADER_BYTES)  # its CRC tells this file's record from another's
        if len(head) != HEADER_BYTES:
            return None
        return FileSpan(path, inode, a, b, start, stop, head)

    def _read_span(self, seg: Segment, start: int, stop: int, out: list[tuple[int, bytes]]) -> bool:
        """The usual case, in one read: the records of `[start, stop)` are intact, one after the
        other, each carrying its offset."""
        a, b = seg.byte_range(start, stop)
        if not a < b <= seg.size:  # gaps only, or an entry that is wrong
            return False
        found = read_span(seg.pread(a, b), start, stop)
        if found is None:
            return False
        out.extend(found)
        return True

    def _read_each(self, seg: Segment, start: int, stop: int, out: list[tuple[int, bytes]]) -> None:
        """Check each record of `[start, stop)` on its own. One that is not found where the
        index says, and is not a gap already known, has the segment indexed again from its
        records' own offsets (a wrong index entry must not cost a record, nor serve another
        one); what is still missing then is damage, skipped and reported once."""
        n = len(out)
        rebuilt = False
        offset = start
        while offset < stop:
            message = seg.read_at(offset)
            if message is not None:
                out.append((offset, message))
            elif offset not in self._reported:
                if not rebuilt:  # then read again: the known gaps are skipped
                    rebuilt = True
                    self._reindex(seg)
                    del out[n:]
                    offset = start
                    continue
                self._reported.add(offset)
                self.health.fault(
                    COMPONENT,
                    "corrupt_record_skipped",
                    f"{self.directory}/{seg.log_path.name}: offset {offset} (byte "
                    f"{seg.positions[offset - seg.base]}) fails its check: skipped by reads",
                )
            offset += 1

    def _reindex(self, seg: Segment) -> None:
        """Index `seg` again from its records, if they say where they belong (format-2 records
        do not, and numbering them by their place around damage would move offsets), and note
        the gaps found: one scan of the segment, whichever of its damaged records a read meets
        first."""
        if seg is self.active and self._pending:
            # Its index holds records that wait for their round: they go to the file first, so
            # that the scan of the file finds them (if that fails, the index stays as it is).
            try:
                self.write_pending()
            except OSError:
                return
        indexed = seg.reindex()
        if indexed.legacy:
            return
        if list(seg.positions) != indexed.positions:
            seg.use_index(indexed.positions)
            self.health.fault(
                COMPONENT,
                "index_rebuilt",
                f"{self.directory}/{seg.index_path.name}: entries did not lead to their records; "
                "indexed again from the records' own offsets",
            )
            self._try(seg.write_index_tail, "index_write_failed", seg.index_path.name)
        self._note_gaps(seg, indexed.gaps)

    # --- retention ----------------------------------------------------------------------

    def _segment_max_timestamp(self, seg: Segment) -> int:
        if seg.max_timestamp_ms is None:
            # The last record that can be read: a damaged last one must not make the segment
            # look older than it is (retention would drop it early).
            offset = seg.end - 1
            last = None
            while offset >= seg.base and last is None:
                last = seg.read_at(offset)
                offset -= 1
            seg.max_timestamp_ms = self.timestamp_of(last) if last is not None else 0
        return seg.max_timestamp_ms

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


def _pwrite_all(path: Path, data: bytes | memoryview, pos: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], pos + done)
    finally:
        os.close(fd)
