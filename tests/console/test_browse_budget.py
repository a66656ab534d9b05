"""The message browser is bounded as the API's reads are (issue 27): its rows stop at
`max_answer_bytes` of bodies over every queue together, and the table shows each body's first
PREVIEW_CHARS. 500 rows of 1 MiB bodies in the hex view were a 900 MiB page (3 GB of RSS)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mqgate.console.pages.messages import PREVIEW_CHARS
from tests.console.conftest import ConsoleServer, sign_in

BUDGET = 256 * 1024
BODY = 100 * 1024
QUEUES = 8


@pytest.fixture(scope="module")
def small_budget(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(
        tmp_path_factory.mktemp("budget") / "data", env={"MQGATE_MAX_ANSWER_BYTES": str(BUDGET)}
    )
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    srv.admin("POST", "/admin/topics", name="big", queues=QUEUES)
    token = srv.admin("POST", "/admin/producers", name="big-p", topic="big")["token"]
    for i in range(3 * QUEUES):  # round robin: three 100 KiB bodies in every queue
        body = {"n": i, "pad": "x" * BODY}
        r = httpx.post(srv.url + "/mq/produce", json={"producer": "big-p", "message": json.dumps(body)},
                       headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
    yield srv
    srv.stop()


@pytest.mark.parametrize("view", ["hex", "json", "text"])
def test_a_browse_over_every_queue_stays_within_the_budget(small_budget: ConsoleServer, view: str) -> None:
    admin = sign_in(small_budget, "admin")
    r = admin.get("/console/messages", params={"topic": "big", "count": "500", "as": view})
    assert r.status_code == 200
    rows = r.text.count("<tr data-offset=")
    assert rows == BUDGET // (BODY + 200)  # as many whole bodies as the budget holds: 2
    assert 'id="budget-note"' in r.text and "more bytes (export for all of it)" in r.text
    # each row shows at most PREVIEW_CHARS of its body (hex: 3 characters a byte)
    assert len(r.content) < 40_000 + rows * 4 * PREVIEW_CHARS, len(r.content)


def test_an_export_holds_whole_bodies_within_the_budget(small_budget: ConsoleServer) -> None:
    admin = sign_in(small_budget, "admin")
    r = admin.get("/console/messages", params={"topic": "big", "count": "500", "format": "json"})
    assert r.status_code == 200
    rows = r.json()
    assert len(rows) == 2 and all(len(json.loads(row["body"])["pad"]) == BODY for row in rows)
    assert len(r.content) <= BUDGET + 10_000


def test_one_queue_at_a_time_reaches_the_rest(small_budget: ConsoleServer, tmp_path: Path) -> None:
    admin = sign_in(small_budget, "admin")
    r = admin.get("/console/messages", params={"topic": "big", "queue": "5", "count": "500"})
    assert r.text.count('<tr data-offset="') == 2 and 'data-queue="5"' in r.text
