"""The topic and queue pages in a real browser (Debian's Chromium, headless) against a real
gateway: reached from the topics list, charts drawn, a message's trace one click away, usable
from the keyboard, and at 390 px wide tables that scroll in their own box while the page does
not. Screenshots go to artifacts/ and, as the docs show them, to docs/images/."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.console.conftest import ConsoleServer, docs_shot, docs_shots, open_page
from tests.console.test_browser import produce, sign_in

pytestmark = pytest.mark.slow

TOPIC = "browse-topic"
NARROW = 390
CHARTS = ("produce", "consume", "lag", "deadletters")


@pytest.fixture(scope="module")
def topical(console: ConsoleServer) -> ConsoleServer:
    """A topic of 4 queues with messages, two consumers, and a batch held (a lock)."""
    console.admin("POST", "/admin/topics", name=TOPIC, queues=4)
    token = console.admin("POST", "/admin/producers", name="browse-p", topic=TOPIC)["token"]
    ctoken = console.admin("POST", "/admin/consumers", name="browse-c", topic=TOPIC, start="earliest")[
        "token"
    ]
    console.admin(
        "POST", "/admin/consumers", name="browse-audit-with-a-long-name", topic=TOPIC, start="earliest"
    )
    for i in range(30):
        produce(
            console, token, "browse-p", message=f'{{"order": {i}, "note": "{"n" * 40}"}}', keys=[f"k{i % 7}"]
        )
    r = httpx.get(console.url + "/mq/message", params={"topic": TOPIC, "consumer": "browse-c", "max": 3},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
    assert r.status_code == 200 and r.json()["result"]["msgList"], r.text
    return console


@pytest.fixture
def wide(browser: Any, topical: ConsoleServer) -> Iterator[Any]:
    yield from open_page(browser, topical, 1366, 20_000)


@pytest.fixture
def narrow(browser: Any, topical: ConsoleServer) -> Iterator[Any]:
    yield from open_page(browser, topical, NARROW, 20_000)


def failed_responses(page: Any) -> list[str]:
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return failed


def test_the_topic_page_from_the_list_with_charts_and_a_trace_link(wide: Any) -> None:
    failed = failed_responses(wide)
    sign_in(wide, "admin")
    wide.wait_for_url("**/console/")
    wide.goto(f"/console/topics?q={TOPIC}")
    wide.get_by_role("link", name=TOPIC, exact=True).click()
    wide.wait_for_url(f"**/console/topics/{TOPIC}")
    expect(wide.get_by_role("heading", name=f"Topic {TOPIC}", level=1)).to_be_visible()
    for key in CHARTS:
        expect(wide.locator(f"#chart-{key} .uplot canvas")).to_be_visible()
    assert wide.locator("#total-messages").inner_text() == "30"
    assert wide.locator("#queues tbody tr").count() == 4
    assert wide.get_by_role("table", name=f"Consumers of {TOPIC}: lag and locks on its queues").is_visible()
    lock = wide.locator('tr[data-consumer="browse-c"] .lock')
    expect(lock).to_contain_text("expires in")
    docs_shot(wide, "console-topic-1366")
    first = wide.locator("#last-messages tbody tr").first.get_by_role("link")
    msg_id = first.inner_text()
    first.click()
    wide.wait_for_url("**/console/traces?by=msgId*")
    assert wide.locator("#tr-value").input_value() == msg_id
    assert not failed, failed


def test_the_topic_page_by_keyboard_then_the_queue_page(wide: Any) -> None:
    sign_in(wide, "admin")
    wide.wait_for_url("**/console/")
    wide.goto(f"/console/topics/{TOPIC}")
    # A consumer's per-queue figures open from the keyboard.
    summary = wide.locator('tr[data-consumer="browse-c"] details summary')
    summary.focus()
    wide.keyboard.press("Enter")
    expect(wide.get_by_role("table", name="browse-c per queue")).to_be_visible()
    # The tables' scrolling boxes take the focus (to scroll them by keyboard); links follow.
    wrap = wide.get_by_role("region", name=f"Queues of {TOPIC}")
    wrap.focus()
    assert wide.evaluate("document.activeElement.classList.contains('table-wrap')")
    wide.keyboard.press("Tab")
    assert wide.evaluate("document.activeElement.textContent") == "Queue 0"
    wide.keyboard.press("Enter")
    wide.wait_for_url(f"**/console/topics/{TOPIC}/queues/0")
    expect(wide.get_by_role("heading", name=f"Queue 0 of topic {TOPIC}", level=1)).to_be_visible()
    expect(wide.locator("#chart-length .uplot canvas")).to_be_visible()
    assert wide.locator("#queue-consumers tbody tr").count() == 2
    assert wide.get_by_role(
        "table", name="Each consumer's committed offset, lag and lock on queue 0"
    ).is_visible()
    docs_shots(wide, "console-queue")


def test_at_390_px_the_tables_scroll_in_their_box_and_the_links_are_reachable(narrow: Any) -> None:
    failed = failed_responses(narrow)
    sign_in(narrow, "admin")
    narrow.wait_for_url("**/console/")
    narrow.goto(f"/console/topics/{TOPIC}")
    expect(narrow.locator("#chart-produce .uplot canvas")).to_be_visible()
    assert narrow.evaluate("document.documentElement.scrollWidth") <= NARROW  # nothing off to the side
    box = narrow.locator("#consumers").locator("xpath=..")
    assert box.evaluate("el => el.scrollWidth > el.clientWidth")  # the table scrolls inside
    for link in (
        narrow.get_by_role("link", name="Queue 3"),
        narrow.get_by_role("link", name="browse-c").first,
    ):
        link.scroll_into_view_if_needed()
        found = link.bounding_box()
        assert found is not None and found["x"] >= 0 and found["x"] + found["width"] <= NARROW, found
    canvas = narrow.locator("#chart-lag .uplot canvas").bounding_box()
    assert canvas is not None and canvas["x"] + canvas["width"] <= NARROW
    docs_shot(narrow, "console-topic-390")
    narrow.get_by_role("link", name="Queue 3").click()
    narrow.wait_for_url(f"**/console/topics/{TOPIC}/queues/3")
    assert narrow.evaluate("document.documentElement.scrollWidth") <= NARROW
    assert not failed, failed
