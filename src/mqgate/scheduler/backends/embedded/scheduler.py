"""The scheduler in the gateway's memory, made durable by a flagged log (SPEC S4–S6).

Single process, single event loop: each method changes the log and the memory without
awaiting in between, so each is atomic; it then awaits the shared group commit. Every change
is appended to `<directory>/schedule.log` (format in `log.py`) before it shows in memory.
Claims and attempt counts live in memory only: after a restart every claimed destination is
due again (at-least-once delivery). A change whose fsync fails raises StorageError but stays
in memory and in the file: it may still be delivered (at-least-once again).

`open` is the crash recovery of SPEC S6: read the log up to any torn tail, rebuild the live
messages from the flags, write them as a new compacted log (temp file, fsync, atomic rename,
directory fsync), index them, and only then return. While running, the log is compacted
again once it holds more than twice as many records as the live set; the snapshot is written
in a worker thread while intake goes on, and what was appended meanwhile is copied after it.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from mqgate.core.scheduling import MAX_TIME_MS, is_expired
from mqgate.durable.append_file import AppendFile, fsync_dir, install, write_new
from mqgate.durable.framing import HEADER_BYTES, MAX_PAYLOAD_BYTES
from mqgate.durable.group_commit import GroupCommitter
from mqgate.durable.space import DiskSpace
from mqgate.errors import PayloadTooLarge, StorageError
from mqgate.health import Health
from mqgate.scheduler.backends.embedded import log
from mqgate.scheduler.backends.embedded.index import DueIndex
from mqgate.scheduler.backends.embedded.log import Add, Delete, Modify
from mqgate.scheduler.interface import Destination, Due, SchedulerStats, check_destinations
from mqgate.timeouts import wait_event

LOG_FILE: Final = "schedule.log"
TEMP_SUFFIX: Final = ".tmp"
COMPACT_MIN_RECORDS: Final = 10_000
PROMOTE_SLICE: Final = 50_000
COMPONENT: Final = "schedule_log"


class EmbeddedScheduler:
    def __init__(
        self,
        directory: Path,
        committer: GroupCommitter,
        health: Health | None = None,
        disk_free_floor_bytes: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self.committer = committer
        self.health = health or Health()
        # Holding a message is a new write (refused below the floor); settling one is not.
        self.space = DiskSpace(self.directory, disk_free_floor_bytes, self.health)
        self._held: dict[int, Add] = {}
        self._index = DueIndex(self._held)
        self._destinations = 0
        # Destinations held per target, counted from the first `held_for` on (a pass over what
        # is held then), so a start with millions held does not pay for it.
        self._by_target: Counter[str] | None = None
        self._next_seq = 1
        self._file: AppendFile | None = None
        self._records = 0
        self._compaction: asyncio.Task[None] | None = None
        self._retry_compaction_at = 0  # after a failed compaction, not before this many records
        self._tail: list[bytes] | None = None  # appended while a compaction runs
        self._tail_records = 0
        self._wake = asyncio.Event()
        self._promised: int | None = None  # what next_due_ms last answered

    @property
    def path(self) -> Path:
        return self.directory / LOG_FILE

    # --- recovery (SPEC S6) ---------------------------------------------------------------

    async def open(self) -> None:
        # In a worker thread so the event loop still answers (health checks) meanwhile; nothing
        # else touches this object until open returns.
        await asyncio.to_thread(self._recover)

    def _recover(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(TEMP_SUFFIX)
        tmp.unlink(missing_ok=True)  # a compaction that a crash interrupted
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        # Millions of small objects are created and none is garbage: collections would only
        # rescan them, over and over.
        collecting = gc.isenabled()
        gc.disable()
        try:
            replayed = log.replay(data)
            self._report(replayed, len(data))
            # Writing the compacted log waits on the disk, indexing on the CPU: side by side.
            with ThreadPoolExecutor(1, thread_name_prefix="schedule-recovery") as pool:
                if replayed.already_compact:  # the same bytes are on disk already
                    writing = pool.submit(AppendFile.reopen, self.path, len(data))
                else:
                    writing = pool.submit(self._install, tmp, replayed.compacted)
                index = DueIndex(replayed.held)
                destinations = index.load()
                try:
                    file = writing.result()
                except OSError as exc:
                    # No room for the compacted copy (a full disk): keep appending to the log
                    # as it is, after its intact records; the next start replays it the same way.
                    self.health.fault(COMPONENT, "compaction_failed", f"{self.path}: {exc.strerror}")
                    tmp.unlink(missing_ok=True)
                    if self.path.exists():
                        file = AppendFile.reopen(self.path, replayed.valid_bytes)
                    else:
                        file = AppendFile.create(self.path)
        finally:
            if collecting:
                gc.enable()
        self._held = replayed.held
        self._index = index
        self._destinations = destinations
        self._file = file
        self._records = 1 + len(self._held)
        self._next_seq = replayed.next_seq

    def _report(self, replayed: log.Replayed, size: int) -> None:
        if replayed.dropped:
            self.health.fault(
                COMPONENT,
                "record_dropped",
                f"{self.path}: {len(replayed.dropped)} records dropped, the others kept "
                f"({'; '.join(replayed.dropped[:5])})",
                len(replayed.dropped),
            )
        if replayed.valid_bytes < size:
            self.health.fault(
                COMPONENT,
                "torn_tail_cut",
                f"{self.path}: cut {size - replayed.valid_bytes} bytes after byte {replayed.valid_bytes}",
            )

    def _install(self, tmp: Path, pieces: list[bytes | memoryview]) -> AppendFile:
        file = write_new(tmp, pieces)
        try:
            install(tmp, self.path)
        except BaseException:
            file.close()
            raise
        return file

    async def close(self) -> None:
        if self._compaction is not None:
            await self._compaction
        if self._file is not None:
            # The flush below fsyncs what is pending, then closes the file.
            self.committer.close_after_next_sync(self._file.close)
            await self.committer.flush()
            self._file = None

    # --- the log --------------------------------------------------------------------------

    def sync_fds(self) -> list[int]:
        return [self._file.fd] if self._file is not None and self._file.fd >= 0 else []

    def after_sync(self) -> None:
        return None

    def _append(self, pieces: list[bytes]) -> None:
        """Append records; on failure cut the log back so no torn record sits before later ones."""
        if self._file is None:
            raise StorageError("the scheduler is not open")
        data = b"".join(pieces)
        try:
            self._file.append(data)
        except OSError as exc:
            raise self.space.write_error(exc, COMPONENT, "schedule log write") from exc
        self._records += len(pieces)
        if self._tail is not None:
            self._tail.append(data)
            self._tail_records += len(pieces)
        self.committer.mark_dirty(self)

    def _maybe_compact(self) -> None:
        """Start a compaction once the log has more than twice the records of the live set."""
        if self._compaction is None and self._records > max(
            COMPACT_MIN_RECORDS, 2 * (len(self._held) + 1), self._retry_compaction_at
        ):
            self._compaction = asyncio.get_running_loop().create_task(
                self._compact(), name="schedule-compaction"
            )

    async def _compact(self) -> None:
        tmp = self.path.with_suffix(TEMP_SUFFIX)
        snapshot = list(self._held.values())
        self._tail, self._tail_records = [], 0
        new: AppendFile | None = None
        try:
            new = await asyncio.to_thread(write_new, tmp, log.snapshot_pieces(self._next_seq, snapshot))
            # From here to the switch nothing awaits: no append can slip in between.
            new.append(b"".join(self._tail))
            new.sync()
            os.replace(tmp, self.path)
        except OSError as exc:
            self.health.fault(COMPONENT, "compaction_failed", f"{self.path}: {exc}; retrying later")
            if new is not None:
                new.close()
            tmp.unlink(missing_ok=True)
            self._retry_compaction_at = self._records + COMPACT_MIN_RECORDS
            return
        finally:
            self._tail = None
            self._compaction = None
        old, self._file = self._file, new
        self._records = 1 + len(snapshot) + self._tail_records
        # Writers still waiting for an fsync of the old file are covered: their records were
        # copied into the new one, which is already fsynced.
        if old is not None:
            self.committer.close_after_next_sync(old.close)
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            self.health.fault(COMPONENT, "compaction_failed", f"directory fsync failed: {exc}")

    # --- intake and delivery --------------------------------------------------------------

    async def hold(
        self, items: list[tuple[bytes, list[Destination]]], keys: list[str] | None = None
    ) -> list[int]:
        """`keys` are ignored (Scheduler.hold): a hold here that raised was not written, or went
        with the process."""
        if not items:
            return []
        for _, dests in items:
            check_destinations(dests)
        seq = self._next_seq
        recs = []
        pieces = []
        for payload, dests in items:
            rec = Add(seq, payload if type(payload) is bytes else bytes(payload), tuple(dests))
            piece = log.framed(rec)
            if len(piece) - HEADER_BYTES > MAX_PAYLOAD_BYTES:
                raise PayloadTooLarge(f"a held message may have at most {MAX_PAYLOAD_BYTES} bytes")
            recs.append(rec)
            pieces.append(piece)
            seq += 1
        self.space.check(sum(len(p) for p in pieces))
        self._next_seq = seq  # before the write: a seq that reached the file is never reused
        self._append(pieces)
        earliest = MAX_TIME_MS
        for rec in recs:
            self._held[rec.seq] = rec
            self._index.add(rec.seq, rec.dests)
            self._destinations += len(rec.dests)
            if self._by_target is not None:
                self._by_target.update(d.target for d in rec.dests if d is not None)
            for d in rec.dests:
                if d is not None and d.deliver_at_ms < earliest:
                    earliest = d.deliver_at_ms
        self._wake_if_sooner(earliest)
        self._maybe_compact()
        await self.committer.durable()
        return [rec.seq for rec in recs]

    async def claim_due(self, now_ms: int, limit: int, claim_ms: int) -> list[Due]:
        # A large backlog that came due at once (after a restart, say) is moved in slices, so
        # the event loop keeps serving in between; the claim below sees all of it.
        while self._index.promote(now_ms, PROMOTE_SLICE):
            await asyncio.sleep(0)
        return [
            Due(rec.seq, index, rec.payload, d, is_expired(d.deadline_ms, now_ms), attempt)
            for rec, index, d, attempt in self._index.take(limit, now_ms + claim_ms)
        ]

    async def forget(self, keys: list[str]) -> None:
        """Nothing kept: `hold` ignores keys."""

    async def settle(self, done: list[tuple[int, int]]) -> None:
        if not done:
            return
        by_seq: dict[int, set[int]] = defaultdict(set)
        for seq, index in done:
            by_seq[seq].add(index)
        changes: list[tuple[int, Add | None, list[int]]] = []
        pieces = []
        for seq, indexes in by_seq.items():
            rec = self._held.get(seq)
            if rec is None:
                continue
            dests = list(rec.dests)
            removed = [i for i in indexes if 0 <= i < len(dests) and dests[i] is not None]
            if not removed:
                continue
            for i in removed:
                gone = dests[i]
                if self._by_target is not None and gone is not None:
                    self._by_target[gone.target] -= 1
                dests[i] = None
            if any(d is not None for d in dests):
                kept = Add(seq, rec.payload, tuple(dests))
                pieces.append(log.framed(Modify(seq, kept.dests)))
                changes.append((seq, kept, removed))
            else:
                pieces.append(log.framed(Delete(seq)))
                changes.append((seq, None, removed))
        if pieces:
            self._append(pieces)
            for seq, new, removed in changes:
                if new is None:
                    del self._held[seq]
                else:
                    self._held[seq] = new
                for i in removed:
                    self._index.forget(seq, i)
                self._destinations -= len(removed)
            self._index.prune(self._destinations)
            self._maybe_compact()
        # Also when nothing changed: an earlier settle of the same pair may not be durable yet.
        await self.committer.durable()

    # --- waiting --------------------------------------------------------------------------

    async def next_due_ms(self) -> int | None:
        self._promised = self._index.next_due_ms()
        self._wake.clear()  # the answer covers every hold so far
        return self._promised

    def _wake_if_sooner(self, deliver_at_ms: int) -> None:
        if self._promised is None or deliver_at_ms < self._promised:
            self._promised = deliver_at_ms
            self._wake.set()

    async def wait(self, timeout_s: float) -> None:
        await wait_event(self._wake, timeout_s)
        self._wake.clear()

    async def held_for(self, target: str) -> int:
        if self._by_target is None:
            self._by_target = Counter(
                d.target for rec in self._held.values() for d in rec.dests if d is not None
            )
        return max(self._by_target[target], 0)

    async def stats(self) -> SchedulerStats:
        return SchedulerStats(
            held_messages=len(self._held),
            held_destinations=self._destinations,
            claimed=len(self._index.claims),
            log_records=self._records,
            log_bytes=0 if self._file is None else self._file.size,
        )
