"""A project's health answers its findings in pages (issue 27, "bounded everywhere": a project
with thousands of faulty queues answered every finding at once). On a real gateway whose
queue-state history holds 120 full queues of one project: `findingCount` counts them on every
page, the pages follow each other to every finding once, in the diagnosis's order, and the
verdict is the same on each. The console's health part pages them as well, its links keeping
the project page's own arguments."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.rows import QueueInterval, Rollup
from tests.console.conftest import ADMIN_TOKEN, ConsoleServer, sign_in

TOPICS = [f"t{i:02d}" for i in range(15)]
QUEUES = 8
STEP = 60_000


def full_queue(topic: str, queue: int, start: int) -> QueueInterval:
    """A closed interval of a queue at its length limit, with messages dropped."""
    return QueueInterval(
        project="p", topic=topic, queue=queue, start_ms=start, interval_ms=STEP, max_length=100,
        length_area=100 * STEP, covered_ms=STEP, samples=12, length_limit=100, dropped=3,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(tmp_path_factory.mktemp("health") / "data")
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    try:
        srv.admin("POST", "/admin/projects", name="p")
        for t in TOPICS:
            srv.admin("POST", "/admin/topics", name=t, queues=QUEUES, project="p")
        start = (int(time.time() * 1000) // STEP - 2) * STEP  # closed, inside the 5-minute window
        full = [full_queue(t, q, start) for t in TOPICS for q in range(QUEUES)]
        history = QueueStateHistory(Path(srv.data_dir).resolve() / "queue-state.sqlite")
        history.write(Rollup(queues=full))
        history.dispose()
        yield srv
    finally:
        srv.stop()


def health(srv: ConsoleServer, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.get(srv.url + "/admin/projects/p/health", params=params, headers=headers, timeout=30)


def test_the_findings_come_in_pages_that_reach_each_once(server: ConsoleServer) -> None:
    whole = health(server, limit=10_000).json()["result"]
    assert whole["verdict"] == "queue_fault" and whole["findingCount"] == len(TOPICS) * QUEUES
    assert "next" not in whole
    every = [(f["topic"], f["queue"]) for f in whole["findings"]]
    assert every == [(t, q) for t in TOPICS for q in range(QUEUES)]
    seen: list[tuple[str, int]] = []
    cursor = None
    pages = 0
    while True:
        r = health(server, limit=7, **({} if cursor is None else {"cursor": cursor}))
        assert r.status_code == 200, r.text
        page = r.json()["result"]
        assert len(page["findings"]) <= 7 and page["findingCount"] == 120 and page["verdict"] == "queue_fault"
        seen += [(f["topic"], f["queue"]) for f in page["findings"]]
        pages += 1
        cursor = page.get("next")
        if cursor is None:
            break
    assert seen == every and pages == 18
    r = health(server, cursor="garbage")
    assert (r.status_code, r.json()["result"]["field"]) == (400, "cursor")


def test_the_console_pages_the_findings_keeping_the_page_arguments(server: ConsoleServer) -> None:
    client = sign_in(server, "admin")
    page = client.get("/console/projects/p", params={"hours": "2"})
    assert 'data-live-src="/console/live/projects/p/health?hours=2"' in page.text
    first = client.get("/console/live/projects/p/health", params={"hours": "2"})
    assert first.text.count('<tr data-rule="queue_full">') == 100
    assert "Findings 1–100 of 120 (page 1 of 2)" in first.text
    assert 'href="?hours=2&amp;findings_page=2" rel="next"' in first.text
    second = client.get("/console/live/projects/p/health", params={"hours": "2", "findings_page": "2"})
    assert second.text.count('<tr data-rule="queue_full">') == 20
    crowded = client.get("/console/live/projects/p/health", params={"hours": "2", "findings_page": "x"})
    assert crowded.status_code == 400 and "findings_page" in crowded.text
