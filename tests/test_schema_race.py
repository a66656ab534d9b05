"""Gateway processes started together (`serve --workers N`) all create their SQL tables at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

PROCESSES = 6
ROUNDS = 3


def _create(kind: str, url: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    import sqlalchemy as sa

    barrier.wait(10)
    if kind == "console":
        from mqgate.console.tables import create_tables

        create_tables(sa.create_engine(url))
    elif kind == "registry":
        from mqgate.registry.sql import SqlRegistry

        SqlRegistry(url).create_schema()
    elif kind == "trace-index":
        from mqgate.tracing.index import TraceIndex

        TraceIndex(url).create_schema()


def _race(kind: str, url: str) -> list[int | None]:
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(PROCESSES)
    procs = [spawn.Process(target=_create, args=(kind, url, barrier)) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    return [proc.exitcode for proc in procs]


@pytest.mark.parametrize("kind", ["console", "registry", "trace-index"])
def test_processes_creating_the_same_tables_at_once_all_start(kind: str, tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        url = f"sqlite:///{tmp_path / f'{kind}-{round_}.db'}"
        assert _race(kind, url) == [0] * PROCESSES, f"round {round_}: a process failed to start"


def test_gateways_creating_the_registry_on_postgresql_at_once_all_start(pg_url: str) -> None:
    for round_ in range(ROUNDS):
        assert _race("registry", pg_url) == [0] * PROCESSES, f"round {round_}: a process failed"
        import sqlalchemy as sa

        engine = sa.create_engine(pg_url)
        with engine.begin() as conn:  # the next round races on an empty database again
            tables = [
                row[0]
                for row in conn.execute(
                    sa.text("select tablename from pg_tables where schemaname = 'public'")
                )
            ]
            for table in tables:
                conn.execute(sa.text(f'drop table "{table}" cascade'))
        engine.dispose()


@pytest.mark.parametrize("kind", ["trace-index", "queue-state"])
def test_an_index_opens_while_another_process_writes_the_database_in_its_old_journal_mode(
    kind: str, tmp_path: Path
) -> None:
    """SQLite answers the switch to WAL with "database is locked" at once, not after its busy
    timeout, while another connection writes in the old journal mode (CI: one of the racing
    processes above died so): the index waits for the lock instead."""
    path = tmp_path / "index.db"
    held, release = threading.Event(), threading.Event()

    def writer() -> None:  # another gateway process, mid-way through creating its tables
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("CREATE TABLE other (x)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO other VALUES (1)")
        held.set()
        release.wait(10)
        conn.execute("COMMIT")
        conn.close()

    # Opened (its modules imported) before the writer takes the lock: the wait is for the lock.
    if kind == "trace-index":
        from mqgate.tracing.index import TraceIndex

        opened: Any = TraceIndex(f"sqlite:///{path}")
    else:
        from mqgate.queuestate.history import QueueStateHistory

        opened = QueueStateHistory(f"sqlite:///{path}")
    holder = threading.Thread(target=writer)
    holder.start()
    try:
        assert held.wait(10)
        threading.Timer(0.3, release.set).start()  # the writer commits while the index waits
        opened.create_schema()
        with opened.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        opened.engine.dispose()
    finally:
        release.set()
        holder.join(10)
