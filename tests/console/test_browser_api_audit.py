"""The admin API's changes in the console's audit log (`mqgate.console.api_audit`), seen in a
real browser: who (the admin token and its caller's address), what, before → after, and no
token in any entry."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from mqgate.console.api_audit import clean
from tests.console.conftest import ConsoleServer, shot
from tests.console.test_browser import sign_in


@pytest.fixture
def page(browser: Any, console: ConsoleServer) -> Iterator[Any]:
    context = browser.new_context(base_url=console.url, viewport={"width": 1280, "height": 900})
    p = context.new_page()
    yield p
    context.close()


def test_api_changes_land_in_the_audit_log(page: Any, console: ConsoleServer) -> None:
    console.admin("POST", "/admin/projects", name="ops", description="operations")
    console.admin("POST", "/admin/topics", name="ops-jobs", queues=2, project="ops")
    console.admin("PATCH", "/admin/topics/ops-jobs", queues=3)
    token = console.admin("POST", "/admin/producers", name="ops-p", topic="ops-jobs")["token"]
    ctoken = console.admin("POST", "/admin/consumers", name="ops-c", topic="ops-jobs")["token"]
    console.admin("POST", "/admin/consumers/ops-c/pause")
    console.admin("POST", "/admin/consumers/ops-c/rate-limit", messagesPerSecond=5)
    console.admin("POST", "/admin/consumers/ops-c/reset", to="earliest")
    new_token = console.admin("POST", "/admin/producers/ops-p/token")["token"]
    policy = console.admin("POST", "/admin/trace-policies", mode="route", topic="ops-jobs")["id"]
    console.admin("DELETE", f"/admin/trace-policies/{policy}")
    console.admin("DELETE", "/admin/producers/ops-p")

    sign_in(page, "admin")
    page.goto("/console/audit?project=ops")
    rows = page.locator("#audit tbody tr")
    entries = [r.locator("td").all_inner_texts() for r in rows.all()]
    actions = [e[3] for e in entries]
    for wanted in ["project.create", "topic.create", "topic.change", "producer.register", "consumer.register",
                   "consumer.pause", "consumer.rate-limit", "consumer.reset", "producer.token.rotate",
                   "trace_policy.add", "trace_policy.delete", "producer.delete"]:  # fmt: skip
        assert wanted in actions, (wanted, actions)
    assert all(e[1] == "admin-token@127.0.0.1" and e[2] == "api" for e in entries)
    pause = entries[actions.index("consumer.pause")]
    assert pause[4] == "ops-c" and pause[5] == "ops"
    assert re.search(r'"paused": ?false.*→.*"paused": ?true', pause[6], re.S)  # before → after
    grow = entries[actions.index("topic.change")][6]
    assert re.search(r'"queues": ?2.*→.*"queues": ?3', grow, re.S)
    text = page.locator("#audit").inner_text()
    assert token not in text and new_token not in text and ctoken not in text
    shot(page, "audit-api")

    page.goto("/console/audit?action=project.create&target=ops")
    assert page.locator("#audit td.action").all_inner_texts() == ["project.create"]


def test_entries_keep_no_secrets_and_cut_long_lists() -> None:
    kept = clean(
        {"name": "c", "token": "mqc_x", "token_hash": "h", "requestId": "r", "list": list(range(60))}
    )
    assert kept["token"] == "(hidden)" and kept["requestId"] == "(hidden)" and "token_hash" not in kept
    assert len(kept["list"]) == 51 and kept["list"][-1] == "… 10 more"
