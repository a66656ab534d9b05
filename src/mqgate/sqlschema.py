"""Creating SQL tables when several processes may do it at the same moment, and opening the
SQLite indexes in WAL mode when they may.

`create_all` looks for each table, then creates the missing ones. Gateway processes started
together (`serve --workers N`, or several gateways on one registry) can all see a table missing;
every CREATE but the first then fails (SQLite: "table ... already exists"; PostgreSQL: a unique
violation on pg_type, or DuplicateTable). Looking again finds the other process's table, so the
loser tries again instead of dying at start-up.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

ATTEMPTS = 5
WAL_SWITCH_TIMEOUT_S: Final = 30.0  # as long as the indexes' busy timeout


def create_all_shared(meta: sa.MetaData, engine: sa.Engine) -> None:
    """`meta.create_all(engine)`, safe against other processes creating the same tables."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            meta.create_all(engine, checkfirst=True)
            return
        except (IntegrityError, OperationalError, ProgrammingError) as exc:
            lost_a_race = isinstance(exc, IntegrityError) or "already exists" in str(exc.orig)
            if not lost_a_race or attempt == ATTEMPTS:
                raise


def sqlite_wal(dbapi_conn: Any, _record: Any) -> None:
    """The connect hook of the SQLite indexes (trace index, queue-state history): WAL, so
    queries read while the writer writes, and synchronous=NORMAL (a power cut may lose the last
    commits, never a process crash; each index's writer redoes what its positions lack).

    Switching a database to WAL needs it alone for a moment, and SQLite answers "database is
    locked" at once, without waiting out its busy timeout, while another connection writes to
    it in the old journal mode: a gateway process creating the same tables at the same moment
    (CI: one of six racing processes died so). The switch is retried until
    `WAL_SWITCH_TIMEOUT_S`."""
    deadline = time.monotonic() + WAL_SWITCH_TIMEOUT_S
    pause_s = 0.005
    cursor = dbapi_conn.cursor()
    try:
        while True:
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(pause_s)  # polling a lock another process holds
                pause_s = min(pause_s * 2, 0.1)
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def upsert_insert(engine: sa.Engine) -> Any:
    """The dialect's INSERT, which has `on_conflict_do_update` (PostgreSQL's or SQLite's; the
    SQL registry supports no other database)."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert
