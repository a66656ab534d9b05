"""One local Spark (local[2]) for every Spark test, and a gateway per module."""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI, Server, store_server

_names = itertools.count()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import mqgate.spark

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if IN_CI:
            pytest.fail("Java is not installed: Spark needs it (required in CI)")
        pytest.skip("SKIPPED LOUDLY: Java is not installed, Spark cannot start")

    s = mqgate.spark.session(
        "mqgate-tests",
        "local[2]",
        {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An embedded-store gateway shared by a module's tests (each uses its own topics)."""
    srv, cleanup = store_server(tmp_path_factory.mktemp("spark") / "data", "embedded")
    srv.start()
    yield srv
    srv.stop()
    cleanup()


@pytest.fixture
def redis_gateway(tmp_path: Path) -> Iterator[Server]:
    """A gateway on the machine's Redis, under a key prefix of its own."""
    srv, cleanup = store_server(tmp_path / "data", "redis")
    srv.start()
    yield srv
    srv.stop()
    cleanup()


def unique(stem: str) -> str:
    return f"{stem}-{next(_names)}-{uuid.uuid4().hex[:6]}"


def produce(server: Server, producer: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Produce with the admin token, 1,000 per call; the receipts in order."""
    receipts: list[dict[str, Any]] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for i in range(0, len(messages), 1000):
            r = http.post(
                "/mq/produce/batch",
                json={"producer": producer, "messages": messages[i : i + 1000]},
                headers={"Authorization": f"Bearer {server.admin_token}"},
            )
            assert r.status_code == 200, r.text
            receipts += r.json()["result"]["receipts"]
    return receipts


def read_all(server: Server, topic: str) -> list[dict[str, Any]]:
    """Every stored message of `topic` through /mq/read: the ground truth."""
    out: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as http:
        bounds = http.get("/mq/bounds", params={"topic": topic}).json()["result"]["queues"]
        for b in bounds:
            offset = b["min"]
            while offset < b["max"]:
                params = {"topic": topic, "queue": b["queue"], "offset": offset, "max": 10_000}
                result = http.get("/mq/read", params=params).json()["result"]
                out += result["msgList"]
                offset = result["next"]
    return out
