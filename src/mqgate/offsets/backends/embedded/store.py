"""The consumer-group table in the gateway's memory, made durable by a journal.

Single process, single event loop: each method runs without awaiting between its read and
its write, so each is atomic. What must survive a restart (committed offsets, dead-letter
counts, broadcast clientIds and when they were last seen) is appended to
`<data_dir>/offsets/journal.log` (framed by `mqgate.durable`, like the message logs) and fsynced through the
shared group commit before the call returns. A change is written to the journal before it
shows in memory: a write that fails (a full disk: 507) changes nothing, so an ack is never
acknowledged unless it is journaled. Each record is checked on its own at start-up: a damaged
one costs that record (counted in `Health`), not the ones after it. Locks and attempt counts
live in memory only: after a restart every batch in flight is simply delivered again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

import msgspec

from mqgate.core.acks import AckRefusal, ack_refusal
from mqgate.core.layout import Layout
from mqgate.core.message_window import (
    ALREADY,
    CHANGED,
    STALE,
    MessageOutcome,
    Received,
    Window,
    change_visibility,
    delete,
    in_flight,
    receive,
    receive_ordered,
    window_from,
    window_state,
)
from mqgate.core.queue_choice import QueueView, choose_queue, next_lock_ts
from mqgate.core.ratelimit import TokenBucket
from mqgate.core.tokens import AckToken
from mqgate.durable.append_file import AppendFile, install, write_new
from mqgate.durable.framing import frame
from mqgate.durable.group_commit import GroupCommitter
from mqgate.durable.space import DiskSpace
from mqgate.errors import NotFound
from mqgate.health import Health
from mqgate.model import QueueBounds
from mqgate.offsets.backends.embedded.journal import (
    TableKey,
    commit_record,
    deleted_record,
    received_record,
    replay,
    table_record,
    visibility_record,
)
from mqgate.offsets.interface import (
    AckedLease,
    GroupListener,
    Lease,
    OffsetEntry,
    ack_then_lease,
    given_bounds,
)

JOURNAL_FILE: Final = "journal.log"
COMPACT_MIN_RECORDS: Final = 10_000
COMPONENT: Final = "offsets_journal"

log = logging.getLogger(__name__)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class EmbeddedOffsetStore:
    def __init__(self, data_dir: Path, committer: GroupCommitter, health: Health | None = None) -> None:
        self.directory = Path(data_dir) / "offsets"
        self.committer = committer
        self.health = health or Health()
        self._space = DiskSpace(self.directory, 0, self.health)
        self._retry_compaction_at = 0  # after a failed compaction, not before this many records
        self._tables: dict[TableKey, list[OffsetEntry]] = {}
        # Each group's client ids (its tables' keys): a group's clients are read per consumer on
        # every progress, expiry and drop, which must not pass over every group's tables.
        self._clients: dict[str, set[str]] = {}
        self._seen_ms: dict[TableKey, int] = {}
        self._journal: AppendFile | None = None
        self._records = 0
        self._buckets: dict[str, TokenBucket] = {}
        self._watchers: list[GroupListener] = []

    # --- journal ------------------------------------------------------------------------

    @property
    def _path(self) -> Path:
        return self.directory / JOURNAL_FILE

    async def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            data = b""
        replayed = replay(data)
        self._tables, self._seen_ms = replayed.tables, replayed.seen_ms
        self._clients = {}
        for group, client in self._tables:
            self._clients.setdefault(group, set()).add(client)
        good_end, dropped = replayed.valid_bytes, replayed.dropped
        where = str(self._path)
        if dropped:
            self.health.fault(
                COMPONENT,
                "record_dropped",
                f"{where}: {len(dropped)} records dropped, the others kept ({'; '.join(dropped[:5])})",
                len(dropped),
            )
        if good_end < len(data):
            self.health.fault(
                COMPONENT, "torn_tail_cut", f"{where}: cut {len(data) - good_end} bytes after byte {good_end}"
            )
        if not self._try_compact():
            # No room to rewrite it: go on appending to the journal as it is, after its intact
            # records (start-up reads past the damage the same way next time).
            if self._path.exists():
                self._journal = AppendFile.reopen(self._path, good_end)
            else:
                self._journal = AppendFile.create(self._path)

    async def close(self) -> None:
        await self.committer.flush()
        if self._journal is not None:
            self._try_compact()
            self._journal.close()
            self._journal = None

    def _table_record(self, key: TableKey) -> list[Any]:
        return table_record(key, self._tables[key], self._seen_ms.get(key, 0))

    def _compact(self) -> None:
        """Rewrite the journal as one record per table: temp file, fsync, atomic rename."""
        tmp = self._path.with_suffix(".tmp")
        journal = write_new(tmp, [b"".join(frame(_encode(self._table_record(k))) for k in self._tables)])
        try:
            install(tmp, self._path)
        except BaseException:
            journal.close()
            raise
        if self._journal is not None:
            self.committer.close_after_next_sync(self._journal.close)
        self._journal = journal
        self._records = len(self._tables)

    def _try_compact(self) -> bool:
        try:
            self._compact()
        except OSError as exc:
            self.health.fault(COMPONENT, "compaction_failed", f"{self._path}: {exc.strerror}")
            self._retry_compaction_at = self._records + COMPACT_MIN_RECORDS
            self._path.with_suffix(".tmp").unlink(missing_ok=True)
            return False
        return True

    def _log(self, *recs: list[Any]) -> None:
        """Journal records before their change shows in memory: raises (507 on a full disk,
        the journal cut back) and changes nothing if the write fails."""
        assert self._journal is not None
        try:
            self._journal.append(b"".join(frame(_encode(rec)) for rec in recs))
        except OSError as exc:
            raise self._space.write_error(exc, COMPONENT, "offsets journal write") from exc
        self._records += len(recs)
        self.committer.mark_dirty(self)

    def _maybe_compact(self) -> None:
        """Called once the journaled change shows in memory (a compaction writes the memory)."""
        if self._records > max(COMPACT_MIN_RECORDS, 4 * len(self._tables), self._retry_compaction_at):
            self._try_compact()

    def sync_fds(self) -> list[int]:
        assert self._journal is not None
        return [self._journal.fd]

    def after_sync(self) -> None:
        return None

    # --- tables -------------------------------------------------------------------------

    async def ensure_table(self, group: str, client_id: str, starts: list[int], now_ms: int) -> bool:
        key = (group, client_id)
        table = self._tables.get(key)
        if table is not None:
            if len(table) < len(starts):
                added = [OffsetEntry(committed=s) for s in starts[len(table) :]]
                self._log(table_record(key, table + added, self._seen_ms.get(key, 0)))
                table.extend(added)
                self._moved(group)
                self._maybe_compact()
                await self.committer.durable()
            return False
        entries = [OffsetEntry(committed=s) for s in starts]
        self._log(table_record(key, entries, now_ms))
        self._tables[key] = entries
        self._clients.setdefault(group, set()).add(client_id)
        self._seen_ms[key] = now_ms
        self._moved(group)
        self._maybe_compact()
        await self.committer.durable()
        return True

    async def table(self, group: str, client_id: str) -> list[OffsetEntry] | None:
        table = self._tables.get((group, client_id))
        return None if table is None else [OffsetEntry(**_fields(e)) for e in table]

    async def clients(self, group: str) -> list[str]:
        return sorted(self._clients.get(group, ()))

    def watch(self, listener: GroupListener) -> None:
        self._watchers.append(listener)

    @property
    def reads_bounds(self) -> bool:
        return False  # the caller has the store in its own process: its bounds cost no round trip

    @property
    def hears_every_change(self) -> bool:
        """One process owns the tables: every move goes through this object."""
        return True

    def _moved(self, group: str) -> None:
        for listener in self._watchers:
            listener(group)

    def _entries(self, group: str, client_id: str) -> list[OffsetEntry]:
        table = self._tables.get((group, client_id))
        if table is None:
            raise NotFound(f"no offsets for consumer {group} client {client_id!r}", field="consumer")
        return table

    # --- leasing ------------------------------------------------------------------------

    async def lease(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        *,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
        read_from: Layout | None = None,
    ) -> Lease | None:
        table = self._entries(group, client_id)
        self._seen_ms[(group, client_id)] = now_ms
        views = [
            QueueView(
                b.queue, b.min, b.max, e.committed, e.lock_ts, e.lock_deadline_ms, e.last_access_ms, b.lane
            )
            for b, e in zip(given_bounds(bounds), table, strict=True)
        ]
        chosen = choose_queue(views, now_ms)
        if chosen is None:
            return None
        e = table[chosen.queue]
        if e.committed < chosen.min_offset:  # retention dropped what was never consumed
            e.committed, e.attempts = chosen.min_offset, 0
        start = e.committed
        dead = e.attempts >= max_attempts
        again = e.attempts > 0 and e.delivered_end > start
        if dead:
            end = e.delivered_end if again else min(start + max_count, chosen.max_offset)
        else:
            end = min(e.delivered_end if again else chosen.max_offset, start + max_count)
            e.attempts += 1
            e.delivered_end = end
        e.lock_ts = next_lock_ts(e.lock_ts, now_ms)
        if not again or e.first_lock_ts == 0:  # a new batch; a redelivery keeps the first's
            e.first_lock_ts = e.lock_ts
        e.lock_deadline_ms = now_ms + lock_timeout_ms
        e.lock_owner = owner
        e.last_access_ms = now_ms
        return Lease(chosen.queue, start, end, e.lock_ts, e.attempts, dead, first_lock_ts=e.first_lock_ts)

    async def ack_and_lease(
        self,
        token: AckToken,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        *,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
        read_from: Layout | None = None,
    ) -> AckedLease:
        return await ack_then_lease(
            self,
            token,
            group,
            client_id,
            bounds,
            now_ms=now_ms,
            max_count=max_count,
            lock_timeout_ms=lock_timeout_ms,
            max_attempts=max_attempts,
            owner=owner,
        )

    def _check(self, token: AckToken, now_ms: int) -> tuple[OffsetEntry | None, AckRefusal | None]:
        table = self._entries(token.consumer, token.client_id)
        if not 0 <= token.queue < len(table):
            return None, "offset_moved"
        e = table[token.queue]
        refusal = ack_refusal(
            stored_committed=e.committed,
            stored_lock_ts=e.lock_ts,
            stored_lock_deadline_ms=e.lock_deadline_ms,
            stored_acked_lock_ts=e.acked_lock_ts,
            token_offset=token.offset,
            token_lock_ts=token.lock_ts,
            now_ms=now_ms,
        )
        return e, refusal

    async def _commit(
        self, token: AckToken, now_ms: int, dead: int, *, dead_letters: bool = False
    ) -> AckRefusal | None:
        e, refusal = self._check(token, now_ms)
        if refusal is not None or e is None:
            return refusal
        key = (token.consumer, token.client_id)
        self._log(commit_record(key, token.queue, token.next_offset, e.dead_lettered + dead, now_ms))
        e.committed = token.next_offset
        e.dead_lettered += dead
        if not dead_letters:  # an ack, not the gateway settling a batch it did not deliver
            e.acked_lock_ts = token.lock_ts
        _unlock(e)
        e.attempts = 0
        e.delivered_end = 0
        e.last_access_ms = now_ms
        self._seen_ms[key] = now_ms
        self._moved(token.consumer)
        self._maybe_compact()
        await self.committer.durable()
        return None

    async def ack(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        return await self._commit(token, now_ms, 0)

    async def record_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        return await self._commit(token, now_ms, count, dead_letters=True)

    async def add_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        e, refusal = self._check(token, now_ms)
        if refusal is not None or e is None:
            return refusal
        key = (token.consumer, token.client_id)
        self._log(commit_record(key, token.queue, e.committed, e.dead_lettered + count, now_ms))
        e.dead_lettered += count
        self._seen_ms[key] = now_ms
        self._maybe_compact()
        await self.committer.durable()
        return None

    async def release(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        e, refusal = self._check(token, now_ms)
        if refusal is None and e is not None:
            _unlock(e)
        return refusal

    async def extend(self, token: AckToken, now_ms: int, seconds: float) -> AckRefusal | None:
        e, refusal = self._check(token, now_ms)
        if refusal is None and e is not None:
            e.lock_deadline_ms = now_ms + int(seconds * 1000)
        return refusal

    # --- message-level mode (core/message_window.py) -------------------------------------

    async def receive(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds],
        *,
        now_ms: int,
        max_count: int,
        visibility_ms: int,
        max_attempts: int,
        window: int,
        first_queue: int,
        ordered: bool = False,
    ) -> list[Received]:
        table = self._entries(group, client_id)
        take = receive_ordered if ordered else receive
        key = (group, client_id)
        self._seen_ms[key] = now_ms
        n = len(bounds)
        steps: list[tuple[OffsetEntry, Window, int, list[Received]]] = []
        wanted = max_count
        for i in range(n):
            if wanted <= 0:
                break
            b = bounds[(first_queue + i) % n]
            e = table[b.queue]
            w = e.window if e.window is not None else Window(e.committed, e.committed)
            # Work on a copy: the journal is written before anything shows in memory.
            trial = window_from(w.committed, window_state(w))
            got = take(
                trial, b.queue, min_offset=b.min, max_offset=b.max, now_ms=now_ms, want=wanted,
                visibility_ms=visibility_ms, max_attempts=max_attempts, limit=window,
            )  # fmt: skip
            if got or trial.committed != e.committed:
                steps.append((e, trial, b.queue, got))
                wanted -= len(got)
        if not steps:
            return []
        self._log(*(received_record(key, queue, trial, got) for _, trial, queue, got in steps))
        for e, trial, _, _ in steps:
            e.window = trial
            e.committed = trial.committed
        self._moved(group)
        self._maybe_compact()
        await self.committer.durable()
        return [r for _, _, _, got in steps for r in got]

    def _window(self, group: str, client_id: str, queue: int) -> tuple[OffsetEntry, Window]:
        table = self._entries(group, client_id)
        if not 0 <= queue < len(table):
            raise NotFound(f"queue {queue} is not a queue of consumer {group}", field="receiptHandle")
        e = table[queue]
        if e.window is None:
            e.window = Window(e.committed, e.committed)
        return e, e.window

    async def delete_message(
        self,
        group: str,
        client_id: str,
        queue: int,
        offset: int,
        receives: int,
        first_ms: int,
        now_ms: int,
        *,
        dead_letter: bool = False,
    ) -> MessageOutcome:
        e, w = self._window(group, client_id, queue)
        f = w.inflight.get(offset)
        if offset < w.committed or offset in w.deleted:
            return ALREADY
        if f is None or f.receives != receives or f.first_ms != first_ms:
            return STALE
        key = (group, client_id)
        dead = e.dead_lettered + (1 if dead_letter else 0)
        self._log(deleted_record(key, queue, offset, dead, now_ms))
        outcome = delete(w, offset, receives, first_ms)
        e.dead_lettered = dead
        moved = e.committed != w.committed
        e.committed = w.committed
        self._seen_ms[key] = now_ms
        if moved:
            self._moved(group)
        self._maybe_compact()
        await self.committer.durable()
        return outcome

    async def change_visibility(
        self,
        group: str,
        client_id: str,
        queue: int,
        offset: int,
        receives: int,
        first_ms: int,
        now_ms: int,
        visible_ms: int,
    ) -> MessageOutcome:
        _, w = self._window(group, client_id, queue)
        trial = window_from(w.committed, window_state(w))
        outcome = change_visibility(trial, offset, receives, first_ms, now_ms, visible_ms)
        if outcome != CHANGED:
            return outcome
        self._log(visibility_record((group, client_id), queue, offset, visible_ms))
        change_visibility(w, offset, receives, first_ms, now_ms, visible_ms)
        self._maybe_compact()
        await self.committer.durable()
        return outcome

    async def receipt_counts(self, group: str, client_id: str, now_ms: int) -> dict[int, tuple[int, int]]:
        table = self._tables.get((group, client_id)) or []
        return {
            q: (in_flight(e.window, now_ms), sum(1 for o in e.window.deleted if o >= e.committed))
            for q, e in enumerate(table)
            if e.window is not None
        }

    async def reset(self, group: str, client_id: str, queue: int, offset: int) -> None:
        table = self._entries(group, client_id)
        e = table[queue]
        key = (group, client_id)
        self._log(commit_record(key, queue, offset, e.dead_lettered, self._seen_ms.get(key, 0)))
        e.committed = offset
        e.window = None
        _unlock(e)
        e.attempts = 0
        e.delivered_end = 0
        self._moved(group)
        self._maybe_compact()
        await self.committer.durable()

    async def advance(
        self, group: str, client_id: str, offsets: dict[int, int], now_ms: int
    ) -> dict[int, int]:
        table = self._entries(group, client_id)
        for queue in offsets:
            if not 0 <= queue < len(table):
                raise IndexError(queue)
        key = (group, client_id)
        moves = {q: o for q, o in offsets.items() if o > table[q].committed}
        if moves:
            dead = {q: table[q].dead_lettered for q in moves}
            self._log(*(commit_record(key, q, o, dead[q], now_ms) for q, o in moves.items()))
            for queue, offset in moves.items():
                e = table[queue]
                e.committed = offset
                e.window = None
                e.attempts = 0
                e.delivered_end = 0
            self._seen_ms[key] = now_ms
            self._moved(group)
            self._maybe_compact()
            await self.committer.durable()
        return {queue: table[queue].committed for queue in offsets}

    async def expire_clients(self, group: str, idle_before_ms: int) -> list[str]:
        seen = self._seen_ms
        gone = [c for c in self._clients.get(group, ()) if c and seen.get((group, c), 0) < idle_before_ms]
        if gone:
            self._log(*(["x", group, c] for c in gone))
            for c in gone:
                self._forget((group, c))
            self._moved(group)
            self._maybe_compact()
            await self.committer.durable()
        return gone

    async def drop_group(self, group: str) -> None:
        gone = [(group, c) for c in sorted(self._clients.get(group, ()))]
        if gone:
            # Journal first: the tables go from memory only once their removal is written.
            self._log(*(["x", g, c] for g, c in gone))
            for key in gone:
                self._forget(key)
            self._moved(group)
            self._maybe_compact()
            await self.committer.durable()
        self._buckets.pop(group, None)

    def _forget(self, key: TableKey) -> None:
        group, client = key
        self._tables.pop(key, None)
        self._seen_ms.pop(key, None)
        clients = self._clients.get(group)
        if clients is not None:
            clients.discard(client)
            if not clients:
                del self._clients[group]

    # --- rate limit (one process: the bucket lives here) ---------------------------------

    def _bucket(self, group: str, rate_per_s: float, now_ms: int) -> TokenBucket:
        bucket = self._buckets.get(group)
        if bucket is None or bucket.rate_per_s != rate_per_s:
            bucket = self._buckets[group] = TokenBucket.full(rate_per_s, now_ms)
        return bucket

    async def take_tokens(self, group: str, rate_per_s: float, wanted: int, now_ms: int) -> tuple[int, float]:
        bucket = self._bucket(group, rate_per_s, now_ms)
        granted = bucket.take(wanted, now_ms)
        return granted, (bucket.retry_after_s() if granted == 0 else 0.0)

    async def return_tokens(self, group: str, rate_per_s: float, count: int) -> None:
        bucket = self._buckets.get(group)
        if bucket is not None and bucket.rate_per_s == rate_per_s:
            bucket.give_back(count)


def _unlock(e: OffsetEntry) -> None:
    # lock_ts stays: the next lock must get a larger one, so an old token never matches it.
    e.lock_deadline_ms = 0
    e.lock_owner = ""


def _fields(e: OffsetEntry) -> dict[str, Any]:
    return {name: getattr(e, name) for name in OffsetEntry.__struct_fields__}
