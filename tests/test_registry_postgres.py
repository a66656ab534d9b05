"""The registry on the machine's PostgreSQL: the SQL layer directly, and a gateway using it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mqgate.errors import AlreadyExists, NotFound
from mqgate.registry.records import ConsumerRecord, TopicRecord
from mqgate.registry.sql import SqlRegistry
from tests.conftest import Server, require_service

PG_ADMIN_URL = "host=127.0.0.1 port=5432 user=postgres dbname=test"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database per test, dropped afterwards."""
    require_service("127.0.0.1", 5432, "PostgreSQL")
    import psycopg

    name = f"mqgate_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_sql_registry_on_postgresql(pg_url: str) -> None:
    reg = SqlRegistry(pg_url)
    reg.create_schema()
    reg.create_schema()  # idempotent: a second gateway starting does the same
    v0 = reg.version()
    reg.add_topic(TopicRecord("orders", 8, 1000, None, 1))
    with pytest.raises(AlreadyExists):
        reg.add_topic(TopicRecord("orders", 8, 1000, None, 1))
    reg.add_consumer(ConsumerRecord("c", "orders", "cluster", "earliest", 60, 16, False, 0, 0, "h", 1))
    reg.update_consumer("c", paused=True)
    with pytest.raises(NotFound):
        reg.update_consumer("ghost", paused=True)
    snap = reg.snapshot()
    assert snap.version == v0 + 3
    assert snap.topics["orders"].queues == 8 and snap.consumers["c"].paused is True
    reg.dispose()


def test_gateway_with_a_postgresql_registry(pg_url: str, tmp_path: Path) -> None:
    server = Server(tmp_path / "data", extra_args=["--registry-url", pg_url]).start()
    try:
        ptoken, ctoken = server.setup_topic("pg", queues=2)
        r = httpx.post(
            server.url + "/mq/produce",
            json={"producer": "pg-p", "message": "stored"},
            headers={"Authorization": f"Bearer {ptoken}"},
        )
        assert r.status_code == 200
    finally:
        server.stop()
    reg = SqlRegistry(pg_url)
    snap = reg.snapshot()
    reg.dispose()
    assert set(snap.producers) == {"pg-p"} and snap.consumers["pg-c"].topic == "pg"
    assert snap.producers["pg-p"].token_hash != ptoken  # stored hashed, never in clear
    server = Server(
        tmp_path / "data",
        port=server.port,
        admin_token=server.admin_token,
        extra_args=["--registry-url", pg_url],
    ).start()
    try:
        r = httpx.get(
            server.url + "/mq/message",
            params={"topic": "pg", "consumer": "pg-c"},
            headers={"Authorization": f"Bearer {ctoken}"},
        )
        assert [m["message"] for m in r.json()["result"]["msgList"]] == ["stored"]
    finally:
        server.stop()
