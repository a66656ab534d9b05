"""The PostgreSQL sink (SPEC E4-E6): idempotent batched writes, failure isolation, dead letters.

A worker writes a chunk of events in one transaction: the ledger insert (ON CONFLICT DO
NOTHING RETURNING) says which events are new, and only those change the target tables, so a
replayed batch, or one event arriving by the main, hot and retry paths, is written once.
A constraint or data error is narrowed to the failing events by splitting the chunk under
savepoints; the rest of the chunk still commits. Anything else fails the whole chunk.
"""

from __future__ import annotations

import atexit
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import msgspec
import psycopg
from psycopg import sql

from mqgate.pipeline.aggregate import FlushRule, flush_reason
from mqgate.pipeline.config import EventType, PipelineConfig
from mqgate.pipeline.dispatch import stable_hash
from mqgate.pipeline.parsing import MAX_ERROR_CHARS, Event, ParseFailure
from mqgate.pipeline.schema import DEAD_LETTERS, FAULT_PROBE, FLUSHES, HOT_KEYS, LEDGER, PENDING, RETRIES

Conn = psycopg.Connection[Any]
NOW_MS: Final = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
# Errors that belong to some rows of a chunk (a constraint, a bad value): isolate those rows.
ROW_ERRORS: Final = (psycopg.errors.IntegrityError, psycopg.errors.DataError)
_SHARE_SCALE: Final = 1_000_000


def describe(exc: BaseException) -> str:
    """One line naming the error, for logs and the dead-letter table."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:MAX_ERROR_CHARS]


class ChunkResult(msgspec.Struct):
    applied: list[Event] = msgspec.field(default_factory=list)
    duplicates: int = 0
    failed: list[tuple[Event, str]] = msgspec.field(default_factory=list)


class _Pool:
    """Connections kept per executor process: Spark reuses its Python workers between
    tasks, so each micro-batch does not pay for new PostgreSQL sessions. At most `limit`
    sessions per URL are in use at once; a worker asking for one more waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[Conn]] = defaultdict(list)
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    def _slot(self, url: str, limit: int) -> threading.BoundedSemaphore:
        with self._lock:
            slot = self._slots.get(url)
            if slot is None:
                slot = self._slots[url] = threading.BoundedSemaphore(limit)
            return slot

    @contextmanager
    def connection(self, url: str, limit: int) -> Iterator[Conn]:
        slot = self._slot(url, limit)
        with slot:
            with self._lock:
                conn = self._idle[url].pop() if self._idle[url] else None
            if conn is None or conn.closed:
                conn = psycopg.connect(url, autocommit=True)
            try:
                yield conn
            except BaseException:
                conn.close()
                raise
            if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.close()
                return
            with self._lock:
                self._idle[url].append(conn)

    def close_idle(self) -> None:
        """Close the kept sessions (at exit, and between tests that drop their database)."""
        with self._lock:
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()


POOL: Final = _Pool()
atexit.register(POOL.close_idle)


