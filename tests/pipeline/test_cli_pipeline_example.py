"""The pipeline example's setup (examples/pipeline/setup.py, docs/PIPELINE.md): it creates the
sink database, the event topics and sample events that the example's config parses, and runs
again without harm. Spark is not needed for this; tests/pipeline runs the pipeline itself."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from msgspec.structs import replace

from mqgate.pipeline.config import load_config
from mqgate.pipeline.parsing import SourceMessage, parse_message
from tests.conftest import PG_ADMIN_URL, ROOT, Server, require_service

EXAMPLE = ROOT / "examples" / "pipeline" / "video-events.toml"


@pytest.fixture
def database() -> Iterator[str]:
    """The name of a database that does not exist yet; dropped afterwards if it was created."""
    require_service("127.0.0.1", 5432, "PostgreSQL")
    import psycopg

    name = f"mqgate_example_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_setup_creates_database_topics_and_sample_events(
    shared_server: Server, database: str, tmp_path: Path
) -> None:
    text = EXAMPLE.read_text()
    config_path = tmp_path / "video-events.toml"
    config_path.write_text(
        text.replace('gateway = "http://127.0.0.1:8080"', f'gateway = "{shared_server.url}"').replace(
            "127.0.0.1:5432/mqgate_pipeline", f"127.0.0.1:5432/{database}"
        )
    )
    env = {**os.environ, "MQGATE_ADMIN_TOKEN": shared_server.admin_token}
    outputs = []
    for _ in range(2):
        out = subprocess.run(
            [
                sys.executable,
                "examples/pipeline/setup.py",
                str(config_path),
                "--likes",
                "300",
                "--comments",
                "50",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr + out.stdout
        outputs.append(out.stdout.splitlines())
    assert outputs[0][:3] == [
        f"database {database} created",
        "topic video-likes created",
        "300 sample like messages produced to video-likes",
    ]
    assert outputs[1][:2] == [f"database {database} exists", "topic video-likes exists"]
    assert "50 sample comment messages produced to video-comments" in outputs[1]

    config = load_config(config_path, env)
    headers = {"Authorization": f"Bearer {shared_server.admin_token}"}
    for et in config.events:
        bounds = httpx.get(
            shared_server.url + "/mq/bounds", params={"topic": et.topic}, headers=headers
        ).json()
        queues = bounds["result"]["queues"]
        assert sum(q["max"] - q["min"] for q in queues) == (600 if et.format == "json" else 100)
        # What was produced is what the example's parsers take: no parse failure, every key set.
        read = httpx.get(
            shared_server.url + "/mq/read",
            params={"topic": et.topic, "queue": queues[0]["queue"], "offset": 0, "max": 100},
            headers=headers,
        ).json()["result"]
        assert read["msgList"]
        for m in read["msgList"]:
            message = SourceMessage(m["messageId"], m["message"], et.topic, m["queue"], m["offset"])
            events, failures = parse_message(et, message)
            assert events and not failures and all(e.key.startswith("v") for e in events), (m, failures)
            assert all(None not in e.fields.values() for e in events)


def test_the_example_creates_no_table_of_the_tests_in_its_database(pg_url: str) -> None:
    """Only the pipeline's own tables and the example's event tables; the failure-injection
    table only for a config that injects failures (the tests' and benchmarks')."""
    import psycopg

    from mqgate.pipeline.schema import create_tables

    url = pg_url.replace("postgresql+psycopg://", "postgresql://")
    config = load_config(EXAMPLE, {"MQGATE_ADMIN_TOKEN": "t"})
    with psycopg.connect(url, autocommit=True) as conn:
        create_tables(conn, config)
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        own = {"ledger", "dead_letters", "retries", "hot_keys", "pending", "flushes"}
        assert tables == {"video_likes", "video_comments"} | {f"mqgate_pipeline_{t}" for t in own}
        injecting = replace(config, sink=replace(config.sink, fail_keys=("k",)))
        create_tables(conn, injecting)
        assert conn.execute("SELECT to_regclass('mqgate_pipeline_fault_probe')").fetchone() == (
            "mqgate_pipeline_fault_probe",
        )
