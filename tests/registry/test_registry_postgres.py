"""The registry on the machine's PostgreSQL: the SQL layer directly, and a gateway using it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from mqgate.errors import AlreadyExists, NotFound
from mqgate.registry.records import ConsumerRecord, TopicRecord
from mqgate.registry.sql import SqlRegistry
from tests.conftest import Server


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
    server = Server(tmp_path / "data", extra_args=["--registry", pg_url]).start()
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
        extra_args=["--registry", pg_url],
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


def test_a_registry_made_by_an_older_version_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE mqgate_topics (name VARCHAR(160) PRIMARY KEY, queues INTEGER NOT NULL, "
                "retention_ms BIGINT NOT NULL, retention_bytes BIGINT, created_ms BIGINT NOT NULL)"
            )
        )
        conn.execute(sa.text("INSERT INTO mqgate_topics VALUES ('old', 4, 1000, NULL, 1)"))
    engine.dispose()
    reg = SqlRegistry(url)
    reg.create_schema()
    reg.add_topic(TopicRecord("new", 2, 1000, None, 2, max_priority=3))
    snap = reg.snapshot()
    assert snap.topics["old"].max_priority == 0 and snap.topics["new"].max_priority == 3
    reg.dispose()
