"""The producer spool: produces no cluster could take, kept on local disk until one can (P8, E7).

Files in the spool directory (the slot this process holds: `spool_slot.py`), every one a
sequence of `durable.framing` records (CRC checked):

- `<first seq, 20 digits>.spool` segments: one `SpoolRecord` per produce, appended in call
  order; the newest segment is the active one, a new one starts past `segment_bytes`;
- `marks.log`: `Mark`s: "try" (a resend of these seqs starts; not waited for) and "sent" (the
  active cluster acknowledged them; fsynced before `mark_sent` returns).

`append_batch` returns once its records are fsynced (group commit: appends that arrive
together share one fsync); a batch is kept whole or refused whole (written in one piece, the
bound checked with the write, cut back or marked never-to-send when the write or its fsync
fails). The bound `max_bytes` counts the segment files on disk; an append past it raises
`SpoolFull` (503 + Retry-After). A segment whose records are all sent is deleted.

Order: records of one queue key `(project, topic, key)` are replayed oldest first, a queue at a
time (`replay.py`); while a queue has spooled records, new produces for it must be spooled too
(`has_pending`), or they would overtake the spooled ones.

At-least-once window: a record is resent, then marked sent. A crash (or a send that failed
without telling whether it was stored, e.g. a time-out) between the store's acknowledgement of
the resend and the fsync of its "sent" mark makes it be sent again: a duplicate, with the same
message id. Each such second send is counted in `possible_duplicates` (a "try" mark with no
"sent" mark, found at open or left by a failed send). Nothing acknowledged as spooled is lost
short of losing the disk.

Recovery at open: a torn tail of the active segment or of the marks file (a crash in the middle
of a write, or a lost page cache) is cut and counted; a damaged record inside a file is skipped
and counted. Such a record was never acknowledged if it is the tail; inside a file it is data
lost to disk corruption, reported in `corrupt_skipped`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from mqgate.durable import framing
from mqgate.durable.append_file import AppendFile, fsync_dir, install, write_new
from mqgate.durable.group_commit import GroupCommitter
from mqgate.durable.space import is_disk_full
from mqgate.errors import InsufficientStorage, StorageError, Unavailable
from mqgate.failover import spool_slot

SEGMENT_SUFFIX: Final = ".spool"
MARKS: Final = "marks.log"
MARK_TRY: Final = 0
MARK_SENT: Final = 1
QueueKey = tuple[str, str, str]  # (project, topic, queue or order key)
NewRecord = tuple[str, str, str, str, bytes]  # (project, topic, key, msg id, payload)


class SpoolFull(Unavailable):
    """The spool is at its byte bound: the produce was not taken (503 + Retry-After)."""

    code = "spool_full"
    retry_after_s = 5.0


class SpoolRecord(msgspec.Struct, array_like=True, frozen=True):
    seq: int
    project: str
    topic: str
    key: str
    msg_id: str
    spooled_ms: int
    payload: bytes  # what the produce path needs to send it again; opaque here


class Mark(msgspec.Struct, array_like=True, frozen=True):
    kind: int
    seqs: list[int]


RECORD_DECODER: Final = msgspec.msgpack.Decoder(SpoolRecord)
MARK_DECODER: Final = msgspec.msgpack.Decoder(Mark)
ENCODE: Final = msgspec.msgpack.Encoder().encode


class Entry(msgspec.Struct):
    seq: int
    key: QueueKey
    msg_id: str
    spooled_ms: int
    segment: int  # the first seq of its segment
    pos: int
    end: int


class Segment(msgspec.Struct):
    first_seq: int
    path: Path
    size: int
    pending: int = 0


class SpoolStats(msgspec.Struct, frozen=True):
    pending: int
    pending_bytes: int
    disk_bytes: int
    max_bytes: int
    spooled_total: int  # appended by this process
    resent_total: int  # marked sent by this process
    oldest_age_ms: int  # of the oldest pending record (0 when empty)
    possible_duplicates: int
    torn_tails_cut: int
    corrupt_skipped: int


class Scan(msgspec.Struct):
    """What reading one spool file found: its records (with their byte span), how far it is
    intact, and how many damaged records inside it were skipped."""

    records: list[tuple[int, int, bytes]]  # (start, end, payload) of each intact record
    intact: int
    corrupt: int

    def torn(self, size: int) -> bool:
        return self.intact < size


def scan(data: bytes) -> Scan:
    found = Scan([], 0, 0)
    for pos, end, payload in framing.scan(data):
        found.intact = end
        if payload is None:
            found.corrupt += 1
        else:
            found.records.append((pos, end, payload))
    return found


__all__ = ["MARKS", "NewRecord", "QueueKey", "Spool", "SpoolFull", "SpoolRecord", "SpoolStats"]


class Spool:
    """A durable, bounded, ordered spool in `directory` (one process owns it)."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        *,
        segment_bytes: int = 4 * 1024 * 1024,
        committer: GroupCommitter | None = None,
    ) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_bytes and segment_bytes must be positive")
        self.base = directory
        self.directory = directory  # the slot this process holds, once open (spool_slot.py)
        self._slot_fd = -1
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._own_committer = committer is None
        self.committer = committer or GroupCommitter(None)
        self._segments: OrderedDict[int, Segment] = OrderedDict()
        self._active: AppendFile | None = None
        self._marks: AppendFile | None = None
        self._readers: dict[int, int] = {}
        self._queues: dict[QueueKey, deque[Entry]] = {}
        self._entries: dict[int, Entry] = {}
        self._tried: set[int] = set()
        self._repeats: set[int] = set()  # seqs whose current resend is not their first try
        self._writing: dict[QueueKey, int] = {}  # batches written, not yet durable, per key
        self._next_seq = 1
        self._pending_bytes = 0
        self._started = False
        self._dirty: list[int] = []
        self.spooled_total = 0
        self.resent_total = 0
        self.possible_duplicates = 0
        self.torn_tails_cut = 0
        self.corrupt_skipped = 0

    # --- opening: recovery ---------------------------------------------------------------

    async def open(self) -> None:
        self.directory, self._slot_fd = spool_slot.claim(self.base)
        sent, tried = self._load_marks()
        paths = sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}"))
        sent_in: dict[int, int] = {}  # sent seq -> its segment, for segments that stay
        for i, path in enumerate(paths):
            self._load_segment(path, sent, sent_in, last=i == len(paths) - 1)
        self._tried = {s for s in tried if s in self._entries}
        if self._active is None:
            self._roll()
        for seg in [s for s in self._segments.values() if s.pending == 0]:
            self._drop_if_done(seg)
        # Segments go first, marks after: a crash in between leaves marks that still cover them.
        self._rewrite_marks(sorted(s for s, seg in sent_in.items() if seg in self._segments))
        if self._own_committer:
            self.committer.start()
        self._started = True

    def _load_marks(self) -> tuple[set[int], set[int]]:
        path = self.directory / MARKS
        sent: set[int] = set()
        tried: set[int] = set()
        if not path.exists():
            return sent, tried
        data = path.read_bytes()
        found = scan(data)
        self.corrupt_skipped += found.corrupt
        self.torn_tails_cut += found.torn(len(data))
        for _pos, _end, payload in found.records:
            mark = MARK_DECODER.decode(payload)
            (sent if mark.kind == MARK_SENT else tried).update(mark.seqs)
        return sent, tried - sent

    def _load_segment(self, path: Path, sent: set[int], sent_in: dict[int, int], last: bool) -> None:
        first_seq = int(path.name[: -len(SEGMENT_SUFFIX)])
        data = path.read_bytes()
        seg = Segment(first_seq, path, len(data))
        self._segments[first_seq] = seg
        found = scan(data)
        self.corrupt_skipped += found.corrupt
        for pos, end, payload in found.records:
            rec = RECORD_DECODER.decode(payload)
            self._next_seq = max(self._next_seq, rec.seq + 1)
            if rec.seq in sent:
                sent_in[rec.seq] = first_seq
            else:
                key = (rec.project, rec.topic, rec.key)
                self._index(Entry(rec.seq, key, rec.msg_id, rec.spooled_ms, first_seq, pos, end))
        self._next_seq = max(self._next_seq, first_seq)
        self.torn_tails_cut += found.torn(len(data))
        if last:
            self._active = AppendFile.reopen(path, found.intact)
            seg.size = found.intact

    def _index(self, entry: Entry) -> None:
        self._entries[entry.seq] = entry
        queue = self._queues.setdefault(entry.key, deque())
        if queue and queue[-1].seq > entry.seq:  # batches made durable out of seq order
            at = next(i for i, e in enumerate(queue) if e.seq > entry.seq)
            queue.insert(at, entry)
        else:
            queue.append(entry)
        self._segments[entry.segment].pending += 1
        self._pending_bytes += entry.end - entry.pos

    def _rewrite_marks(self, sent: list[int]) -> None:
        """A new marks file holding only what still matters: the sent records of segments that
        stay (else they would be resent) and the tries of pending records."""
        path = self.directory / MARKS
        tmp = self.directory / f".{MARKS}.new"
        pieces = [framing.frame(ENCODE(Mark(MARK_SENT, sent)))] if sent else []
        if self._tried:
            pieces.append(framing.frame(ENCODE(Mark(MARK_TRY, sorted(self._tried)))))
        old, self._marks = self._marks, None
        if old is not None:
            old.sync()
            self._close_later(old)
        new = write_new(tmp, pieces)
        install(tmp, path)
        self._marks = new

    async def close(self) -> None:
        self._started = False
        if self._own_committer:
            await self.committer.stop()
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        for f in (self._active, self._marks):
            if f is not None:
                f.sync()
                f.close()
        self._active = self._marks = None
        if self._slot_fd >= 0:
            os.close(self._slot_fd)  # the slot is free for the next process
            self._slot_fd = -1

    # --- group commit (Syncable) ---------------------------------------------------------

    def _close_later(self, file: AppendFile) -> None:
        """Close a file (already fsynced) once no fsync round can still hold its descriptor."""
        fd = file.fd
        self._dirty = [d for d in self._dirty if d != fd]
        if self.committer is not None and self._started:
            self.committer.close_after_next_sync(file.close)
        else:
            file.close()

    def sync_fds(self) -> list[int]:
        fds, self._dirty = self._dirty, []
        return fds

    def after_sync(self) -> None:
        return None

    async def _durable(self, file: AppendFile) -> None:
        self._dirty.append(file.fd)
        self.committer.mark_dirty(self)
        await self.committer.durable()

    # --- appending -----------------------------------------------------------------------

    def _disk_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    async def append(
        self, project: str, topic: str, key: str, msg_id: str, payload: bytes, *, tried: bool = False
    ) -> int:
        """Spool one produce; its seq once it is on disk (`append_batch` of one)."""
        return (await self.append_batch([(project, topic, key, msg_id, payload)], tried=tried))[0]

    async def append_batch(self, records: Sequence[NewRecord], *, tried: bool = False) -> list[int]:
        """Spool these produces (project, topic, key, msg id, payload), all or none; their seqs
        once they are on disk. SpoolFull when they do not all fit under the bound (checked
        with the write, nothing in between), StorageError or InsufficientStorage (disk full)
        when the write failed: then nothing of the batch is kept (a write that fails part-way
        is cut back; records whose fsync failed are marked never to be sent). `tried`: a send
        of them to a cluster failed without telling whether they were stored (a time-out, a
        connection lost mid-call), so their resend is a possible duplicate.

        The records are written in one piece, in one segment, and are replayed or counted as
        pending only once durable; `has_pending` sees them from the write on (order)."""
        if not records:
            return []
        assert self._active is not None, "open() the spool first"
        spooled_ms = int(time.time() * 1000)
        first = self._next_seq
        frames = [
            framing.frame(ENCODE(SpoolRecord(first + i, p, t, k, m, spooled_ms, d)))
            for i, (p, t, k, m, d) in enumerate(records)
        ]
        size = sum(map(len, frames))
        if self._disk_bytes() + size > self.max_bytes:
            raise SpoolFull(
                f"the producer spool is full ({self._disk_bytes()} of {self.max_bytes} bytes, "
                f"{len(self._entries)} messages waiting for a cluster; {size} more asked): retry later"
            )
        try:
            if self._active.size > 0 and self._active.size + size > self.segment_bytes:
                self._roll()  # a batch is not split across segments
            active = self._active
            seg = next(reversed(self._segments.values()))
            pos = active.size
            active.append(b"".join(frames))  # cut back if it fails part-way
        except OSError as exc:
            raise _write_error(exc, "spooling a produce") from exc
        seqs = list(range(first, first + len(records)))
        self._next_seq = first + len(records)
        seg.size = active.size
        seg.pending += len(seqs)  # the segment is kept while they wait for their fsync
        entries = []
        for seq, (p, t, k, m, _), frame in zip(seqs, records, frames, strict=True):
            entries.append(Entry(seq, (p, t, k), m, spooled_ms, seg.first_seq, pos, pos + len(frame)))
            pos += len(frame)
        keys = {e.key for e in entries}
        for qk in keys:
            self._writing[qk] = self._writing.get(qk, 0) + 1
        try:
            if tried:
                self.begin(seqs)  # the mark rides the same fsync
                self._dirty.append(self._marks.fd if self._marks is not None else active.fd)
            await self._durable(active)
        except BaseException:
            self._refused(seqs, seg)
            raise
        finally:
            for qk in keys:
                self._writing[qk] -= 1
                if not self._writing[qk]:
                    del self._writing[qk]
        seg.pending -= len(seqs)  # counted again by _index
        for entry in entries:
            self._index(entry)
        self.spooled_total += len(seqs)
        return seqs

    def _refused(self, seqs: list[int], seg: Segment) -> None:
        """Records written whose fsync failed: the produce is refused, so they must never be
        sent, now or after a restart (a "sent" mark, best effort)."""
        seg.pending -= len(seqs)
        self._tried.difference_update(seqs)
        if self._marks is not None:
            with contextlib.suppress(OSError):
                self._marks.append(framing.frame(ENCODE(Mark(MARK_SENT, seqs))))
                self._marks.sync()
        with contextlib.suppress(OSError):
            self._drop_if_done(seg)

    def _roll(self) -> None:
        """Start a new active segment; the old one is fsynced and closed (its records stay)."""
        old = self._active
        path = self.directory / f"{self._next_seq:020d}{SEGMENT_SUFFIX}"
        self._active = AppendFile.create(path)
        self._segments[self._next_seq] = Segment(self._next_seq, path, 0)
        fsync_dir(self.directory)
        if old is not None:
            old.sync()
            self._close_later(old)
            done = self._segments.get(int(old.path.name[: -len(SEGMENT_SUFFIX)]))
            if done is not None:
                self._drop_if_done(done)

    # --- reading and marking -------------------------------------------------------------

    def has_pending(self, project: str, topic: str, key: str) -> bool:
        """Spooled records of this queue wait (or are being written): a new produce for it
        goes to the spool too."""
        k = (project, topic, key)
        return bool(self._queues.get(k)) or k in self._writing

    def pending(self, project: str) -> int:
        """Records of `project` not yet resent."""
        return sum(len(q) for k, q in self._queues.items() if k[0] == project)

    def queues(self, project: str | None = None) -> list[QueueKey]:
        """Queue keys with pending records, the one with the oldest record first."""
        keys = [k for k, q in self._queues.items() if q and (project is None or k[0] == project)]
        return sorted(keys, key=lambda k: self._queues[k][0].seq)

    def head(self, key: QueueKey, limit: int) -> list[SpoolRecord]:
        """The oldest `limit` pending records of a queue, in order."""
        found = []
        for entry in itertools.islice(self._queues.get(key, ()), limit):
            fd = self._reader(entry.segment)
            raw = os.pread(fd, entry.end - entry.pos, entry.pos)
            payload = framing.payload_at(raw, 0, len(raw))
            if payload is None:
                raise StorageError(f"spool record {entry.seq} no longer passes its check")
            found.append(RECORD_DECODER.decode(payload))
        return found

    def _reader(self, segment: int) -> int:
        fd = self._readers.get(segment)
        if fd is None:
            fd = self._readers[segment] = os.open(self._segments[segment].path, os.O_RDONLY)
        return fd

    def begin(self, seqs: list[int]) -> list[int]:
        """A resend of these records starts: a record tried before may be stored already (a
        failed send that did not tell, or a crash): its resend is a possible duplicate. Those
        seqs (`is_repeat` until they are marked sent)."""
        again = [s for s in seqs if s in self._tried]
        self.possible_duplicates += len(again)
        self._repeats.update(again)
        self._tried.update(seqs)
        if self._marks is not None:
            with contextlib.suppress(OSError):  # only the duplicate count depends on it
                self._marks.append(framing.frame(ENCODE(Mark(MARK_TRY, seqs))))
        return again

    def untry(self, seqs: list[int], again: list[int]) -> None:
        """The resend `begin(seqs)` (which found `again` tried before) reached no cluster:
        take it back. Its "try" mark stays in the file: after a restart they count as
        possible duplicates (an overcount, never an undercount)."""
        self.possible_duplicates -= len(again)
        self._repeats.difference_update(again)
        self._tried.difference_update(set(seqs) - set(again))

    def is_repeat(self, seq: int) -> bool:
        """The resend of this record under way may store it a second time (see `begin`)."""
        return seq in self._repeats

    async def mark_sent(self, seqs: list[int]) -> None:
        """The active cluster acknowledged these records: durably never resend them."""
        if not seqs:
            return
        assert self._marks is not None
        try:
            self._marks.append(framing.frame(ENCODE(Mark(MARK_SENT, seqs))))
        except OSError as exc:
            raise _write_error(exc, "marking spooled records sent") from exc
        await self._durable(self._marks)
        touched: set[int] = set()
        for seq in seqs:
            entry = self._entries.pop(seq, None)
            if entry is None:
                continue
            self._tried.discard(seq)
            self._repeats.discard(seq)
            queue = self._queues[entry.key]
            with contextlib.suppress(ValueError):
                queue.remove(entry)  # the head, in replay order: O(1)
            if not queue:
                del self._queues[entry.key]
            self._segments[entry.segment].pending -= 1
            self._pending_bytes -= entry.end - entry.pos
            touched.add(entry.segment)
            self.resent_total += 1
        for first in touched:
            self._drop_if_done(self._segments[first])
        if not self._entries and self._marks.size > self.segment_bytes:
            self._rewrite_marks([])  # every segment left is empty: no sent mark matters

    def _drop_if_done(self, seg: Segment) -> None:
        """Delete a segment none of whose records is pending; the active one is rolled first."""
        if seg.pending > 0:
            return
        active = self._active
        if active is not None and active.path == seg.path:
            if seg.size > 0:
                self._roll()  # which comes back here for `seg`, no longer active
            return
        fd = self._readers.pop(seg.first_seq, None)
        if fd is not None:
            os.close(fd)
        self._segments.pop(seg.first_seq, None)
        with contextlib.suppress(FileNotFoundError):
            seg.path.unlink()
        fsync_dir(self.directory)

    # --- metrics -------------------------------------------------------------------------

    def stats(self) -> SpoolStats:
        oldest = min((q[0].spooled_ms for q in self._queues.values() if q), default=0)
        return SpoolStats(
            len(self._entries),
            self._pending_bytes,
            self._disk_bytes(),
            self.max_bytes,
            self.spooled_total,
            self.resent_total,
            int(time.time() * 1000) - oldest if oldest else 0,
            self.possible_duplicates,
            self.torn_tails_cut,
            self.corrupt_skipped,
        )


def _write_error(exc: OSError, what: str) -> StorageError | InsufficientStorage:
    if is_disk_full(exc):
        return InsufficientStorage(f"disk full: {what} failed ({exc.strerror}); nothing was kept")
    return StorageError(f"{what} failed: {exc.strerror}")
