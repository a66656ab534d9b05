"""Traces, trace policies and projects in a real browser (Debian's Chromium, headless) against
a real gateway: a policy added in the console traces a message, its path is found by id and by
key with the failing hop marked, the policy is deleted; a project's health and queue state
show; projects are made and deleted; who may not change policies cannot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, csrf_of, shot
from tests.console.conftest import sign_in as http_sign_in
from tests.console.test_browser import sign_in

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """The console's gateway, writing queue state every second (not every minute)."""
    srv = ConsoleServer(tmp_path_factory.mktemp("console") / "data")
    srv.env = {"MQGATE_QUEUE_STATE_INTERVAL_S": "1", "MQGATE_QUEUE_STATE_SAMPLE_S": "0.2"}
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    yield srv
    srv.stop()


def test_policy_traces_a_message_found_by_id_with_its_failing_hop(page: Any, console: ConsoleServer) -> None:
    console.admin("POST", "/admin/projects", name="pay", description="payments")
    console.admin("POST", "/admin/topics", name="pay-orders", queues=1, project="pay")
    ptoken = console.admin("POST", "/admin/producers", name="pay-p", topic="pay-orders")["token"]
    ctoken = console.admin("POST", "/admin/consumers", name="pay-c", topic="pay-orders", maxAttempts=1,
                           lockTimeoutS=1, start="earliest")["token"]  # fmt: skip
    sign_in(page, "admin")
    page.goto("/console/traces/policies")
    form = page.locator("#add-policy")
    form.get_by_label("Mode", exact=True).select_option("project")
    form.get_by_label("Project (mode project)").select_option("pay")
    form.get_by_label("Level").select_option("debug")
    page.get_by_role("button", name="Add policy").click()
    assert "added" in page.locator(".note").inner_text()
    [policy] = console.admin("GET", "/admin/trace-policies")["policies"]
    assert (policy["mode"], policy["project"], policy["level"]) == ("project", "pay", "debug")
    assert page.locator(f"#policies tr[data-policy='{policy['id']}']").count() == 1
    shot(page, "trace-policies")

    message = {"producer": "pay-p", "message": "pay 10", "keys": ["inv-7"]}
    r = httpx.post(console.url + "/mq/produce", json=message, headers={"Authorization": f"Bearer {ptoken}"})
    assert r.status_code == 200, r.text
    msg_id = r.json()["result"]["msgId"]
    auth = {"Authorization": f"Bearer {ctoken}"}
    pulled = httpx.get(console.url + "/mq/message", params={"topic": "pay-orders", "consumer": "pay-c"},
                       headers=auth, timeout=30).json()["result"]  # fmt: skip
    assert pulled["status"] == "FOUND", pulled
    released = httpx.post(console.url + "/mq/release", json={"requestId": pulled["requestId"]}, headers=auth)
    assert released.status_code == 200, released.text  # one attempt only: dead-lettered

    def traced() -> bool:  # the index catches up within moments: search again until it has it
        page.goto(f"/console/traces?by=msgId&value={msg_id}")
        done = page.locator("li[data-hop='dead_lettered']").count() == 1
        return done and page.locator("#incomplete").count() == 0

    wait_until(traced, 20, "the dead-lettering to show on the traces page")
    hops = page.locator("ol.timeline li.hop").evaluate_all("els => els.map(e => e.dataset.hop)")
    for earlier, later in [("accepted", "stored"), ("stored", "delivered"), ("delivered", "released"),
                           ("released", "dead_lettered")]:  # fmt: skip
        assert hops.index(earlier) < hops.index(later), hops
    failed = page.locator("li.hop.failed[data-hop='dead_lettered']")
    assert "failed: max_attempts" in failed.inner_text()
    assert "pay-c" in failed.locator("dd.node").inner_text()  # the failing node: the consumer
    delivered = page.locator("li[data-hop='delivered']")
    assert "pay-c" in delivered.locator("dd.consumer").inner_text()
    assert delivered.locator(".latency").inner_text().startswith("+")  # ms since the hop before
    assert "Gateway" in delivered.inner_text() and ":" in delivered.locator("dd").first.inner_text()
    assert page.locator("p[role='alert']").inner_text().startswith("Failed at")
    state = page.locator(".consumer-states tr[data-consumer='pay-c'] td.state")
    assert state.inner_text() == "dead_lettered"
    shot(page, "trace")

    page.goto("/console/traces")
    page.get_by_label("Find by").select_option("key")
    page.get_by_label("Value").fill("inv-7")
    page.get_by_role("button", name="Find").click()
    # The click starts the form's navigation; the assertions wait for the page it loads (a
    # plain count ran against the page before it on a loaded CI machine).
    expect(page.locator(f"section.trace[data-msg-id='{msg_id}']")).to_have_count(1)
    page.get_by_label("Value").fill("no-such-key")
    page.get_by_role("button", name="Find").click()
    expect(page.locator("#no-trace")).to_be_visible()

    page.goto("/console/traces/policies")
    page.get_by_role("button", name=f"Delete policy {policy['id']}").click()
    assert "deleted" in page.locator(".note").inner_text()
    assert console.admin("GET", "/admin/trace-policies")["policies"] == []
    page.goto("/console/audit?action=trace_policy.")
    assert {"trace_policy.add", "trace_policy.delete"} <= set(
        page.locator("#audit td.action").all_inner_texts()
    )


