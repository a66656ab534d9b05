"""The queue-state history on both databases it supports."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqgate.queuestate.history import QueueStateHistory
from tests.conftest import require_service

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", "postgresql"])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[QueueStateHistory]:
    if request.param == "sqlite":
        h = QueueStateHistory(tmp_path / "queue-state.db")
    else:
        require_service("127.0.0.1", 5432, "PostgreSQL")
        # The shared `test` database, tables under a prefix of this run's own, dropped after.
        h = QueueStateHistory(PG_URL, table_prefix=f"qs_{uuid.uuid4().hex[:10]}_")
    h.create_schema()
    h.create_schema()  # idempotent
    yield h
    h.drop_schema()
    h.dispose()
