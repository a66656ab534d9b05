"""The action pages in headless Chromium: a test message sent with the keyboard and its trace
one click away, a purge confirmed by typing the name at phone width, dead letters filtered and
copied back; every control named for screen readers. Screenshots for docs/images."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until
from tests.console.conftest import PASSWORD, ConsoleServer, docs_shots, open_page
from tests.console.test_browser_keyboard import UNNAMED

pytestmark = pytest.mark.slow


def sign_in(page: Any) -> None:
    page.goto("/console/signin")
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/?$"))


def test_send_purge_and_dead_letters_in_a_browser(browser: Any, console: ConsoleServer) -> None:
    console.admin("POST", "/admin/topics", name="act", queues=2)
    ptoken = console.admin("POST", "/admin/producers", name="act-p", topic="act")["token"]
    ctoken = console.admin("POST", "/admin/consumers", name="act-c", topic="act", start="earliest")["token"]
    for i in range(2):
        late = {"producer": "act-p", "message": f"late {i}", "ttlMs": 1}
        r = httpx.post(console.url + "/mq/produce", json=late, headers={"Authorization": f"Bearer {ptoken}"})
        assert r.status_code == 200, r.text
    time.sleep(0.01)  # the 1 ms validity passes: a deadline in time, not a wait for a process

    def dead() -> bool:
        httpx.get(console.url + "/mq/message", params={"topic": "act", "consumer": "act-c"},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
        return bool(console.admin("GET", "/admin/consumers/act-c/dead-letters")["max"] >= 2)

    wait_until(dead, 15, "2 dead letters")

    gen = open_page(browser, console, width=1366)
    page = next(gen)
    sign_in(page)
    page.goto("/console/topics/act/send")
    assert page.evaluate(UNNAMED) == []
    page.get_by_label("Body").fill('{"order": 7, "total": 20}')
    page.get_by_label("Keys (one a line)").fill("order-7")
    page.get_by_label("Properties (name=value, one a line)").fill("source=console")
    page.get_by_label("Body").focus()
    page.keyboard.press("Tab")  # the keyboard reaches the next field
    page.get_by_role("button", name="Send message").press("Enter")
    page.wait_for_selector("#sent")
    msg_id = page.locator("#sent-id").inner_text()
    docs_shots(page, "console-send")
    page.get_by_role("link", name="Its trace").click()
    page.wait_for_url(re.compile(r"/console/traces\?by=msgId"))
    assert msg_id in page.content()

    page.goto("/console/messages?topic=act&by=key&value=order-7")
    link = page.get_by_role("link", name=f"Trace of message {msg_id}")
    assert link.count() == 1
    body = page.locator("#messages pre.body").first
    lines = body.inner_text().splitlines()
    assert any('"total": 20' in line for line in lines)  # the token is not split across lines

    page.goto("/console/consumers/act-c/dead-letters?reason=expired")
    assert page.evaluate(UNNAMED) == []
    assert page.locator("#dead-letters tbody tr[data-offset]").count() == 2
    docs_shots(page, "console-deadletters")
    page.get_by_label("Copy (they stay waiting)").check()
    page.get_by_role("button", name=re.compile("Preview redrive")).click()
    assert page.locator("#will-copy").inner_text() == "2"
    page.get_by_role("button", name="Copy 2 dead letters").click()
    assert "2 copied back" in page.locator(".note").inner_text()
    next(gen, None)

    gen = open_page(browser, console, width=390)
    page = next(gen)
    sign_in(page)
    page.goto("/console/consumers/act-c/purge")
    assert page.evaluate(UNNAMED) == []
    skipped = page.locator("#purge-skipped").inner_text()
    assert int(skipped) >= 3  # the sent message and the 2 copies in its inbox
    docs_shots(page, "console-purge")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1
    page.get_by_label("Type act-c to confirm").fill("act-c")
    page.get_by_role("button", name=re.compile("Purge")).last.click()
    assert "messages skipped" in page.locator(".note").inner_text()
    assert console.admin("GET", "/admin/consumers/act-c/progress")["lag"] == 0
    next(gen, None)
