"""The queue fault timeline's `GatewaySource` reads a project's whole queue state and every
project although the gateway answers both in pages (issue 27): against a gateway whose answer
budget holds a few intervals, its window has every interval the history holds, once, and its
project list every project."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mqgate.analytics.queuestate_source import GatewaySource
from mqgate.client import Client
from tests.api.test_project_queues_paging import BASE, BUDGET, PROJECT, STEP, seed, wire
from tests.conftest import Server

OTHERS = [f"side-{i:02}" for i in range(60)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[Any]]]:
    data = tmp_path_factory.mktemp("source") / "data"
    data.mkdir()
    intervals = seed(data / "queue-state.sqlite")
    srv = Server(data, env={"MQGATE_MAX_ANSWER_BYTES": str(BUDGET)}).start()
    try:
        for name in [PROJECT, *OTHERS]:
            srv.admin("POST", "/admin/projects", name=name)
        yield srv, intervals
    finally:
        srv.stop()


def first_page(srv: Server, path: str, **params: Any) -> dict[str, Any]:
    r = httpx.get(
        srv.url + path, params=params, headers={"Authorization": f"Bearer {srv.admin_token}"}, timeout=30
    )
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def test_the_gateway_source_follows_the_pages(gateway: tuple[Server, list[Any]]) -> None:
    srv, intervals = gateway
    assert "next" in first_page(srv, f"/admin/projects/{PROJECT}/queues")  # it takes pages
    assert "next" in first_page(srv, "/admin/projects")
    with Client(srv.url, srv.admin_token) as client:
        source = GatewaySource(client)
        assert source.projects() == sorted(["default", PROJECT, *OTHERS])
        window = source.window(PROJECT, None, None)
        assert [
            (q.topic, q.queue, q.start_ms, q.interval_ms, q.max_length, q.dropped) for q in window.queues
        ] == [(i.topic, i.queue, i.start_ms, i.interval_ms, i.max_length, i.dropped) for i in intervals]
        assert [q.avg_length for q in window.queues] == [wire(i)[5] for i in intervals]
        since, until = BASE + 20 * STEP, BASE + 70 * STEP
        part = source.window(PROJECT, since, until)
        assert [(q.topic, q.queue, q.start_ms) for q in part.queues] == [
            (i.topic, i.queue, i.start_ms) for i in intervals if since <= i.start_ms < until
        ]