class Sink:
    def __init__(self, config: PipelineConfig) -> None:
        self.job = config.job.name
        self.url = config.sink.url
        self.max_connections = config.sink.max_connections
        self.mode = config.job.mode
        self.types: dict[str, EventType] = {et.type: et for et in config.events}
        self.fail_keys = frozenset(config.sink.fail_keys)
        self.fail_share = int(config.sink.fail_first_attempt_share * _SHARE_SCALE)
        self.fail_always = frozenset(config.sink.fail_always_keys)
        self.flush_rule = FlushRule(config.aggregate.count, config.aggregate.age_s)
        self._insert_sql = {et.type: self._event_insert(et) for et in config.events}

    def connection(self) -> Any:
        return POOL.connection(self.url, self.max_connections)

    # --- failure injection (testing knob) -----------------------------------------------

    def should_fail(self, event: Event) -> bool:
        if event.key in self.fail_always:
            return True
        if event.attempts > 1:
            return False
        if event.key in self.fail_keys:
            return True
        return self.fail_share > 0 and stable_hash(event.event_id) % _SHARE_SCALE < self.fail_share

    # --- the write path -----------------------------------------------------------------

    def apply_chunk(self, conn: Conn, events: Sequence[Event]) -> ChunkResult:
        """Write `events` in one transaction; row errors are isolated, others propagate."""
        result = ChunkResult()
        # One event may be in a chunk twice (the hot or retry topic holds a copy produced
        # before a crash and one produced by the replay): the ledger insert returns its id
        # once, so only one copy may go on.
        unique: dict[str, Event] = {}
        for e in events:
            unique.setdefault(e.event_id, e)
        # A fixed lock order (event ids, then keys) keeps concurrent workers from deadlocking
        # when one event arrives on two paths at once.
        ordered = sorted(unique.values(), key=lambda e: e.event_id)
        with conn.transaction():
            self._isolate(conn, ordered, result)
        result.duplicates = len(events) - len(result.applied) - len(result.failed)
        return result

    def _isolate(self, conn: Conn, events: Sequence[Event], result: ChunkResult) -> None:
        try:
            with conn.transaction():
                applied = self._apply(conn, events)
        except ROW_ERRORS as exc:
            if len(events) == 1:
                result.failed.append((events[0], describe(exc)))
                return
            middle = len(events) // 2
            self._isolate(conn, events[:middle], result)
            self._isolate(conn, events[middle:], result)
            return
        result.applied.extend(applied)

    def _apply(self, conn: Conn, events: Sequence[Event]) -> list[Event]:
        doomed = [e.event_id for e in events if self.should_fail(e)]
        if doomed:
            conn.execute(
                f"INSERT INTO {FAULT_PROBE} (event_id, ok) SELECT unnest(%s::text[]), false", (doomed,)
            )
        rows = conn.execute(
            f"""INSERT INTO {LEDGER} (job, event_id, type, key, attempts, source)
                SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[])
                ON CONFLICT (job, event_id) DO NOTHING RETURNING event_id""",
            (
                self.job,
                [e.event_id for e in events],
                [e.type for e in events],
                [e.key for e in events],
                [e.attempts for e in events],
                [e.source for e in events],
            ),
        ).fetchall()
        new_ids = {r[0] for r in rows}
        new = [e for e in events if e.event_id in new_ids]
        by_type: dict[str, list[Event]] = defaultdict(list)
        for e in new:
            by_type[e.type].append(e)
        for type_name in sorted(by_type):
            if self.mode == "aggregate":
                self._add_pending(conn, type_name, by_type[type_name])
            else:
                self._insert_rows(conn, type_name, by_type[type_name])
        return new

    def _event_insert(self, et: EventType) -> sql.Composed:
        names = [f"f{i}" for i in range(len(et.fields))]
        columns = [sql.Identifier(c) for c in et.fields]
        casts = [
            sql.SQL("u.{}::{}").format(sql.Identifier(n), sql.SQL(et.field_types.get(c, "text")))
            for n, c in zip(names, et.fields, strict=True)
        ]
        return sql.SQL(
            "INSERT INTO {table} (event_id, key, {cols}payload, event_ms, source, attempts) "
            "SELECT u.event_id, u.key, {casts}u.payload, u.event_ms, u.source, u.attempts "
            "FROM unnest(%s::text[], %s::text[], {arrays}%s::text[], %s::bigint[], %s::text[], %s::int[]) "
            "AS u(event_id, key, {names}payload, event_ms, source, attempts) "
            "ON CONFLICT (event_id) DO NOTHING"
        ).format(
            table=sql.Identifier(et.table),
            cols=sql.SQL("").join(sql.SQL("{}, ").format(c) for c in columns),
            casts=sql.SQL("").join(sql.SQL("{}, ").format(c) for c in casts),
            arrays=sql.SQL("%s::text[], " * len(names)),
            names=sql.SQL("").join(sql.SQL("{}, ").format(sql.Identifier(n)) for n in names),
        )

    def _insert_rows(self, conn: Conn, type_name: str, events: Sequence[Event]) -> None:
        columns = list(self.types[type_name].fields)
        params: list[Any] = [[e.event_id for e in events], [e.key for e in events]]
        params += [[e.fields.get(c) for e in events] for c in columns]
        params += [
            [e.payload for e in events],
            [e.event_ms for e in events],
            [e.source for e in events],
            [e.attempts for e in events],
        ]
        conn.execute(self._insert_sql[type_name], params)

    def _add_pending(self, conn: Conn, type_name: str, events: Sequence[Event]) -> None:
        counts = sorted(Counter(e.key for e in events).items())
        conn.execute(
            f"""INSERT INTO {PENDING} AS p (job, type, key, count, first_ms, last_ms)
                SELECT %s, %s, u.key, u.n, {NOW_MS}, {NOW_MS}
                FROM unnest(%s::text[], %s::bigint[]) AS u(key, n)
                ON CONFLICT (job, type, key)
                DO UPDATE SET count = p.count + excluded.count, last_ms = excluded.last_ms""",
            (self.job, type_name, [k for k, _ in counts], [n for _, n in counts]),
        )

    # --- failures: dead letters and the retry bookkeeping ---------------------------------

    def dead_letter(self, conn: Conn, items: Iterable[tuple[Event | ParseFailure, str, int]]) -> int:
        """Store events that will not be retried (error, attempts); replays write nothing twice."""
        rows = [(e.event_id, e.type, e.payload, err[:MAX_ERROR_CHARS], n, e.source) for e, err, n in items]
        if not rows:
            return 0
        columns = list(zip(*rows, strict=True))
        conn.execute(
            f"""INSERT INTO {DEAD_LETTERS} (job, event_id, type, payload, error, attempts, source)
                SELECT %s, * FROM unnest(
                    %s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[])
                ON CONFLICT (job, event_id) DO NOTHING""",
            (self.job, *[list(c) for c in columns]),
        )
        return len(rows)

    def record_retries(self, conn: Conn, items: Sequence[tuple[Event, str]], due_ms: int) -> None:
        """Remember events sent to the retry topic (after the produce was acknowledged)."""
        if not items:
            return
        conn.execute(
            f"""INSERT INTO {RETRIES} AS r (job, event_id, type, attempts, due_ms, error)
                SELECT %s, u.id, u.type, u.attempts, %s, u.error
                FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[]) AS u(id, type, attempts, error)
                ON CONFLICT (job, event_id) DO UPDATE
                SET attempts = GREATEST(r.attempts, excluded.attempts), due_ms = excluded.due_ms,
                    error = excluded.error""",
            (
                self.job,
                due_ms,
                [e.event_id for e, _ in items],
                [e.type for e, _ in items],
                [e.attempts for e, _ in items],
                [err[:MAX_ERROR_CHARS] for _, err in items],
            ),
        )

    def forget_retries(self, conn: Conn, events: Sequence[Event]) -> None:
        """Events of the retry topic whose attempt is over: drop the record of the earlier
        failure. A new failure was recorded first (with the higher attempt), so the table
        never looks empty while an event is still on its way."""
        if not events:
            return
        conn.execute(
            f"""DELETE FROM {RETRIES} r USING unnest(%s::text[], %s::int[]) AS u(id, attempts)
                WHERE r.job = %s AND r.event_id = u.id AND r.attempts < u.attempts""",
            ([e.event_id for e in events], [e.attempts for e in events], self.job),
        )

    def pending_retries(self, conn: Conn) -> int:
        row = conn.execute(f"SELECT count(*) FROM {RETRIES} WHERE job = %s", (self.job,)).fetchone()
        return int(row[0]) if row else 0

    # --- driver-side reports and the aggregate flush ------------------------------------

    def record_hot_keys(self, conn: Conn, type_name: str, batch_id: int, hot: Sequence[Any]) -> None:
        if not hot:
            return
        conn.execute(
            f"""INSERT INTO {HOT_KEYS} (job, type, batch_id, key, events, moved, reason)
                SELECT %s, %s, %s, * FROM unnest(%s::text[], %s::int[], %s::int[], %s::text[])
                ON CONFLICT DO NOTHING""",
            (
                self.job,
                type_name,
                batch_id,
                [h.key for h in hot],
                [h.events for h in hot],
                [h.moved for h in hot],
                [h.reason for h in hot],
            ),
        )

    def flush_pending(self, conn: Conn, shutdown: bool = False) -> list[tuple[str, str, int, str]]:
        """Move the pending aggregates that are due into the final tables, in one transaction;
        return (type, key, count, reason) of each flushed aggregate."""
        flushed: list[tuple[str, str, int, str]] = []
        with conn.transaction():
            rows = conn.execute(
                f"""SELECT type, key, count, first_ms, {NOW_MS} FROM {PENDING}
                    WHERE job = %s ORDER BY type, key FOR UPDATE""",
                (self.job,),
            ).fetchall()
            for type_name, key, count, first_ms, now_ms in rows:
                reason = flush_reason(count, first_ms, now_ms, self.flush_rule, shutdown)
                if reason is not None and type_name in self.types:
                    flushed.append((type_name, key, int(count), reason))
            by_type: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
            for type_name, key, count, reason in flushed:
                by_type[type_name].append((key, count, reason))
            for type_name, items in by_type.items():
                keys = [k for k, _, _ in items]
                counts = [c for _, c, _ in items]
                conn.execute(
                    f"DELETE FROM {PENDING} WHERE job = %s AND type = %s AND key = ANY(%s::text[])",
                    (self.job, type_name, keys),
                )
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {t} AS f (key, count) SELECT * FROM unnest(%s::text[], %s::bigint[]) "
                        "ON CONFLICT (key) DO UPDATE SET count = f.count + excluded.count, updated_at = now()"
                    ).format(t=sql.Identifier(self.types[type_name].table)),
                    (keys, counts),
                )
                conn.execute(
                    f"""INSERT INTO {FLUSHES} (job, type, key, count, reason)
                        SELECT %s, %s, * FROM unnest(%s::text[], %s::bigint[], %s::text[])""",
                    (self.job, type_name, keys, counts, [r for _, _, r in items]),
                )
        return flushed
