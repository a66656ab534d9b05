"""The console in a real browser (Debian's Chromium, headless) against a real gateway: the
operator's and the team's flows end to end. Each test leaves a screenshot in artifacts/."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until
from tests.console.conftest import PASSWORD, ConsoleServer, shot

pytestmark = pytest.mark.slow


def sign_in(page: Any, name: str, password: str = PASSWORD) -> None:
    page.goto("/console/signin")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def produce(console: ConsoleServer, token: str, producer: str, **fields: Any) -> None:
    r = httpx.post(
        console.url + "/mq/produce",
        json={"producer": producer, **fields},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 200, r.text


def test_sign_in_wrong_password_then_right(page: Any, console: ConsoleServer) -> None:
    sign_in(page, "admin", "not-the-password")
    assert page.locator("#signin-error").inner_text() == "Wrong user name or password."
    shot(page, "signin-error")
    sign_in(page, "admin")
    page.wait_for_url("**/console/")
    assert page.get_by_role("heading", name="Overview").is_visible()
    cookie = next(c for c in page.context.cookies() if c["name"] == "mqgate_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    assert page.evaluate("document.cookie").find("mqgate_console=") == -1  # scripts cannot read it
    shot(page, "overview")


def test_topic_consumer_progress_reset_pause_browse_export(page: Any, console: ConsoleServer) -> None:
    sign_in(page, "admin")
    page.goto("/console/topics")
    page.get_by_label("Name").fill("shop")
    page.get_by_label("Queues", exact=True).fill("2")
    page.get_by_role("button", name="Create topic").click()
    assert "topic shop created" in page.locator(".note").inner_text()
    shot(page, "topics")
    page.goto("/console/clients")
    page.locator("#register-consumer").get_by_label("Consumer name").fill("shop-c")
    page.locator("#register-consumer").get_by_label("Start").select_option("earliest")
    page.get_by_role("button", name="Register consumer").click()
    assert page.locator("#token").inner_text().startswith("mqc_")
    page.goto("/console/clients")
    page.locator("#register-producer").get_by_label("Producer name").fill("shop-p")
    page.get_by_role("button", name="Register producer").click()
    ptoken = page.locator("#token").inner_text()
    shot(page, "token-once")
    for i in range(6):
        produce(console, ptoken, "shop-p", message=json.dumps({"order": i}), keys=[f"order-{i}"])

    page.goto("/console/consumers/shop-c")
    assert page.locator("#total-lag").inner_text() == "6"
    shot(page, "consumer")
    page.get_by_label("Reset to").select_option("latest")
    page.get_by_role("button", name="Preview reset").click()
    assert page.locator("#skipped").inner_text() == "6" and page.locator("#replayed").inner_text() == "0"
    shot(page, "reset-confirm")
    page.get_by_role("button", name="Reset offsets").click()
    assert page.locator("#total-lag").inner_text() == "0"
    page.get_by_label("Reset to").select_option("earliest")
    page.get_by_role("button", name="Preview reset").click()
    assert page.locator("#replayed").inner_text() == "6"
    page.get_by_role("link", name="Cancel").click()
    assert page.locator("#total-lag").inner_text() == "0"  # cancelled: nothing moved
    page.locator("#pause-toggle").click()
    assert page.locator("#state").inner_text() == "paused"
    assert console.admin("GET", "/admin/consumers/shop-c/progress")["paused"] is True

    page.goto("/console/messages?topic=shop")
    assert page.locator("#messages tbody tr").count() == 6
    page.get_by_label("Find by").select_option("key")
    page.get_by_label("Value").fill("order-4")
    page.get_by_label("Body as").select_option("hex")
    page.get_by_role("button", name="Browse").click()
    rows = page.locator("#messages tbody tr")
    assert rows.count() == 1
    assert rows.first.locator("pre.body").inner_text().startswith("7b 22 6f 72")  # {"or
    shot(page, "messages")
    with page.expect_download() as download_info:
        page.locator("#export-json").click()
    exported = json.loads(Path(download_info.value.path()).read_text())
    assert [m["keys"] for m in exported] == [["order-4"]] and json.loads(exported[0]["body"]) == {"order": 4}
    progress = console.admin("GET", "/admin/consumers/shop-c/progress")
    assert progress["lag"] == 0  # browsing consumed nothing


def test_redrive_a_dead_letter(page: Any, console: ConsoleServer) -> None:
    console.admin("POST", "/admin/topics", name="mail", queues=1)
    ptoken = console.admin("POST", "/admin/producers", name="mail-p", topic="mail")["token"]
    ctoken = console.admin("POST", "/admin/consumers", name="mail-c", topic="mail", start="earliest")["token"]
    produce(console, ptoken, "mail-p", message="too late", ttlMs=1)
    time.sleep(0.01)  # the 1 ms validity passes: a deadline in time, not a wait for a process

    def dead() -> bool:  # a pull finds it expired and moves it to the dead letters
        httpx.get(console.url + "/mq/message", params={"topic": "mail", "consumer": "mail-c"},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
        return bool(console.admin("GET", "/admin/consumers/mail-c/progress")["deadLettered"])

    wait_until(dead, 10, "the expired message to be dead-lettered")
    sign_in(page, "admin")
    page.goto("/console/consumers/mail-c/dead-letters")
    rows = page.locator("#dead-letters tbody tr[data-offset]")
    assert rows.count() == 1 and "expired" in rows.first.inner_text()
    shot(page, "dead-letters")
    rows.first.get_by_role("checkbox").check()
    page.get_by_role("button", name="Redrive selected").click()
    assert "1 redriven" in page.locator(".note").inner_text()
    assert page.locator("#dead-letters tbody tr[data-offset]").count() == 0
    page.goto("/console/messages?topic=mail")
    assert page.locator("#messages tbody tr").count() == 1  # the copy went to mail-c's inbox alone
    assert console.admin("GET", "/admin/consumers/mail-c/progress")["lag"] == 1


def test_apply_approve_token_once_and_audit(browser: Any, console: ConsoleServer) -> None:
    console.add_user("maya", "member", "default")
    console.admin("POST", "/admin/topics", name="billing", queues=1)
    member = browser.new_context(base_url=console.url).new_page()
    admin = browser.new_context(base_url=console.url).new_page()
    try:
        sign_in(member, "maya")
        member.goto("/console/applications")
        form = member.get_by_role("form", name="For a consumer")  # one form per kind
        assert form.get_by_label("Start").input_value() == "earliest"  # the API's default
        form.get_by_label("Consumer name").fill("billing-c")
        form.get_by_label("Topic").select_option("billing")
        form.get_by_role("button", name="Apply for the consumer").click()
        assert "sent for approval" in member.locator(".note").inner_text()
        assert member.locator("#mine .state").first.inner_text() == "pending"
        assert "billing-c" not in {c["name"] for c in console.admin("GET", "/admin/consumers")["consumers"]}

        sign_in(admin, "admin")
        admin.goto("/console/applications")
        badge = admin.get_by_role("link", name="Applications 1 waiting for your decision")
        assert badge.locator(".badge").inner_text().startswith("1")  # every page shows what waits
        row = admin.locator("#pending tr", has_text="billing-c")
        row.get_by_label("Comment").fill("ok for billing")
        row.get_by_role("button", name="Approve").click()
        assert "approved" in admin.locator(".note").inner_text()
        assert admin.locator("#pending-badge").count() == 0  # nothing waits any more
        shot(admin, "applications")
        assert "billing-c" in {c["name"] for c in console.admin("GET", "/admin/consumers")["consumers"]}

        member.goto("/console/applications")
        assert member.locator("#mine .state").first.inner_text() == "approved"
        member.get_by_role("button", name="Show token (once)").click()
        token = member.locator("#token").inner_text()
        r = httpx.get(console.url + "/mq/message", params={"topic": "billing", "consumer": "billing-c"},
                      headers={"Authorization": f"Bearer {token}"}, timeout=40)  # fmt: skip
        assert r.status_code == 200, r.text  # the token works
        member.goto("/console/applications")
        assert member.get_by_role("button", name="Show token (once)").count() == 0

        admin.goto("/console/audit?action=application.")
        actions = admin.locator("#audit td.action").all_inner_texts()
        assert {"application.consumer", "application.approve"} <= set(actions)
        admin.goto("/console/audit")
        everything = set(admin.locator("#audit td.action").all_inner_texts())
        assert {"topic.create", "consumer.register", "consumer.reset", "consumer.pause",
                "deadletter.redrive", "user.signin", "consumer.token.shown"} <= everything  # fmt: skip
        assert re.search(r'"paused": ?false', admin.locator("#audit").inner_text())  # before → after
        shot(admin, "audit")
    finally:
        member.context.close()
        admin.context.close()


def test_a_viewer_sees_no_controls(page: Any, console: ConsoleServer) -> None:
    console.add_user("val", "viewer")
    sign_in(page, "val")
    page.goto("/console/topics")
    assert page.get_by_role("button", name="Create topic").count() == 0
    assert page.get_by_role("button", name="Delete").count() == 0
    page.goto("/console/clients")
    assert page.get_by_role("button", name="Rotate token").count() == 0
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/console/")
    shot(page, "overview-390")
