"""The round journal: with fsync=always, one fsync a group-commit round for every queue it wrote.

A round used to fsync each queue file it wrote, and a topic's messages spread over its queues:
eight fsyncs a round for a topic of eight queues, each its own trip to the disk's cache (the
single produce's largest cost, benchmarks/RESULTS.md). Now a round writes each queue's
waiting records to its file as before, and the same bytes, one entry a queue, to the journal,
and fsyncs only the journal: the round's writers are answered when it is durable. The queue
files are fsynced together later, a *settle* (every `settle_interval_s`, after `settle_bytes`
of entries, before a topic is deleted and on close), after which the journal files before it
are deleted. RocketMQ's commit log does the same for the same reason.

An entry is a framed record (`durable/framing.py`): `<u64 segment base><u64 byte position>
<u64 first offset><u16 queue><u16 topic name length><topic name><the records' bytes>`, the
bytes the queue's file got at that position. At start-up (`replay`), each entry's bytes are
compared with its queue file's: the same (the usual case, a kill -9 keeps the page cache):
nothing to do; missing or different (the machine lost its page cache): written again from
the entry, and the segment indexed again from its records. Then the files are fsynced and
the journal deleted. A torn last entry is cut (its round answered nobody); damage before
it is reported with counts, and the entries after it are still replayed.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

from mqgate.durable.append_file import AppendFile, fsync_dir, write_new
from mqgate.durable.framing import frame, scan
from mqgate.health import Health

if TYPE_CHECKING:
    from mqgate.store.backends.embedded.queue_log import Mark, QueueLog

log = logging.getLogger(__name__)

JOURNAL_DIR: Final = "journal"
SUFFIX: Final = ".jnl"
COMPONENT: Final = "round_journal"
_ENTRY: Final = struct.Struct("<QQQHH")


class Chunk(NamedTuple):
    """What one queue wrote in a round: its records' bytes where its active segment got them."""

    base: int  # the segment's base offset
    pos: int  # the byte position of the first record
    first: int  # the first record's offset
    records: int  # how many (not in an entry: its records say)
    data: bytes


class RoundMark(NamedTuple):
    """Where a round's writes began: each queue's, and the journal's."""

    logs: list[tuple[QueueLog, Mark]]
    journal: AppendFile  # the file the round's entries go to, and its size before them
    journal_size: int


class Entry(NamedTuple):
    topic: str
    queue: int
    chunk: Chunk


def encode_entry(topic: bytes, queue: int, chunk: Chunk) -> bytes:
    return frame(_ENTRY.pack(chunk.base, chunk.pos, chunk.first, queue, len(topic)) + topic + chunk.data)


def decode_entry(payload: bytes) -> Entry | None:
    if len(payload) < _ENTRY.size:
        return None
    base, pos, first, queue, name_len = _ENTRY.unpack_from(payload)
    start = _ENTRY.size + name_len
    if len(payload) <= start:
        return None
    try:
        topic = payload[_ENTRY.size : start].decode()
    except UnicodeDecodeError:
        return None
    return Entry(topic, queue, Chunk(base, pos, first, 0, payload[start:]))


def _seq(path: Path) -> int:
    return int(path.name[: -len(SUFFIX)])


