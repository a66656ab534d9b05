"""The SQS API's own table, in the registry's database (created on demand, next to the
registry's tables, never touching them): what an SQS queue has that its topic and consumer
records cannot hold (DelaySeconds, ReceiveMessageWaitTimeSeconds, MaximumMessageSize, the
redrive and FIFO attributes, its tags, when it was made and last changed).

Each gateway reads rows through a copy in memory. Every change moves the table's one version
row in the same transaction; a gateway compares its copy's version with it at most every
`refresh_s` (2 s, one `SELECT` of one row) and drops the copy when it moved, so a change made
through any gateway is in force on every other within `refresh_s` of its next request, and at
once on its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from mqgate.sqlschema import create_all_shared

REFRESH_S: Final = 2.0

meta: Final = sa.MetaData()

queues = sa.Table(
    "mqgate_sqs_queues",
    meta,
    sa.Column("topic", sa.String(160), primary_key=True),
    sa.Column("attributes", sa.Text, nullable=False),  # JSON: attribute name → value
    sa.Column("tags", sa.Text, nullable=False),  # JSON: key → value
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("modified_ms", sa.BigInteger, nullable=False),
)
version = sa.Table(
    "mqgate_sqs_queues_version",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
)


class QueueRow(msgspec.Struct):
    topic: str
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    created_ms: int = 0
    modified_ms: int = 0


_decode_map: Final = msgspec.json.Decoder(dict[str, str]).decode


class QueueTable:
    """Rows by topic name, read through a copy in memory (see the module for how it stays
    current)."""

    def __init__(
        self, engine: sa.Engine, *, refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.engine = engine
        self.refresh_s = refresh_s
        self._clock = clock
        self._cache: dict[str, QueueRow | None] = {}
        self._made = False
        self._version: int | None = None
        self._checked_at: float | None = None
        self.drops = 0  # times the copy was dropped for another gateway's change
        # Moves whenever the copy may have changed (filled, dropped, written): what was read
        # from it at one generation still holds while the generation stays.
        self.generation = 0

    def _tables(self) -> None:
        if not self._made:
            create_all_shared(meta, self.engine)
            try:
                with self.engine.begin() as conn:
                    if conn.execute(sa.select(version.c.version)).first() is None:
                        conn.execute(sa.insert(version).values(id=1, version=1))
            except IntegrityError:
                pass  # another gateway made the row at the same moment
            self._made = True

    def due(self) -> bool:
        """Whether the copy is older than `refresh_s` (then `check` it)."""
        return self._checked_at is None or self._clock() - self._checked_at >= self.refresh_s

    def check(self) -> None:
        """Drop the copy if the table changed since it was checked."""
        started = self._clock()
        self._tables()
        with self.engine.connect() as conn:
            current = int(conn.execute(sa.select(version.c.version)).scalar_one())
        if current != self._version:
            if self._version is not None:
                self.drops += 1
            self._cache.clear()
            self.generation += 1
            self._version = current
        self._checked_at = started

    def _moved(self, conn: sa.Connection) -> None:
        conn.execute(sa.update(version).values(version=version.c.version + 1))

    def cached(self, topic: str) -> tuple[bool, QueueRow | None]:
        """(whether the copy knows the row, the row) without touching the database."""
        return topic in self._cache, self._cache.get(topic)

    def get(self, topic: str) -> QueueRow | None:
        if topic in self._cache:
            return self._cache[topic]
        self._tables()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(queues).where(queues.c.topic == topic)).first()
        found = None
        if row is not None:
            m = row._mapping
            found = QueueRow(
                topic,
                _decode_map(str(m["attributes"])),
                _decode_map(str(m["tags"])),
                int(m["created_ms"]),
                int(m["modified_ms"]),
            )
        self._cache[topic] = found
        self.generation += 1
        return found

    def put(self, row: QueueRow) -> None:
        self._tables()
        values = {
            "attributes": msgspec.json.encode(row.attributes).decode(),
            "tags": msgspec.json.encode(row.tags).decode(),
            "created_ms": row.created_ms,
            "modified_ms": row.modified_ms,
        }
        with self.engine.begin() as conn:
            done = conn.execute(sa.update(queues).where(queues.c.topic == row.topic).values(**values))
            if done.rowcount == 0:
                conn.execute(sa.insert(queues).values(topic=row.topic, **values))
            self._moved(conn)
        self._cache[row.topic] = row
        self.generation += 1

    def delete(self, topic: str) -> None:
        self._tables()
        with self.engine.begin() as conn:
            conn.execute(sa.delete(queues).where(queues.c.topic == topic))
            self._moved(conn)
        self._cache.pop(topic, None)
        self.generation += 1
