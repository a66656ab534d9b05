"""The console's finish in a real browser (Debian's Chromium, headless): at 390 px every topic's
and client's actions are on the screen and work, Grow asks first, no page asks for a file that
is not there (the favicon was a 404 on every page), and the settings page reads well."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, csrf_of, docs_shot, docs_shots, open_page, shot
from tests.console.conftest import sign_in as http_sign_in
from tests.console.test_browser import sign_in

pytestmark = pytest.mark.slow

NARROW = 390


@pytest.fixture
def narrow(browser: Any, console: ConsoleServer) -> Iterator[Any]:
    """A narrow page whose confirmations are not answered for it (the test answers them)."""
    context = browser.new_context(base_url=console.url, viewport={"width": NARROW, "height": 844})
    yield context.new_page()
    context.close()


def inside(page: Any, locator: Any) -> bool:
    box = locator.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= NARROW


def test_topic_actions_are_reachable_at_390_px(narrow: Any, console: ConsoleServer) -> None:
    console.admin("POST", "/admin/topics", name="narrow-topic-with-a-long-name", queues=1)
    missing: list[str] = []
    narrow.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    asked: list[str] = []
    narrow.on("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    sign_in(narrow, "admin")
    narrow.goto("/console/topics?q=narrow-topic")
    row = narrow.locator('tr[data-topic="narrow-topic-with-a-long-name"]')
    grow = row.get_by_role("button", name="Grow narrow-topic-with-a-long-name (irreversible)")
    delete = row.get_by_role("button", name="Delete narrow-topic-with-a-long-name")
    for button in (grow, delete):
        button.scroll_into_view_if_needed()
        assert inside(narrow, button), button
    assert narrow.evaluate("document.documentElement.scrollWidth") <= NARROW  # nothing off to the side
    shot(narrow, "topics-390")
    grow.click()  # dismissed: asked first, nothing grown
    assert asked and "cannot be taken away" in asked[0]
    assert console.admin("GET", "/admin/topics/narrow-topic-with-a-long-name")["queues"] == 1
    assert not missing, missing


def test_settings_page_at_both_widths(browser: Any, console: ConsoleServer) -> None:
    for width in (1366, NARROW):
        for page in open_page(browser, console, width):
            sign_in(page, "admin")
            page.goto("/console/settings")
            table = page.get_by_role("table", name="not at the default")
            assert table.locator("tr[data-setting='admin_token'] .value").inner_text() == "(set, hidden)"
            page.get_by_role("link", name="All").click()
            assert page.locator("tr[data-setting='alert_webhook_url']").count() == 1
            docs_shot(page, f"console-settings-{width}")


# --- the other pages, as docs/CONSOLE.md shows them ------------------------------------------

DOCS_TOPIC = "docs-orders"


def test_the_project_overview_consumer_messages_applications_and_trace_pages_at_both_widths(
    browser: Any, console: ConsoleServer
) -> None:
    """A traced topic with messages, a consumer part way through them and a pending application:
    each page drawn at 1366 and 390 px (docs/images with MQGATE_DOCS_SCREENSHOTS=1), and at 390
    px none is wider than the screen."""
    console.admin("POST", "/admin/projects", name="docs-shop")
    console.admin("POST", "/admin/topics", name=DOCS_TOPIC, queues=4, project="docs-shop")
    console.admin("POST", "/admin/trace-policies", mode="route", topic=DOCS_TOPIC, level="info")
    ptoken = console.admin("POST", "/admin/producers", name="docs-p", topic=DOCS_TOPIC)["token"]
    ctoken = console.admin("POST", "/admin/consumers", name="docs-billing", topic=DOCS_TOPIC,
                           start="earliest")["token"]  # fmt: skip
    console.admin("POST", "/admin/consumers", name="docs-audit", topic=DOCS_TOPIC, start="earliest")
    messages = [{"message": json.dumps({"order": i, "total": 20 + i}), "keys": [f"customer-{i % 5}"]}
                for i in range(40)]  # fmt: skip
    r = httpx.post(console.url + "/mq/produce/batch", json={"producer": "docs-p", "messages": messages},
                   headers={"Authorization": f"Bearer {ptoken}"}, timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text
    auth = {"Authorization": f"Bearer {ctoken}"}
    pulled: list[str] = []
    for _ in range(3):
        query: dict[str, str | int] = {"topic": DOCS_TOPIC, "consumer": "docs-billing", "max": 8}
        got = httpx.get(console.url + "/mq/message", params=query, headers=auth, timeout=10).json()["result"]
        assert got["msgList"], got
        pulled += [m["messageId"] for m in got["msgList"]]
        assert httpx.post(
            console.url + "/mq/ack", json={"requestId": got["requestId"]}, headers=auth
        ).is_success
    msg_id = pulled[0]
    console.add_user("docs-member", "member", "docs-shop")
    applicant = http_sign_in(console, "docs-member")
    form = {"csrf": csrf_of(applicant, "/console/applications"), "kind": "consumer", "name": "docs-reports",
            "topic": DOCS_TOPIC, "mode": "cluster", "start": "earliest"}  # fmt: skip
    assert applicant.post("/console/applications", data=form).status_code == 303

    pages = [
        ("console-overview", "/console/", "Overview"),
        ("console-project", "/console/projects/docs-shop", "Project docs-shop"),
        ("console-consumer", "/console/consumers/docs-billing", "Consumer docs-billing"),
        ("console-messages", f"/console/messages?topic={DOCS_TOPIC}&queue=0", "Messages"),
        ("console-applications", "/console/applications", "Applications"),
        ("console-trace", f"/console/traces?by=msgId&value={msg_id}", "Traces"),
    ]
    for page in open_page(browser, console, 1366, 20_000):
        sign_in(page, "admin")
        page.wait_for_url("**/console/")

        def delivered(page: Any = page) -> bool:
            page.goto(f"/console/traces?by=msgId&value={msg_id}")
            return bool(page.locator("li[data-hop='delivered']").count() >= 1)

        wait_until(delivered, 20, "the traced delivery to be indexed")

        def latency_drawn(page: Any = page) -> bool:
            page.goto("/console/consumers/docs-billing")
            return int(page.locator("#chart-latency-p50").get_attribute("data-points") or 0) > 0

        wait_until(latency_drawn, 20, "a point on docs-billing's latency chart")
        for name, path, heading in pages:
            page.set_viewport_size({"width": 1366, "height": 900})
            page.goto(path)
            expect(page.get_by_role("heading", level=1)).to_have_text(heading)
            page.set_viewport_size({"width": NARROW, "height": 900})
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= NARROW, (path, wide)
            if name == "console-trace":  # the message id wraps in its heading, not cut off
                assert page.locator("section.trace h2").first.evaluate("e => e.scrollWidth <= e.clientWidth")
            docs_shots(page, name)
