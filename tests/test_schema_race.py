"""Gateway processes started together (`serve --workers N`) all create their SQL tables at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

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
