"""The trace query index behind SQLAlchemy: its own SQLite file (WAL) by default, or PostgreSQL.

Calls are synchronous; the indexer and the query service run them in a worker thread.

Tables: the events (each row: the indexed columns and the event's JSON as stored), the keys
(key → message id), and the indexer's positions per trace topic and queue. A batch of events
and the positions after it commit in one transaction, and a position only moves from the value
the writer read (compare and set), so each stored event is indexed exactly once, across
restarts and with several indexers on one database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from mqgate.errors import Unavailable
from mqgate.sqlschema import create_all_shared
from mqgate.tracing.batch import TraceBatch, decode_batch, expand
from mqgate.tracing.events import TraceEvent, decode_event
from mqgate.tracing.paths import MessagePath, build_path

_meta: Final = sa.MetaData()
# SQLite: an INTEGER PRIMARY KEY is the rowid (ordered, no extra index); elsewhere BIGINT.
_Id: Final = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

events = sa.Table(
    "mqgate_trace_events",
    _meta,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("msg_id", sa.String(), nullable=False),
    sa.Column("request_id", sa.String(), nullable=True),
    sa.Column("time_ms", sa.BigInteger, nullable=False),
    sa.Column("event", sa.Text, nullable=False),  # the event's JSON, as the trace topic holds it
    sa.Index("mqgate_trace_events_msg", "msg_id"),
    # Most hops carry no request id: index only those that do.
    sa.Index(
        "mqgate_trace_events_request",
        "request_id",
        sqlite_where=sa.text("request_id IS NOT NULL"),
        postgresql_where=sa.text("request_id IS NOT NULL"),
    ),
)
keys = sa.Table(
    "mqgate_trace_keys",
    _meta,
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("msg_id", sa.String(), primary_key=True),
    sa.Column("event_id", sa.BigInteger, nullable=False),  # the first event with it (retention)
    sa.Index("mqgate_trace_keys_event", "event_id"),
)
positions = sa.Table(
    "mqgate_trace_positions",
    _meta,
    sa.Column("topic", sa.String(), primary_key=True),
    sa.Column("queue", sa.Integer, primary_key=True),
    sa.Column("next_offset", sa.BigInteger, nullable=False),
)

Position = tuple[str, int]  # (trace topic, queue)


class StalePositions(Exception):
    """Another indexer moved a position first: nothing of this batch was written."""


@dataclass(slots=True, frozen=True)
class IndexRow:
    """One indexed row: an event, a batch (`msg_id` "", the batch's JSON), or a message of a
    batch (`batch_back` > 0: its event column names the batch's row, that many rows before)."""

    msg_id: str
    request_id: str | None
    time_ms: int
    keys: Sequence[str]
    event_json: str
    batch_back: int = 0


BATCH_REF: Final = "@"  # event column of a batch's message: "@<id of the batch's row>"


def batch_rows(batch: TraceBatch, body: str) -> list[IndexRow]:
    """The rows of a batch record: the batch, then one per message pointing back to it (its
    events are expanded from the batch when a query reads them)."""
    rows = [IndexRow("", None, batch.time_ms, (), body)]
    keys = batch.keys
    for i, msg_id in enumerate(batch.msg_ids, start=1):
        rows.append(IndexRow(msg_id, None, batch.time_ms, keys[i - 1] if keys else (), BATCH_REF, i))
    return rows


@dataclass(slots=True, frozen=True)
class PositionMove:
    old: int | None  # None: the writer saw no row yet
    new: int


@dataclass(slots=True)
class IndexCounters:
    written: int = 0  # events committed by this process
    pruned: int = 0  # events removed by retention


def default_sqlite_url(data_dir: str) -> str:
    return f"sqlite:///{data_dir.rstrip('/')}/trace-index.sqlite"


class TraceIndex:
    def __init__(self, url: str, *, max_paths: int = 100) -> None:
        self.url = url
        self.max_paths = max_paths  # messages returned for one request id or key, newest first
        self.counters = IndexCounters()
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        self.engine = sa.create_engine(url, **kwargs)
        if self.is_sqlite:
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        mark = "?" if self.is_sqlite else "%s"
        self._insert_events_sql = (
            f"INSERT INTO {events.name} (id, msg_id, request_id, time_ms, event) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark})"
        )
        self._insert_keys_sql = (
            f"INSERT INTO {keys.name} (key, msg_id, event_id) VALUES ({mark}, {mark}, {mark}) "
            "ON CONFLICT DO NOTHING"
        )

    def create_schema(self) -> None:
        try:
            create_all_shared(_meta, self.engine)
        except IntegrityError:
            pass  # another process created them at the same moment
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc

    def dispose(self) -> None:
        self.engine.dispose()

    # --- writing ------------------------------------------------------------------------------

    def positions(self) -> dict[Position, int]:
        with self._connect() as conn:
            rows = conn.execute(sa.select(positions.c.topic, positions.c.queue, positions.c.next_offset))
            return {(r.topic, r.queue): int(r.next_offset) for r in rows}

    def write(self, rows: Sequence[IndexRow], moves: Mapping[Position, PositionMove]) -> None:
        """Insert `rows` and move the positions, all in one transaction. Raises StalePositions
        (and writes nothing) when a position is no longer at `old`."""
        try:
            with self.engine.begin() as conn:
                for (topic, queue), move in moves.items():
                    _move(conn, topic, queue, move)
                if rows:
                    self._insert(conn, rows)
        except IntegrityError as exc:  # a position row inserted by another indexer first
            raise StalePositions(str(exc)) from exc
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc
        self.counters.written += len(rows)

    def _insert(self, conn: sa.Connection, rows: Sequence[IndexRow]) -> None:
        # Ids are given, from the highest one on: a plain executemany (no RETURNING) is the
        # fastest insert on both databases, and the key rows know their event's id. Two
        # indexers that read the same highest id collide on the primary key, and the later
        # one's whole batch rolls back (StalePositions), as for a position moved under it.
        high = conn.execute(sa.select(sa.func.max(events.c.id))).scalar_one_or_none()
        self._insert_with_ids(conn, list(enumerate(rows, start=int(high or 0) + 1)))

    def _insert_with_ids(self, conn: sa.Connection, rows: Sequence[tuple[int, IndexRow]]) -> None:
        # The driver's own executemany: SQLAlchemy's per-row parameter handling cost more than
        # SQLite's insert itself (py-spy, a traced produce load).
        conn.exec_driver_sql(
            self._insert_events_sql,
            [
                (
                    i,
                    r.msg_id,
                    r.request_id,
                    r.time_ms,
                    f"{BATCH_REF}{i - r.batch_back}" if r.batch_back else r.event_json,
                )
                for i, r in rows
            ],
        )
        key_rows: dict[tuple[str, str], int] = {}
        for i, r in rows:
            for key in r.keys:
                key_rows.setdefault((key, r.msg_id), i)
        if key_rows:
            conn.exec_driver_sql(self._insert_keys_sql, [(k, m, i) for (k, m), i in key_rows.items()])

    def bulk_load(self, rows: Sequence[tuple[int, IndexRow]]) -> None:
        """Rows with their ids given, in one transaction, for loading a benchmark's millions of
        events fast; positions do not move. Not for the indexer."""
        with self.engine.begin() as conn:
            self._insert_with_ids(conn, rows)

    # --- queries ------------------------------------------------------------------------------

    def paths(
        self, *, msg_id: str | None = None, request_id: str | None = None, key: str | None = None
    ) -> list[MessagePath]:
        """The path of the message `msg_id`, or of each message a request id or key names
        (newest first, at most `max_paths`). No time window: whatever retention kept."""
        given = [v for v in (msg_id, request_id, key) if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of msg_id, request_id, key")
        try:
            with self._connect() as conn:
                if msg_id is not None:
                    ids = [msg_id]
                elif request_id is not None:
                    ids = _distinct(
                        conn.execute(
                            sa.select(events.c.msg_id)
                            .where(events.c.request_id == request_id)
                            .order_by(events.c.id.desc())
                            .limit(self.max_paths * 4)
                        ).scalars()
                    )[: self.max_paths]
                else:
                    ids = list(
                        conn.execute(
                            sa.select(keys.c.msg_id)
                            .where(keys.c.key == key)
                            .order_by(keys.c.event_id.desc())
                            .limit(self.max_paths)
                        ).scalars()
                    )
                if not ids:
                    return []
                found: dict[str, list[str]] = {i: [] for i in ids}
                for row in conn.execute(
                    sa.select(events.c.msg_id, events.c.event).where(events.c.msg_id.in_(ids))
                ):
                    found[row.msg_id].append(row.event)
                batches = _batches_named(conn, found)
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc
        return [build_path(i, _events_of(i, found[i], batches)) for i in ids if found[i]]

    def event_count(self) -> int:
        """Events held (from the id range: retention removes only the oldest, so the range has
        no holes but those of rolled-back batches on PostgreSQL, which makes this an upper bound)."""
        with self._connect() as conn:
            low, high = conn.execute(sa.select(sa.func.min(events.c.id), sa.func.max(events.c.id))).one()
        return 0 if low is None else int(high) - int(low) + 1

    # --- retention ----------------------------------------------------------------------------

    def prune(
        self, now_ms: int, *, max_age_ms: int | None, max_events: int | None, chunk: int = 50_000
    ) -> int:
        """Remove the oldest events past `max_age_ms` or beyond `max_events`, at most `chunk`
        per call (call again while it returns `chunk`); return how many went."""
        try:
            with self.engine.begin() as conn:
                low, high = conn.execute(sa.select(sa.func.min(events.c.id), sa.func.max(events.c.id))).one()
                if low is None:
                    return 0
                boundary = int(low)  # events with id < boundary go
                if max_events is not None:
                    boundary = max(boundary, int(high) - max_events + 1)
                if max_age_ms is not None:
                    first_young = conn.execute(
                        sa.select(events.c.id)
                        .where(events.c.id >= boundary, events.c.time_ms >= now_ms - max_age_ms)
                        .order_by(events.c.id)
                        .limit(1)
                    ).scalar_one_or_none()
                    boundary = int(high) + 1 if first_young is None else max(boundary, int(first_young))
                boundary = min(boundary, int(low) + chunk)
                if boundary <= int(low):
                    return 0
                removed = conn.execute(sa.delete(events).where(events.c.id < boundary)).rowcount
                conn.execute(sa.delete(keys).where(keys.c.event_id < boundary))
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc
        self.counters.pruned += removed
        return int(removed)

    def _connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc


def _move(conn: sa.Connection, topic: str, queue: int, move: PositionMove) -> None:
    if move.old is None:
        conn.execute(sa.insert(positions).values(topic=topic, queue=queue, next_offset=move.new))
        return
    where = (
        (positions.c.topic == topic) & (positions.c.queue == queue) & (positions.c.next_offset == move.old)
    )
    if conn.execute(sa.update(positions).where(where).values(next_offset=move.new)).rowcount != 1:
        raise StalePositions(f"{topic} queue {queue} moved from {move.old}")


def _batches_named(conn: sa.Connection, found: Mapping[str, Sequence[str]]) -> dict[int, TraceBatch]:
    wanted = {int(e[1:]) for rows in found.values() for e in rows if e.startswith(BATCH_REF)}
    if not wanted:
        return {}
    query = sa.select(events.c.id, events.c.event).where(events.c.id.in_(sorted(wanted)))
    return {int(row.id): decode_batch(row.event) for row in conn.execute(query)}


def _events_of(msg_id: str, stored: Sequence[str], batches: Mapping[int, TraceBatch]) -> list[TraceEvent]:
    """A message's events: its own rows, and its part of each batch it is in (a batch that
    retention removed a moment ago is skipped: its messages' rows go next)."""
    out: list[TraceEvent] = []
    for event in stored:
        if not event.startswith(BATCH_REF):
            out.append(decode_event(event))
        elif (batch := batches.get(int(event[1:]))) is not None:
            out += expand(batch, only=msg_id)
    return out


def _distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    # WAL: queries read while the indexer writes. synchronous=NORMAL: a power cut may lose the
    # last batches, but a batch and its positions go together, so the indexer redoes them.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
