"""Live figures and the tail in a real browser (Debian's Chromium, headless) against a real
gateway: the overview and a consumer's page change after a produce without a reload, an alert
appears and goes, and a tail shows a newly produced message without consuming it. The time
the overview takes to show a produce is measured and kept in artifacts/live-timing.json."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.console.conftest import ARTIFACTS, ConsoleServer, open_page, shot, sign_in
from tests.console.test_browser import produce
from tests.console.test_browser import sign_in as browser_sign_in

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(
        tmp_path_factory.mktemp("live") / "data", env={"MQGATE_ALERT_CHECK_INTERVAL_S": "0.5"}
    )
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def page(browser: Any, live: ConsoleServer) -> Iterator[Any]:
    yield from open_page(browser, live)


def setup(server: ConsoleServer, topic: str) -> tuple[str, str]:
    server.admin("POST", "/admin/topics", name=topic, queues=2)
    ptoken = server.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = server.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic, start="earliest")[
        "token"
    ]
    return ptoken, ctoken


def mark_page(page: Any) -> None:
    """A mark a reload would wipe out."""
    page.evaluate("window.__notReloaded = true")


def not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("window.__notReloaded === true"))


def test_overview_shows_a_produce_and_an_alert_without_a_reload(page: Any, live: ConsoleServer) -> None:
    ptoken, _ = setup(live, "live")
    live.admin("POST", "/admin/consumers/live-c/alert", backlog=4)
    browser_sign_in(page, "admin")
    page.wait_for_url("**/console/")
    lag = page.locator('td[data-lag="live-c"]')
    assert lag.inner_text() == "0"
    assert page.locator("#alerts").inner_text() == "No active alerts."
    mark_page(page)
    seen_after: list[float] = []
    for expected in (1, 2, 3, 4, 5):
        produce(live, ptoken, "live-p", message=f"m{expected}")
        started = time.monotonic()
        expect(lag).to_have_text(str(expected), timeout=15_000)
        seen_after.append(time.monotonic() - started)
    assert not_reloaded(page)
    alert = page.locator('#alerts li[data-alert="lag:live-c"]')
    alert.wait_for(timeout=15_000)  # lag 5 over 4, checked every 0.5 s
    assert "backlog 5 over 4" in alert.inner_text()
    assert "updated" in page.locator('[data-live-stamp="overview-live"]').inner_text()
    shot(page, "overview-live-alert")
    timing = {
        "what": "seconds from a produce's answer to the overview showing the new lag (polled every 2 s)",
        "samples": [round(s, 3) for s in seen_after],
        "median": round(statistics.median(seen_after), 3),
        "max": round(max(seen_after), 3),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "live-timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    print("overview shows a produce after", timing)
    assert max(seen_after) < 5.0  # one poll (2 s) and its answer, with room for a loaded machine

    live.admin("POST", "/admin/consumers/live-c/reset", to="latest")  # the backlog goes: so does the alert
    expect(page.locator("#alerts")).to_have_text("No active alerts.", timeout=15_000)
    assert lag.inner_text() == "0" and not_reloaded(page)


def test_consumer_page_follows_its_lag(page: Any, live: ConsoleServer) -> None:
    ptoken, _ = setup(live, "follow")
    browser_sign_in(page, "admin")
    page.wait_for_url("**/console/")
    page.goto("/console/consumers/follow-c")
    assert page.locator("#total-lag").inner_text() == "0"
    mark_page(page)
    for i in range(3):
        produce(live, ptoken, "follow-p", message=f"x{i}")
    expect(page.locator("#total-lag")).to_have_text("3", timeout=15_000)
    rows = page.locator("#progress tbody tr")
    assert sum(int(rows.nth(i).locator("td").nth(7).inner_text()) for i in range(rows.count())) == 3
    assert not_reloaded(page)


def test_tail_shows_new_messages_without_consuming(page: Any, live: ConsoleServer) -> None:
    ptoken, _ = setup(live, "tailed")
    produce(live, ptoken, "tailed-p", message="before the page")
    browser_sign_in(page, "admin")
    page.wait_for_url("**/console/")
    page.goto("/console/messages?topic=tailed&as=text")
    assert page.locator("#messages tbody tr[data-offset]").count() == 1
    mark_page(page)
    page.get_by_role("button", name="Follow new messages").click()
    assert page.get_by_role("button", name="Stop following").get_attribute("aria-pressed") == "true"
    started = time.monotonic()
    produce(live, ptoken, "tailed-p", message="fresh off the press", keys=["k-new"])
    fresh = page.locator("#messages tbody tr[data-offset]", has_text="fresh off the press")
    fresh.wait_for(timeout=15_000)
    tail_s = time.monotonic() - started
    assert "k-new" in fresh.inner_text()
    for i in range(3):
        produce(live, ptoken, "tailed-p", message=f"more {i}")
    page.locator("#messages tbody tr[data-offset]", has_text="more 2").wait_for(timeout=15_000)
    assert page.locator("#messages tbody tr[data-offset]").count() == 5  # each shown once
    assert "following: 4 new" in page.locator("#tail-status").inner_text()
    assert not_reloaded(page)
    shot(page, "tail")
    page.get_by_role("button", name="Stop following").click()
    assert live.admin("GET", "/admin/consumers/tailed-c/progress")["lag"] == 5  # nothing consumed
    print(f"the tail showed a produce after {tail_s:.3f} s")


def test_fragments_need_a_session_and_answer_304_when_unchanged(live: ConsoleServer) -> None:
    setup(live, "frag")
    anonymous = httpx.get(live.url + "/console/live/overview", timeout=10, follow_redirects=False)
    assert anonymous.status_code == 403  # not a redirect to the sign-in page: the script stops
    client = sign_in(live, "admin")
    first = client.get("/console/live/overview")
    assert first.status_code == 200 and "Active alerts" in first.text and "<html" not in first.text
    tag = first.headers["etag"]
    assert float(first.headers["server-timing"].split("dur=")[1]) > 0
    # The overview may change between two reads (a rate sampled meanwhile, on a busy machine):
    # then it is answered anew under another tag, and a read of that one is a 304.
    for _ in range(10):
        again = client.get("/console/live/overview", headers={"If-None-Match": tag})
        if again.status_code != 200:
            break
        assert again.headers["etag"] != tag and "Active alerts" in again.text
        tag = again.headers["etag"]
    assert again.status_code == 304 and again.content == b""
    bad = client.get("/console/live/tail", params={"topic": "frag", "from": "zero"})
    assert bad.status_code == 400 and "from" in bad.text
    tail = client.get("/console/live/tail", params={"topic": "frag"}).json()
    assert tail["count"] == 0 and [p.split(":")[0] for p in tail["next"].split(",")] == ["0", "1"]
