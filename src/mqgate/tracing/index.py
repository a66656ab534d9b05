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
from typing import Any, Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from mqgate.core.ids import ID_PREFIX_CHARS, id_from, lowest_id_like
from mqgate.errors import Unavailable
from mqgate.sqlschema import create_all_shared, sqlite_wal
from mqgate.tracing.batch import TraceBatch, TraceRound, batches_of, decode_record, expand
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
    # Most hops carry no request id: index only those that do (PostgreSQL's condition is given
    # by `create_schema`).
    _REQUEST_INDEX := sa.Index(
        "mqgate_trace_events_request", "request_id", sqlite_where=sa.text("request_id IS NOT NULL")
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
# A batch's message ids: [first_id, last_id] → the batch's row (event_id).
ranges = sa.Table(
    "mqgate_trace_ranges",
    _meta,
    sa.Column("first_id", sa.String(), nullable=False),
    sa.Column("last_id", sa.String(), nullable=False),
    sa.Column("event_id", sa.BigInteger, nullable=False),
    sa.Index("mqgate_trace_ranges_first", "first_id"),
    sa.Index("mqgate_trace_ranges_event", "event_id"),
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


class IndexRow(msgspec.Struct, frozen=True):
    """One indexed row: an event, or a batch or round of batches (`msg_id` "", the record's
    JSON, the range of each batch's message ids and each message's keys as (key, msg_id)
    pairs)."""

    msg_id: str
    request_id: str | None
    time_ms: int
    keys: Sequence[str]
    event_json: str
    id_ranges: Sequence[tuple[str, str]] = ()
    key_pairs: Sequence[tuple[str, str]] = ()


def batch_row(record: TraceBatch | TraceRound, body: str) -> IndexRow:
    """The one row of a batch or round record. Its messages get no row each: ids are
    time-sortable, and the ids a record holds of one millisecond and process lie in one range
    (core.ids), so the record is found from that range (then checked to hold the id): the
    index costs a row and a range or two per record, not a row per message or request."""
    batches = batches_of(record)
    pairs = [(k, m) for b in batches if b.keys for m, ks in zip(b.ids, b.keys, strict=True) for k in ks]
    return IndexRow("", None, batches[0].time_ms, (), body, _id_ranges(batches), pairs)


def _id_ranges(batches: Sequence[TraceBatch]) -> list[tuple[str, str]]:
    """Per id prefix (millisecond and process, the part a look-up's range is bounded by), the
    lowest and highest id of the batches."""
    # A run's ids share its first id's prefix and count up from its counter (decoding checked
    # it is hex and the run fits): lowest and highest counters are compared as numbers and
    # formatted once per prefix. Listed ids are compared as they are.
    counters: dict[str, list[int]] = {}
    listed: dict[str, tuple[str, str]] = {}
    for b in batches:
        if not b.parts and b.first_id is None:
            for m in b.msg_ids:
                prefix = m[:ID_PREFIX_CHARS]
                found = listed.get(prefix)
                listed[prefix] = (m, m) if found is None else (min(found[0], m), max(found[1], m))
            continue
        for first, n in b.runs():
            prefix = first[:ID_PREFIX_CHARS]
            low = int(first[ID_PREFIX_CHARS:], 16)
            high = low + n - 1
            span = counters.get(prefix)
            if span is None:
                counters[prefix] = [low, high]
            else:
                if low < span[0]:
                    span[0] = low
                if high > span[1]:
                    span[1] = high
    spans = {p: (id_from(p, low), id_from(p, high)) for p, (low, high) in counters.items()}
    for prefix, (low_id, high_id) in listed.items():
        found = spans.get(prefix)
        if found is not None:
            low_id, high_id = min(found[0], low_id), max(found[1], high_id)
        spans[prefix] = (low_id, high_id)
    return list(spans.values())


class PositionMove(msgspec.Struct, frozen=True):
    old: int | None  # None: the writer saw no row yet
    new: int


class IndexCounters(msgspec.Struct):
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
            sa.event.listen(self.engine, "connect", sqlite_wal)
        mark = "?" if self.is_sqlite else "%s"
        self._insert_events_sql = (
            f"INSERT INTO {events.name} (id, msg_id, request_id, time_ms, event) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark})"
        )
        self._insert_ranges_sql = (
            f"INSERT INTO {ranges.name} (first_id, last_id, event_id) VALUES ({mark}, {mark}, {mark})"
        )
        # The positions move by plain SQL: SQLAlchemy's building and compiling of an UPDATE took
        # about 280 µs a round (most of an empty round's cost), the driver's about 30.
        self._insert_position_sql = (
            f"INSERT INTO {positions.name} (topic, queue, next_offset) VALUES ({mark}, {mark}, {mark})"
        )
        self._move_position_sql = (
            f"UPDATE {positions.name} SET next_offset = {mark} "
            f"WHERE topic = {mark} AND queue = {mark} AND next_offset = {mark}"
        )
        self._insert_keys_sql = (
            f"INSERT INTO {keys.name} (key, msg_id, event_id) VALUES ({mark}, {mark}, {mark}) "
            "ON CONFLICT DO NOTHING"
        )

    def create_schema(self) -> None:
        if not self.is_sqlite:
            # Given here, not in the table: naming a `postgresql_` option there loads SQLAlchemy's
            # PostgreSQL dialect in every gateway, a tenth of a cold start on SQLite.
            _REQUEST_INDEX.dialect_options["postgresql"]["where"] = sa.text("request_id IS NOT NULL")
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
                    self._move(conn, topic, queue, move)
                if rows:
                    self._insert(conn, rows)
        except IntegrityError as exc:  # a position row inserted by another indexer first
            raise StalePositions(str(exc)) from exc
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc
        self.counters.written += len(rows)

    def _move(self, conn: sa.Connection, topic: str, queue: int, move: PositionMove) -> None:
        if move.old is None:
            conn.exec_driver_sql(self._insert_position_sql, (topic, queue, move.new))
            return
        moved = conn.exec_driver_sql(self._move_position_sql, (move.new, topic, queue, move.old))
        if moved.rowcount != 1:
            raise StalePositions(f"{topic} queue {queue} moved from {move.old}")

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
                    r.event_json,
                )
                for i, r in rows
            ],
        )
        spans = [(first, last, i) for i, r in rows for first, last in r.id_ranges]
        if spans:
            conn.exec_driver_sql(self._insert_ranges_sql, spans)
        key_rows: dict[tuple[str, str], int] = {}
        for i, r in rows:
            for key in r.keys:
                key_rows.setdefault((key, r.msg_id), i)
            for pair in r.key_pairs:
                key_rows.setdefault(pair, i)
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
                found: dict[str, list[str | TraceEvent]] = {i: [] for i in ids}
                for row in conn.execute(
                    sa.select(events.c.msg_id, events.c.event).where(events.c.msg_id.in_(ids))
                ):
                    found[row.msg_id].append(row.event)
                for msg_id, batch in _batches_holding(conn, ids):
                    found[msg_id] += expand(batch, only=msg_id)
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc
        return [build_path(i, [_event(e) for e in found[i]]) for i in ids if found[i]]

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
                conn.execute(sa.delete(ranges).where(ranges.c.event_id < boundary))
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc
        self.counters.pruned += removed
        return int(removed)

    def _connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except SQLAlchemyError as exc:
            raise Unavailable(f"trace index database error: {exc}") from exc


def _batches_holding(conn: sa.Connection, ids: Sequence[str]) -> list[tuple[str, TraceBatch]]:
    """The batches each id is in: those whose id range holds it, among the ranges of the same
    millisecond and process (the id's first 20 characters), decoded and checked."""
    out: list[tuple[str, TraceBatch]] = []
    for msg_id in ids:
        low = lowest_id_like(msg_id)
        query = (
            sa.select(events.c.event)
            .join(ranges, ranges.c.event_id == events.c.id)
            .where(ranges.c.first_id >= low, ranges.c.first_id <= msg_id, ranges.c.last_id >= msg_id)
        )
        for (body,) in conn.execute(query.distinct()):
            record = decode_record(body)
            if isinstance(record, TraceEvent):  # a range never points at one; skip it if it did
                continue
            out += ((msg_id, b) for b in batches_of(record) if b.holds(msg_id))
    return out


def _event(stored: str | TraceEvent) -> TraceEvent:
    return stored if isinstance(stored, TraceEvent) else decode_event(stored)


def _distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