def journal_files(directory: Path) -> list[Path]:
    """The journal's files, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.name.endswith(SUFFIX) and p.name[: -len(SUFFIX)].isdigit()]
    return sorted(found, key=_seq)


class Read(NamedTuple):
    entries: list[Entry]
    damaged: int  # entries that failed their check
    torn_bytes: int  # after the last intact entry


def inspect(path: Path) -> Read:
    """The intact entries of one journal file, and what is wrong with it."""
    data = path.read_bytes()
    entries: list[Entry] = []
    damaged = 0
    end = 0
    for _, stop, payload in scan(data):
        entry = decode_entry(payload) if payload is not None else None
        if entry is None:
            damaged += 1
        else:
            entries.append(entry)
        end = stop
    return Read(entries, damaged, len(data) - end)


def read_entries(path: Path, health: Health | None = None) -> list[Entry]:
    """The intact entries of one journal file; damage is reported (a torn tail too: it held a
    round that answered nobody, but its bytes are said)."""
    found = inspect(path)
    if health is not None:
        if found.damaged:
            detail = f"{path}: {found.damaged} damaged entries"
            health.fault(COMPONENT, "corrupt_entry_skipped", detail, found.damaged)
        if found.torn_bytes:
            health.fault(COMPONENT, "torn_tail_cut", f"{path}: {found.torn_bytes} bytes after the last entry")
    return found.entries


class RoundJournal:
    """The group committer's one item for every queue log of a store (fsync=always).

    A settle is a cycle: the journal goes on in a new file, and the queue files journaled before
    are fsynced, at most `SETTLE_FILES` a round (each opened for its fsync alone and closed after
    the round: a queue file's own descriptor may be closed and its number reused while others
    are collected, and the open files stay bounded); once the last of them is fsynced, the files
    before the new one are deleted."""

    SETTLE_FILES: Final = 64

    def __init__(
        self,
        directory: Path,
        *,
        health: Health,
        mark_dirty: Callable[[RoundJournal], None],
        settle_interval_s: float = 1.0,
        settle_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.directory = directory
        self.health = health
        self._mark_dirty = mark_dirty
        self.settle_interval_s = settle_interval_s
        self.settle_bytes = settle_bytes
        self._names: dict[int, tuple[bytes, int]] = {}  # id(log) -> (topic, queue)
        self._dirty: dict[int, QueueLog] = {}  # with records for the next round
        self._unsettled: dict[int, QueueLog] = {}  # journaled in the current file, not fsynced
        self._cycle: dict[int, QueueLog] = {}  # a settle's queue files still to fsync
        self._cycle_files: list[AppendFile] = []  # deleted once the cycle's files are fsynced
        self._members: set[int] = set()  # the logs with entries in them, until they are deleted
        self._shown: list[tuple[QueueLog, int]] = []  # to show once the round is durable
        self._settling: list[QueueLog] = []  # the queue files the round in progress fsyncs
        self._fds: list[int] = []  # opened for the round in progress: closed after it
        self._retiring: list[AppendFile] = []  # journal files the round in progress retires
        self._stuck: list[Path] = []  # retired, but their deletion failed
        self._dir_unsynced = False  # the current file's name is not durable yet
        self._file: AppendFile | None = None
        self._seq = 0
        self._last_settle = time.monotonic()
        # After a queue file's fsync failed, Linux may have dropped the pages it could not write
        # and report the next fsync as a success: the journal is then the only good copy of
        # them, kept until a start replays it.
        self.keep_all = False
        self.settle_wanted = False
        self.settles = 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, after: int) -> None:
        """A new, empty journal file after the files numbered up to `after`, its name durable."""
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True)
            fsync_dir(self.directory.parent)
        self._seq = after + 1
        self._file = AppendFile.create(self.directory / f"{self._seq:020d}{SUFFIX}")
        fsync_dir(self.directory)

    def close(self) -> None:
        self._close_fds()
        for file in [*self._cycle_files, *self._retiring]:
            file.close()
        if self._file is not None:
            self._file.close()
            self._file = None

    def register(self, log_: QueueLog, topic: str, queue: int) -> None:
        self._names[id(log_)] = (topic.encode(), queue)

    def forget(self, log_: QueueLog) -> None:
        """A log closed for good (its topic deleted): after a settle, nothing of it is here."""
        key = id(log_)
        self._names.pop(key, None)
        self._dirty.pop(key, None)
        self._unsettled.pop(key, None)
        self._cycle.pop(key, None)

    def mark_dirty(self, log_: QueueLog) -> None:
        self._dirty[id(log_)] = log_
        self._mark_dirty(self)

    @property
    def settle_due(self) -> bool:
        if self._cycle or self._cycle_files:
            return True  # a cycle goes on in every round until it is done
        if not self._unsettled:
            return False
        return (
            self.settle_wanted
            or time.monotonic() - self._last_settle >= self.settle_interval_s
            or (self._file is not None and self._file.size >= self.settle_bytes)
        )

    @property
    def pending(self) -> bool:
        """Queue files journaled and not fsynced since, or journal files not deleted yet."""
        return bool(self._unsettled or self._cycle or self._cycle_files or self._dirty)

    def want_settle(self) -> None:
        """The next rounds settle (the caller then runs them: `GroupCommitter.flush`)."""
        self.settle_wanted = True
        self._mark_dirty(self)

    def holds(self, logs: list[QueueLog]) -> bool:
        """Whether a journal file may hold bytes of `logs` that their files do not durably hold
        (the next settle fsyncs them), or a journal file is left that could not be deleted."""
        self._stuck = [p for p in self._stuck if not _unlinked(p)]
        if self._stuck or self.keep_all:
            return True
        keys = {id(lg) for lg in logs}
        settling = {id(lg) for lg in self._settling}
        held = self._unsettled.keys() | self._dirty.keys() | self._cycle.keys() | self._members
        return bool(keys & (held | settling))

    # --- the committer's item (durable/group_commit.py: Syncable) ---------------------------

    def unwritten_mark(self) -> RoundMark | None:
        marks = [(lg, m) for lg in self._dirty.values() if (m := lg.unwritten_mark()) is not None]
        if not marks or self._file is None:
            return None
        return RoundMark(marks, self._file, self._file.size)

    def drop_unsynced(self, mark: RoundMark) -> None:
        """A round whose write failed: its records are taken back from every queue, and its
        entries from the journal."""
        for lg, log_mark in mark.logs:
            lg.drop_unsynced(log_mark)
        taken = {id(lg) for lg, _ in mark.logs}
        self._shown = [(lg, end) for lg, end in self._shown if id(lg) not in taken]
        if mark.journal.size > mark.journal_size and mark.journal.fd >= 0:
            mark.journal.cut_back(mark.journal_size)

    def sync_fds(self) -> list[int]:
        if self._file is None:  # closed
            if any(lg.unwritten_mark() is not None for lg in self._dirty.values()):
                raise OSError(errno.EBADF, "the message store is closed")  # its writers refused
            self._dirty = {}
            return []
        dirty, self._dirty = self._dirty, {}
        entries: list[bytes] = []
        for key, lg in dirty.items():
            name = self._names.get(key)
            chunk = lg.take_pending()
            if chunk is not None and name is not None:
                entries.append(encode_entry(name[0], name[1], chunk))
                self._shown.append((lg, chunk.first + chunk.records))
                self._unsettled[key] = lg
            if lg.unjournaled or chunk is None or name is None:
                # Bytes written outside a round (a re-index wrote waiting records): the file
                # is fsynced in this one.
                self._fds.append(lg.settle_fd())
                self._settling.append(lg)
        written = self._file
        if entries:
            written.append(entries[0] if len(entries) == 1 else b"".join(entries))
        if self.settle_due:
            self._settle()  # may go on in a new file: this round fsyncs the one written too
        if self._dir_unsynced:
            self._fds.append(os.open(self.directory, os.O_RDONLY))
        if written is not self._file:
            return [written.fd, self._file.fd, *self._fds]
        return [self._file.fd, *self._fds]

    def _settle(self) -> None:
        """Begin a cycle if none is under way (its entries go on in a new file, whose name
        rounds make durable before any round acknowledges from it alone: rounds do not overlap,
        group_commit.py), then take the next queue files of the cycle. A queue file that cannot
        be opened now is tried again in the next round."""
        assert self._file is not None
        if not self._cycle and not self._cycle_files:
            seq = self._seq + 1
            try:
                new = AppendFile.create(self.directory / f"{seq:020d}{SUFFIX}")
            except OSError as exc:
                self.health.fault(COMPONENT, "settle_failed", f"{self.directory}: {exc.strerror}")
                return
            self._cycle, self._unsettled = self._unsettled, {}
            self._members = set(self._cycle)
            self._cycle_files = [self._file]
            self._file, self._seq = new, seq
            self._dir_unsynced = True
            self._last_settle = time.monotonic()
            self.settle_wanted = False
        batch: list[QueueLog] = []
        try:
            for key in list(self._cycle)[: self.SETTLE_FILES]:
                lg = self._cycle[key]
                self._fds.append(lg.settle_fd())
                batch.append(lg)
                del self._cycle[key]
        except OSError as exc:
            self.health.fault(COMPONENT, "settle_failed", f"{self.directory}: {exc.strerror}")
        self._settling.extend(batch)
        if not self._cycle:
            self._retiring, self._cycle_files = self._cycle_files, []

    def fsync_failed(self) -> None:
        """A queue file's fsync failed (in a settle, or a segment's roll): Linux may have dropped
        the pages it could not write and report the next fsync as a success, so no journal file
        is deleted any more, and the next start writes every entry again, whatever the queue
        files seem to hold (a marker file says so)."""
        if self.keep_all:
            return
        self.keep_all = True
        try:
            _mark_failed(self.directory)
        except OSError as exc:
            self.health.fault(COMPONENT, "marker_failed", f"{self.directory}: {exc.strerror}")
        self.health.degrade(
            "round journal",
            f"a queue file's fsync failed: every file of {self.directory} is kept until the next "
            "start writes it all again (restart the gateway)",
        )

    def _close_fds(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def after_sync(self) -> None:
        self._close_fds()
        self._dir_unsynced = False
        shown, self._shown = self._shown, []
        for lg, end in shown:
            lg.journaled(end)
        settling, self._settling = self._settling, []
        for lg in settling:
            lg.after_sync()
        retiring, self._retiring = self._retiring, []
        for file in retiring:
            path = file.path
            file.close()
            if not self.keep_all and not _unlinked(path):
                self._stuck.append(path)  # tried again when a topic is deleted
                self.health.fault(COMPONENT, "delete_failed", f"{path}: kept, deleted later")
        if retiring:
            self.settles += 1
            self._members = set()

    def sync_failed(self, fsync_failed: bool) -> None:
        """The round failed: its files stay dirty, its writers are refused; the cycle's files
        go back to it. After a failed fsync, no journal file is deleted any more: the next start
        writes from them what the queue files lost."""
        self._close_fds()
        if fsync_failed and self._settling:
            self.fsync_failed()
        if self._retiring:
            self._cycle_files, self._retiring = self._retiring, []
        for lg in self._settling:
            self._cycle[id(lg)] = lg
        self._settling = []


MARKER: Final = "FSYNC_FAILED"


def _mark_failed(directory: Path) -> None:
    marker = directory / MARKER
    if not marker.exists():
        write_new(marker, [b"a queue file's fsync failed: the next start rewrites every entry\n"]).close()
        fsync_dir(directory)


def _unlinked(path: Path) -> bool:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        return False
    return True


class Restorable(Protocol):
    def restore(self, chunk: Chunk, *, force: bool = False) -> bool | None:
        """Bring the file in line with a journal entry: True if it had to be written, False if
        it held those bytes already, None if the entry does not fit it."""

    def restored(self) -> None:
        """After the last entry: index again what was written, fsync, checkpoint."""


UNAPPLIED_DIR: Final = "unapplied"


def replay(directory: Path, log_of: Callable[[str, int], Restorable | None], health: Health) -> int:
    """Apply every journal file, oldest first, to the queue logs `log_of` finds; fsync what
    changed; delete the files. The entries that could not be applied (their topic not served:
    a damaged topic.json; beyond their queue file's end) are never lost: they are written to a
    file of their own in `unapplied/`, reported and shown degraded, for an operator (mqgate
    check). Returns the number of the last file (0: none)."""
    files = journal_files(directory)
    aside = directory / UNAPPLIED_DIR
    force = (directory / MARKER).exists()  # every entry written again: see fsync_failed
    if not files:
        (directory / MARKER).unlink(missing_ok=True)
        _still_unapplied(aside, health)
        return 0
    touched: dict[int, Restorable] = {}
    unapplied: list[bytes] = []
    orphans = misfits = rewritten = 0
    for path in files:
        for entry in read_entries(path, health):
            target = log_of(entry.topic, entry.queue)
            done = target.restore(entry.chunk, force=force) if target is not None else None
            if done is None:
                unapplied.append(encode_entry(entry.topic.encode(), entry.queue, entry.chunk))
                orphans += target is None
                misfits += target is not None
            elif done and target is not None:
                rewritten += 1
                touched[id(target)] = target
    for target in touched.values():
        target.restored()
    if orphans:
        detail = f"{directory}: {orphans} entries of a topic or queue not served"
        health.fault(COMPONENT, "entry_without_queue", detail, orphans)
    if misfits:
        detail = f"{directory}: {misfits} entries beyond what their queue file holds"
        health.fault(COMPONENT, "entry_does_not_fit", detail, misfits)
    if rewritten:
        log.warning("round journal %s: %d entries written again to their queue files", directory, rewritten)
    if unapplied:
        # Only those: the others are in their queue files, and would overwrite what comes after.
        aside.mkdir(exist_ok=True)
        write_new(aside / f"{time.time_ns():020d}{SUFFIX}", unapplied).close()
        fsync_dir(aside)
    last = _seq(files[-1])
    for path in files:
        path.unlink(missing_ok=True)
    (directory / MARKER).unlink(missing_ok=True)
    fsync_dir(directory)
    _still_unapplied(aside, health)
    return last


def _still_unapplied(aside: Path, health: Health) -> None:
    """Shown degraded at every start while files wait in `unapplied/` for an operator."""
    kept = journal_files(aside)
    if kept:
        health.degrade(
            "round journal",
            f"{len(kept)} journal files hold entries no queue took, kept in {aside} (mqgate check)",
        )
