"""The registry behind SQLAlchemy: an SQLite file by default, PostgreSQL by URL.

Calls are synchronous and short; the gateway runs them in a worker thread. Every change
bumps one version row and notes what it changed in a change log under that version, so a
gateway notices any change with one cheap query and loads only the rows that changed.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from mqgate.errors import AlreadyExists, NotFound, Unavailable
from mqgate.registry.records import (
    DEFAULT_PROJECT,
    ConsumerRecord,
    PolicyRecord,
    ProducerRecord,
    ProjectRecord,
    Snapshot,
    TopicRecord,
)
from mqgate.sqlschema import create_all_shared

_meta: Final = sa.MetaData()

topics = sa.Table(
    "mqgate_topics",
    _meta,
    sa.Column("name", sa.String(160), primary_key=True),
    sa.Column("queues", sa.Integer, nullable=False),
    sa.Column("retention_ms", sa.BigInteger, nullable=False),
    sa.Column("retention_bytes", sa.BigInteger, nullable=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("max_priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("grown_from", sa.Text, nullable=False, server_default=""),
    sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT),
)
projects = sa.Table(
    "mqgate_projects",
    _meta,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)
policies = sa.Table(
    "mqgate_trace_policies",
    _meta,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("level", sa.String(16), nullable=False),
    sa.Column("project", sa.String(128), nullable=True),
    sa.Column("topic", sa.String(160), nullable=True),
    sa.Column("queue", sa.Integer, nullable=True),
    sa.Column("service", sa.String(128), nullable=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)
producers = sa.Table(
    "mqgate_producers",
    _meta,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("topic", sa.String(160), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("destinations", sa.Text, nullable=False, server_default=""),
)
consumers = sa.Table(
    "mqgate_consumers",
    _meta,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("topic", sa.String(160), nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("start", sa.String(32), nullable=False),
    sa.Column("lock_timeout_s", sa.Float, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("rate_limit_per_s", sa.Float, nullable=False),
    sa.Column("alert_backlog", sa.BigInteger, nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("push", sa.Text, nullable=False, server_default=""),
)
# Secrets every gateway of a deployment must share (the ack-token key, the admin token).
secrets = sa.Table(
    "mqgate_secrets",
    _meta,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)
version = sa.Table(
    "mqgate_registry_version",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
)
# What each version changed: one row per version, ("topic" | "producer" | "consumer", name),
# or ("all", "") for a change a reader must reload everything for.
changes = sa.Table(
    "mqgate_registry_changes",
    _meta,
    sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("name", sa.String(160), nullable=False),
)
# Change-log rows kept; a gateway further behind than this (or behind a version written by an
# older mqgate, which kept no log) reloads the whole registry instead.
CHANGES_KEPT: Final = 10_000
CHANGES_PRUNE_EVERY: Final = 1_000
KIND_ALL: Final = "all"


class Changes(msgspec.Struct, frozen=True):
    """The records changed after a version, as they are now (None: no longer there)."""

    version: int
    topics: dict[str, TopicRecord | None]
    producers: dict[str, ProducerRecord | None]
    consumers: dict[str, ConsumerRecord | None]
    projects: dict[str, ProjectRecord | None] = msgspec.field(default_factory=dict)
    policies: dict[str, PolicyRecord | None] = msgspec.field(default_factory=dict)


# Change-log kinds: each a table, its key column, and its record type.
KINDS: Final[dict[str, tuple[sa.Table, sa.Column[Any], Any]]] = {
    "topic": (topics, topics.c.name, TopicRecord),
    "producer": (producers, producers.c.name, ProducerRecord),
    "consumer": (consumers, consumers.c.name, ConsumerRecord),
    "project": (projects, projects.c.name, ProjectRecord),
    "policy": (policies, policies.c.id, PolicyRecord),
}


class SqlRegistry:
    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        self.engine = sa.create_engine(url, **kwargs)

    def create_schema(self) -> None:
        try:
            create_all_shared(_meta, self.engine)
            self._add_new_columns()
            with self.engine.begin() as conn:
                if conn.execute(sa.select(version.c.version)).first() is None:
                    conn.execute(sa.insert(version).values(id=1, version=1))
            # Topics made before projects existed belong to the default project (SPEC P1).
            with self.engine.begin() as conn:
                query = sa.select(projects.c.name).where(projects.c.name == DEFAULT_PROJECT)
                if conn.execute(query).first() is None:
                    row = {
                        "name": DEFAULT_PROJECT,
                        "description": "topics not given a project",
                        "created_ms": 0,
                    }
                    conn.execute(sa.insert(projects).values(**row))
        except IntegrityError:
            pass  # another gateway created the version row at the same moment
        except OperationalError as exc:
            raise Unavailable(f"registry database unreachable: {exc.orig}") from exc

    def _add_new_columns(self) -> None:
        """Columns added after a table was first created, with their defaults (a registry made
        by an older version keeps working)."""
        existing = sa.inspect(self.engine)
        for table in (topics, producers, consumers):
            have = {c["name"] for c in existing.get_columns(table.name)}
            for column in table.columns:
                if column.name in have:
                    continue
                kind = column.type.compile(dialect=self.engine.dialect)
                default = column.server_default.arg if column.server_default is not None else None  # type: ignore[attr-defined]
                ddl = f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"
                if default is not None:
                    ddl += f" NOT NULL DEFAULT '{default}'" if isinstance(default, str) else ""
                try:
                    with self.engine.begin() as conn:
                        conn.execute(sa.text(ddl))
                except sa.exc.DBAPIError:
                    # Fine if another gateway added it at the same moment.
                    columns = sa.inspect(self.engine).get_columns(table.name)
                    if column.name not in {c["name"] for c in columns}:
                        raise

    def is_empty(self) -> bool:
        """True if no topic was ever registered here (no tables yet, or no topic rows): a new
        registry, or one that lost its contents."""
        try:
            if not sa.inspect(self.engine).has_table(topics.name):
                return True
            with self.engine.connect() as conn:
                return conn.execute(sa.select(topics.c.name).limit(1)).first() is None
        except OperationalError as exc:
            raise Unavailable(f"registry database unreachable: {exc.orig}") from exc

    def dispose(self) -> None:
        self.engine.dispose()

    def _bump(self, conn: sa.Connection, kind: str = KIND_ALL, name: str = "") -> None:
        # The update locks the version row until commit, so versions commit in order and a
        # reader never sees version n+1 in the log without n.
        conn.execute(sa.update(version).values(version=version.c.version + 1))
        new = int(conn.execute(sa.select(version.c.version)).scalar_one())
        conn.execute(sa.insert(changes).values(version=new, kind=kind, name=name))
        if new % CHANGES_PRUNE_EVERY == 0:
            conn.execute(sa.delete(changes).where(changes.c.version <= new - CHANGES_KEPT))

    def _write(self, stmt: Any, what: str, kind: str, name: str) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt)
                self._bump(conn, kind, name)
        except IntegrityError as exc:
            raise AlreadyExists(f"{what} already exists", field="name") from exc
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def version(self) -> int:
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(sa.select(version.c.version)).scalar_one())
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def add_topic(self, rec: TopicRecord) -> None:
        self._write(sa.insert(topics).values(**_row(rec)), f"topic {rec.name}", "topic", rec.name)

    def add_producer(self, rec: ProducerRecord) -> None:
        self._write(sa.insert(producers).values(**_row(rec)), f"producer {rec.name}", "producer", rec.name)

    def add_consumer(self, rec: ConsumerRecord) -> None:
        self._write(sa.insert(consumers).values(**_row(rec)), f"consumer {rec.name}", "consumer", rec.name)

    def add_project(self, rec: ProjectRecord) -> None:
        self._write(sa.insert(projects).values(**_row(rec)), f"project {rec.name}", "project", rec.name)

    def add_policy(self, rec: PolicyRecord) -> None:
        self._write(sa.insert(policies).values(**_row(rec)), f"trace policy {rec.id}", "policy", rec.id)

    def remove(self, kind: str, name: str) -> None:
        """Delete the record `name` of a kind (NotFound if there is none)."""
        table, key, _ = KINDS[kind]
        try:
            with self.engine.begin() as conn:
                if conn.execute(sa.delete(table).where(key == name)).rowcount == 0:
                    raise NotFound(f"{kind} {name} is not registered", field=kind)
                self._bump(conn, kind, name)
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def update_topic(self, name: str, **changes: Any) -> None:
        self._update(topics, "topic", name, changes)

    def update_consumer(self, name: str, **changes: Any) -> None:
        self._update(consumers, "consumer", name, changes)

    def update_producer(self, name: str, **changes: Any) -> None:
        self._update(producers, "producer", name, changes)

    def _update(self, table: sa.Table, kind: str, name: str, changes: dict[str, Any]) -> None:
        stmt = sa.update(table).where(table.c.name == name).values(**changes)
        try:
            with self.engine.begin() as conn:
                if conn.execute(stmt).rowcount == 0:
                    raise NotFound(f"{kind} {name} is not registered", field=kind)
                self._bump(conn, kind, name)
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def shared_secret(self, name: str, candidate: str) -> str:
        """The deployment's secret `name`; `candidate` becomes it if there is none yet."""
        query = sa.select(secrets.c.value).where(secrets.c.name == name)
        try:
            with self.engine.begin() as conn:
                value = conn.execute(query).scalar_one_or_none()
                if value is None:
                    conn.execute(sa.insert(secrets).values(name=name, value=candidate))
                    return candidate
                return str(value)
        except IntegrityError:  # another gateway stored its candidate first
            with self.engine.connect() as conn:
                return str(conn.execute(query).scalar_one())
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def snapshot(self) -> Snapshot:
        try:
            with self.engine.connect() as conn:
                ver = int(conn.execute(sa.select(version.c.version)).scalar_one())
                loaded = {
                    kind: {
                        getattr(row, key.name): record(**row._asdict())
                        for row in conn.execute(sa.select(table))
                    }
                    for kind, (table, key, record) in KINDS.items()
                }
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc
        return Snapshot(
            ver,
            loaded["topic"],
            loaded["producer"],
            loaded["consumer"],
            loaded["project"],
            loaded["policy"],
        )

    def changes_since(self, known: int) -> Changes | None:
        """What changed after version `known`, or None when the change log cannot tell (it
        was pruned past `known`, or a change needs a full reload): call `snapshot` then."""
        try:
            with self.engine.connect() as conn:
                current = int(conn.execute(sa.select(version.c.version)).scalar_one())
                if current == known:
                    return Changes(known, {}, {}, {})
                log = conn.execute(
                    sa.select(changes.c.version, changes.c.kind, changes.c.name)
                    .where(changes.c.version > known)
                    .order_by(changes.c.version)
                ).all()
                contiguous = all(row.version == known + 1 + i for i, row in enumerate(log))
                if not log or not contiguous or log[-1].version < current:
                    return None
                names: dict[str, set[str]] = {kind: set() for kind in KINDS}
                for row in log:
                    if row.kind not in names:
                        return None
                    names[row.kind].add(row.name)
                found = {kind: _load(conn, kind, names[kind]) for kind in KINDS}
                return Changes(
                    int(log[-1].version),
                    found["topic"],
                    found["producer"],
                    found["consumer"],
                    found["project"],
                    found["policy"],
                )
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc


def _load(conn: sa.Connection, kind: str, names: set[str]) -> dict[str, Any]:
    """The records of `kind` named `names`; None for a name with no row."""
    if not names:
        return {}
    table, key, record = KINDS[kind]
    found: dict[str, Any] = dict.fromkeys(names)
    for row in conn.execute(sa.select(table).where(key.in_(sorted(names)))):
        found[getattr(row, key.name)] = record(**row._asdict())
    return found


def _row(rec: Any) -> dict[str, Any]:
    return msgspec.structs.asdict(rec)  # not `fields`: it evaluates the annotations each time