def test_project_health_queue_state_create_and_delete(page: Any, console: ConsoleServer) -> None:
    sign_in(page, "admin")
    page.goto("/console/projects")
    page.get_by_label("Project name").fill("ledger")
    page.get_by_label("Description").fill("the books")
    page.get_by_role("button", name="Create project").click()
    assert "project ledger created" in page.locator(".note").inner_text()
    page.get_by_label("New topic name").fill("ledger-entries")
    page.get_by_role("button", name="Create topic in ledger").click()
    assert "created in project ledger" in page.locator(".note").inner_text()
    assert console.admin("GET", "/admin/projects/ledger")["topics"] == ["ledger-entries"]
    ptoken = console.admin("POST", "/admin/producers", name="ledger-p", topic="ledger-entries")["token"]
    for i in range(5):
        r = httpx.post(console.url + "/mq/produce", json={"producer": "ledger-p", "message": f"entry {i}"},
                       headers={"Authorization": f"Bearer {ptoken}"})  # fmt: skip
        assert r.status_code == 200, r.text

    def recorded() -> bool:  # a queue's state is written once an interval (1 s here) closes
        page.goto("/console/projects/ledger?topic=ledger-entries")
        lengths = page.locator("#queue-state tbody tr td:nth-child(4)").all_inner_texts()
        return any(x.isdigit() and int(x) > 0 for x in lengths)

    wait_until(recorded, 15, "the queue state of ledger-entries on the project page")
    assert set(page.locator("#queue-state tbody tr td:nth-child(2)").all_inner_texts()) == {"ledger-entries"}
    verdict = page.locator("#verdict").inner_text()
    assert verdict == console.admin("GET", "/admin/projects/ledger/health")["verdict"] == "healthy"
    shot(page, "project")
    console.admin("DELETE", "/admin/producers/ledger-p")

    page.goto("/console/projects")
    assert page.locator("#projects tr[data-project='ledger']").count() == 1
    assert page.get_by_role("button", name="Delete project ledger").count() == 0  # it has a topic
    console.admin("DELETE", "/admin/topics/ledger-entries")
    page.goto("/console/projects")
    page.get_by_role("button", name="Delete project ledger").click()
    assert "project ledger deleted" in page.locator(".note").inner_text()
    assert "ledger" not in {p["name"] for p in console.admin("GET", "/admin/projects")["projects"]}
    shot(page, "projects")


def test_a_viewer_may_not_add_or_delete_trace_policies(console: ConsoleServer) -> None:
    console.add_user("vera", "viewer")
    console.add_user("otto", "owner", "default")
    viewer = http_sign_in(console, "vera")
    r = viewer.post("/console/traces/policies", data={"csrf": csrf_of(viewer), "mode": "project",
                                                       "project": "default"})  # fmt: skip
    assert r.status_code == 403, r.text
    owner = http_sign_in(console, "otto")
    csrf = csrf_of(owner)
    r = owner.post("/console/traces/policies", data={"csrf": csrf, "mode": "project", "project": "pay"})
    assert r.status_code == 403 and "owner or admin" in r.text  # not their project
    r = owner.post("/console/traces/policies", data={"csrf": csrf, "mode": "project", "project": "default"})
    assert r.status_code == 303, r.text  # their own project: allowed
    [policy] = [
        p for p in console.admin("GET", "/admin/trace-policies")["policies"] if p["project"] == "default"
    ]
    r = viewer.post(f"/console/traces/policies/{policy['id']}/delete", data={"csrf": csrf_of(viewer)})
    assert r.status_code == 403
    r = owner.post(f"/console/traces/policies/{policy['id']}/delete", data={"csrf": csrf})
    assert r.status_code == 303
    r = owner.post("/console/projects", data={"csrf": csrf, "name": "mine"})
    assert r.status_code == 403  # projects are made by admins
