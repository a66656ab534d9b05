"""The CLI's lists are whole although the gateway answers them in pages (issue 27): against a
gateway whose answer budget holds a few items a page, `mqgate topic list`, `producer list`,
`project list`, `trace policies`, `cluster list`, `consumer progress` and `alerts` follow each
answer's `next` and show every item once, as the pages read one by one give them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cli.test_cli_admin import cli
from tests.conftest import Server

BUDGET = 600
TOPICS = [f"cli-{i:02}" for i in range(14)]
PROJECTS = [f"proj-{i:02}" for i in range(12)]
CLIENTS = [f"host-{i}" for i in range(8)]


def pages(srv: Server, path: str, field: str) -> tuple[int, list[Any]]:
    """(how many pages, every item) of a list read over HTTP, following `next`."""
    items: list[Any] = []
    count = 0
    cursor = None
    while True:
        r = httpx.get(
            srv.url + path,
            params={"cursor": cursor} if cursor else {},
            headers={"Authorization": f"Bearer {srv.admin_token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        items += result[field]
        count += 1
        cursor = result.get("next")
        if cursor is None:
            return count, items


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("cli-pages")
    s = Server(root / "data", env={"MQGATE_MAX_ANSWER_BYTES": str(BUDGET)}).start()
    try:
        for name in PROJECTS:
            s.admin("POST", "/admin/projects", name=name)
            s.admin("POST", "/admin/trace-policies", mode="project", project=name)
        for topic in TOPICS:
            ptoken = s.setup_topic(topic, queues=2)[0]
            s.admin("POST", f"/admin/consumers/{topic}-c/alert", backlog=1)
            for body in ("a", "b"):
                r = httpx.post(
                    s.url + "/mq/produce",
                    json={"producer": f"{topic}-p", "message": body},
                    headers={"Authorization": f"Bearer {ptoken}"},
                )
                assert r.status_code == 200, r.text
        ctoken = s.admin("POST", "/admin/consumers", name="bc", topic=TOPICS[0], mode="broadcast")["token"]
        for client in CLIENTS:
            r = httpx.get(
                s.url + "/mq/message",
                params={"topic": TOPICS[0], "consumer": "bc", "clientId": client},
                headers={"Authorization": f"Bearer {ctoken}"},
            )
            assert r.status_code == 200, r.text
        for i in range(5):
            s.admin("POST", "/admin/clusters", name=f"store-{i}", url=f"embedded:{root / f'store-{i}'}")
        yield s
    finally:
        s.stop()


COMMANDS = [
    (("topic", "list"), "/admin/topics", "topics"),
    (("producer", "list"), "/admin/producers", "producers"),
    (("project", "list"), "/admin/projects", "projects"),
    (("trace", "policies"), "/admin/trace-policies", "policies"),
    (("cluster", "list"), "/admin/clusters", "clusters"),
    (("consumer", "progress", "bc"), "/admin/consumers/bc/progress", "queues"),
    (("alerts",), "/admin/alerts", "active"),
]


@pytest.mark.parametrize(("command", "path", "field"), COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_a_list_command_shows_every_page(
    srv: Server, command: tuple[str, ...], path: str, field: str
) -> None:
    count, items = pages(srv, path, field)
    assert count > 1, f"{path} fits one answer: the test needs pages"
    done = cli(srv, "--json", *command)
    assert done.returncode == (3 if command == ("alerts",) else 0), done.stderr
    shown = json.loads(done.stdout)
    assert "next" not in shown
    if field == "active":  # the alerts' check time moves between reads: compare what is alerting
        assert [a["key"] for a in shown["active"]] == [a["key"] for a in items]
        assert sorted(a["consumer"] for a in shown["alerts"]) == sorted(f"{t}-c" for t in TOPICS)
    elif field == "queues":  # offsets and lock ages move too: compare which rows
        assert [(q["clientId"], q["source"], q["queue"]) for q in shown["queues"]] == [
            (q["clientId"], q["source"], q["queue"]) for q in items
        ]
        assert {q["clientId"] for q in shown["queues"]} == set(CLIENTS)
    elif field == "clusters":  # probes move their figures
        assert [c["name"] for c in shown["clusters"]] == [c["name"] for c in items]
    else:
        assert shown[field] == items


def test_the_text_of_a_list_has_every_item(srv: Server) -> None:
    assert pages(srv, "/admin/topics", "topics")[0] > 1 and pages(srv, "/admin/projects", "projects")[0] > 1
    text = cli(srv, "topic", "list")
    assert text.returncode == 0, text.stderr
    names = {line.split()[0] for line in text.stdout.splitlines()[1:]}
    assert set(TOPICS) <= names
    text = cli(srv, "project", "list")
    assert {line.split()[0] for line in text.stdout.splitlines()[1:]} == {"default", *PROJECTS}
