"""Gaps an audit of the console found (issue 29), each checked where an operator sees it: in
headless Chromium (Debian's) against a real gateway, or in the page's HTML."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, csrf_of, open_page
from tests.console.conftest import sign_in as http_sign_in
from tests.console.test_browser import produce, sign_in

pytestmark = pytest.mark.slow

TOPIC = "gaps"
NARROW = 390
WIDE = 1366

# The words of each `pre.body` (runs of non-space characters up to 24 long: a longer token may
# break where it must) that the browser laid out over more than one line.
SPLIT_WORDS = """els => els.flatMap(el => {
  const found = [];
  for (const text of el.childNodes) {
    if (text.nodeType !== Node.TEXT_NODE) continue;
    for (const m of text.data.matchAll(/\\S+/g)) {
      if (m[0].length > 24) continue;
      const r = document.createRange();
      r.setStart(text, m.index);
      r.setEnd(text, m.index + m[0].length);
      const tops = new Set([...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top)));
      if (tops.size > 1) found.push(m[0]);
    }
  }
  return found;
})"""

STYLE = "e => [getComputedStyle(e).wordBreak, getComputedStyle(e).overflowWrap]"


@pytest.fixture(scope="module")
def gaps(console: ConsoleServer) -> ConsoleServer:
    console.admin("POST", "/admin/topics", name=TOPIC, queues=2)
    token = console.admin("POST", "/admin/producers", name="gaps-p", topic=TOPIC)["token"]
    console.admin("POST", "/admin/consumers", name="gaps-c", topic=TOPIC, start="earliest")
    for i in range(6):
        body = f'{{"order": {i}, "sku": "sku-{i}", "total": 20, "note": "{"n" * 60}", "qty": 1{i}}}'
        produce(console, token, "gaps-p", message=body, keys=[f"k{i}"])
    return console


@pytest.fixture
def signed_in(browser: Any, gaps: ConsoleServer) -> Iterator[Any]:
    gen = open_page(browser, gaps, WIDE, 20_000)
    page = next(gen)
    sign_in(page, "admin")
    page.wait_for_url("**/console/")
    yield page
    next(gen, None)


@pytest.mark.parametrize("width", [NARROW, WIDE])
def test_bodies_break_between_words_on_the_topic_and_queue_pages(signed_in: Any, width: int) -> None:
    page = signed_in
    page.set_viewport_size({"width": width, "height": 900})
    for path in (f"/console/topics/{TOPIC}", f"/console/topics/{TOPIC}/queues/0"):
        page.goto(path)
        bodies = page.locator("pre.body")
        assert bodies.count() > 0, path
        assert bodies.evaluate_all(SPLIT_WORDS) == [], path
        style = bodies.first.evaluate(STYLE)
        assert style == ["normal", "break-word"], (path, style)
    # The trace page's bodies (a debug trace) take the same rule from console.css.
    page.goto("/console/traces")
    probe = page.evaluate(
        """() => { const p = document.createElement('pre'); p.className = 'body'; p.textContent = 'x';
        document.body.append(p); const s = getComputedStyle(p); return [s.wordBreak, s.overflowWrap]; }"""
    )
    assert probe == ["normal", "break-word"]


# --- dead letters ------------------------------------------------------------------------


def expired_dead_letters(srv: ConsoleServer, topic: str, n: int) -> None:
    """`n` messages of one queue that expire before their pull: `n` dead letters of `<topic>-c`."""
    srv.admin("POST", "/admin/topics", name=topic, queues=1)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic, start="earliest")["token"]
    for i in range(n):
        produce(srv, ptoken, f"{topic}-p", message=f"late {i}", ttlMs=1)
    time.sleep(0.01)  # the 1 ms validity passes: a deadline in time, not a wait for a process

    def dead() -> bool:
        httpx.get(srv.url + "/mq/message", params={"topic": topic, "consumer": f"{topic}-c"},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
        return bool(srv.admin("GET", f"/admin/consumers/{topic}-c/dead-letters")["max"] >= n)

    wait_until(dead, 15, f"{n} dead letters")


def shown_offsets(page: str) -> list[int]:
    return [int(o) for o in re.findall(r'<tr data-offset="(\d+)">', page)]


def plain_text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def part(page: str, pattern: str) -> str:
    """The text of the first group of `pattern` in `page`, tags dropped."""
    found = re.search(pattern, page, re.S)
    assert found is not None, pattern
    return plain_text(found.group(1))


def test_dead_letter_copies_take_what_the_list_shows_and_the_header_counts_moves_and_copies(
    gaps: ConsoleServer,
) -> None:
    expired_dead_letters(gaps, "dlg", 6)
    admin = http_sign_in(gaps, "admin")
    url = "/console/consumers/dlg-c/dead-letters"
    csrf = csrf_of(admin, url)
    # Two moved on their own (offsets 1 and 3): the position stays 0; the filter stays on.
    moved = admin.post(url + "/redrive", data={"csrf": csrf, "scope": "selected", "offset": ["1", "3"],
                                               "reason": "expired"})  # fmt: skip
    assert moved.status_code == 303
    back = parse_qs(urlsplit(moved.headers["location"]).query)
    assert back["reason"] == ["expired"] and "2 redriven" in back["note"][0]  # the filter kept
    assert shown_offsets(admin.get(url).text) == [0, 2, 4, 5]

    # A copy of every dead letter takes the 4 listed, not the 2 moved.
    form = {"csrf": csrf, "scope": "filter", "mode": "copy"}
    preview = admin.post(url + "/preview", data=form).text
    summary = part(preview, r'id="redrive-summary"[^>]*>(.*?)</p>')
    assert "copies 4 dead letters" in summary and "4 match, 2 more were redriven already" in summary, summary
    assert "of 6 dead letters read at offsets 0–5" in summary, summary
    # From the oldest, the moved ones too.
    everything = admin.post(url + "/preview", data={**form, "from": "start"}).text
    assert re.search(r'id="will-copy">6<', everything)

    # Cut by the rate: the range read is still the one scanned, never a negative offset.
    paced = admin.post(url + "/preview", data={**form, "rate": "0.01"}).text
    read = part(paced, r'id="redrive-read">(.*?)</span>')
    assert read == "6 dead letters read at offsets 0–5", read
    assert "offset -" not in paced
    assert re.search(r'id="will-copy">4<', paced)  # all of them, in the background

    done = admin.post(url + "/redrive", data={**form, "confirmed": "yes"})
    assert "4 copied back" in parse_qs(urlsplit(done.headers["location"]).query)["note"][0]
    header = part(admin.get(url).text, r'<p id="dl-state">(.*?)</p>')
    assert header.startswith("6 dead letters stored (offsets 0–5). So far 2 moved back to dlg-c"), header
    assert "and 4 copied back (still listed)" in header, header
    assert "below offset" not in header  # nothing below the position: offset 0 was not moved
    assert "((" not in header and "records))" not in header

    # Moving 0 moves the position past it (and 1, moved before).
    admin.post(url + "/redrive", data={"csrf": csrf, "scope": "selected", "offset": ["0"]})
    header = part(admin.get(url).text, r'<p id="dl-state">(.*?)</p>')
    assert "So far 3 moved back" in header and "Every one below offset 2 was moved." in header, header


# --- numbers -----------------------------------------------------------------------------


def test_lags_locks_and_trace_times_are_formatted(signed_in: Any, gaps: ConsoleServer) -> None:
    page = signed_in
    gaps.admin("POST", "/admin/topics", name="many", queues=1)
    ptoken = gaps.admin("POST", "/admin/producers", name="many-p", topic="many")["token"]
    ctoken = gaps.admin("POST", "/admin/consumers", name="many-c", topic="many", start="earliest",
                        lockTimeoutS=600)["token"]  # fmt: skip
    auth = {"Authorization": f"Bearer {ptoken}"}
    for n in (1000, 242):
        batch = {"producer": "many-p", "messages": [{"message": f"m{i}"} for i in range(n)]}
        r = httpx.post(gaps.url + "/mq/produce/batch", json=batch, headers=auth, timeout=30)
        assert r.status_code == 200, r.text
    r = httpx.get(gaps.url + "/mq/message", params={"topic": "many", "consumer": "many-c", "max": 1},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
    assert r.json()["result"]["msgList"], r.text  # a batch of one held: a lock for 600 s
    # A traced message pulled a second after it was produced.
    gaps.admin("POST", "/admin/topics", name="timed", queues=1)
    gaps.admin("POST", "/admin/trace-policies", mode="route", topic="timed", level="info")
    ttoken = gaps.admin("POST", "/admin/producers", name="timed-p", topic="timed")["token"]
    tctoken = gaps.admin("POST", "/admin/consumers", name="timed-c", topic="timed", start="earliest")["token"]
    one = httpx.post(gaps.url + "/mq/produce", json={"producer": "timed-p", "message": "traced"},
                     headers={"Authorization": f"Bearer {ttoken}"})  # fmt: skip
    msg_id = one.json()["result"]["msgId"]
    time.sleep(1.1)  # the message waits a second before its pull: a gap in time, not a wait
    r = httpx.get(gaps.url + "/mq/message", params={"topic": "timed", "consumer": "timed-c"},
                  headers={"Authorization": f"Bearer {tctoken}"}, timeout=10)  # fmt: skip
    assert r.json()["result"]["msgList"], r.text

    page.goto("/console/consumers/many-c")
    assert page.locator("#total-lag").inner_text() == "1,242"
    row = page.locator("#progress tbody tr").first
    cells = row.locator("td.num").all_inner_texts()
    assert "1,242" in cells, cells  # max and lag, with separators
    expect(row.locator("td.lock")).to_have_text(re.compile(r", expires in (\d+(\.\d)? s|\d+ min)$"))
    assert " ms)" not in row.locator("td.lock").inner_text()

    page.goto("/console/")
    expect(page.locator('td[data-lag="many-c"]')).to_have_text("1,242")

    def traced() -> bool:
        page.goto(f"/console/traces?by=msgId&value={msg_id}")
        return page.locator("li[data-hop='delivered']").count() == 1

    wait_until(traced, 20, "the delivery to show on the traces page")
    head = page.locator(f"section.trace[data-msg-id='{msg_id}']").inner_text()
    assert re.search(r"\d+ hops over \d+\.\d s", head), head
    latency = page.locator("li[data-hop='delivered'] .latency").inner_text()
    assert re.fullmatch(r"\+(\d+\.\d s|[\d,]+ ms)", latency), latency


# --- applications at phone width ---------------------------------------------------------

IN_VIEW = """el => { const r = el.getBoundingClientRect();
  return r.width > 0 && r.left >= 0 && r.right <= document.documentElement.clientWidth; }"""


def test_applications_at_390_px_keep_the_decision_and_my_applications_on_screen(
    browser: Any, gaps: ConsoleServer
) -> None:
    gaps.add_user("nell", "member", "default")
    for i in range(2):
        gaps.admin("POST", "/admin/topics", name=f"apply-{i}", queues=1)
    applicant = http_sign_in(gaps, "nell")
    csrf = csrf_of(applicant, "/console/applications")
    for i in range(2):
        form = {"csrf": csrf, "kind": "consumer", "name": f"apply-{i}-consumer-with-a-long-name",
                "topic": f"apply-{i}", "mode": "cluster", "start": "earliest"}  # fmt: skip
        assert applicant.post("/console/applications", data=form).status_code == 303

    for user in ("admin", "nell"):
        gen = open_page(browser, gaps, NARROW, 20_000)
        page = next(gen)
        sign_in(page, user)
        page.wait_for_url("**/console/")
        page.goto("/console/applications")
        assert page.evaluate("document.documentElement.scrollWidth") <= NARROW
        if user == "admin":
            row = page.locator("#pending tr", has_text="apply-1-consumer")
            controls = [row.get_by_label("Comment"), row.get_by_role("button", name="Approve"),
                        row.get_by_role("button", name="Reject")]  # fmt: skip
        else:
            row = page.locator("#mine tbody tr").first
            controls = [row.locator("td.state"), row.locator("td").last]
        for control in controls:
            control.scroll_into_view_if_needed()
            assert control.evaluate(IN_VIEW), control
        if user == "admin":
            row.get_by_label("Comment").fill("fine")
            row.get_by_role("button", name="Approve").click()
            expect(page.locator(".note")).to_contain_text("approved")
        next(gen, None)


# --- smaller ones ------------------------------------------------------------------------


def test_the_live_stamp_is_utc_whatever_the_browser_zone(browser: Any, gaps: ConsoleServer) -> None:
    gen = open_page(browser, gaps, WIDE, 20_000, timezone_id="Pacific/Kiritimati")  # UTC+14
    page = next(gen)
    sign_in(page, "admin")
    page.wait_for_url("**/console/")
    page.goto("/console/projects/default")
    stamp = page.locator('[data-live-stamp="project-health"]')
    expect(stamp).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d UTC$"), timeout=30_000)
    shown = stamp.inner_text().split()[1]
    now = datetime.now(UTC)
    assert abs(int(shown[:2]) - now.hour) % 23 <= 1, (shown, now)  # UTC's hour, not UTC+14's
    next(gen, None)


def test_the_send_form_says_priorities_are_off_on_a_topic_without_them(gaps: ConsoleServer) -> None:
    gaps.admin("POST", "/admin/topics", name="prio-off", queues=1)
    gaps.admin("POST", "/admin/topics", name="prio-on", queues=1, maxPriority=4)
    for topic in ("prio-off", "prio-on"):
        gaps.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)
    admin = http_sign_in(gaps, "admin")
    off = admin.get("/console/topics/prio-off/send").text
    assert "0 to the topic's 0" not in off and 'id="s-priority"' not in off
    assert "prio-off has no priorities" in off
    on = admin.get("/console/topics/prio-on/send").text
    assert "Priority (0 to the topic's 4)" in on and 'max="4"' in on


# --- a paced redrive in the background ---------------------------------------------------


def test_a_paced_redrive_runs_in_the_background_shows_its_progress_and_is_cancelled(
    signed_in: Any, gaps: ConsoleServer
) -> None:
    expired_dead_letters(gaps, "bg", 5)
    page = signed_in
    page.goto("/console/consumers/bg-c/dead-letters")
    page.get_by_label("Move (mark redriven)").check()
    page.get_by_label(re.compile(r"^At most")).fill("1")
    page.get_by_role("button", name=re.compile("Preview redrive")).click()
    assert page.locator("#will-copy").inner_text() == "5"
    expect(page.locator("#redrive-paced")).to_contain_text("runs in the background")
    started = time.monotonic()
    page.get_by_role("button", name="Redrive 5 dead letters").click()
    page.wait_for_url(re.compile(r"/dead-letters\?"))
    assert time.monotonic() - started < 5  # the page answers at once: the 5 s of work go on behind it
    job = page.locator("#redrive-job")
    expect(job).to_have_attribute("data-state", "running")
    # Its progress refreshes without a reload.
    expect(page.locator("#redrive-copied")).to_have_text(re.compile(r"^[1-4]$"), timeout=10_000)
    page.get_by_role("button", name="Cancel the redrive").click()
    expect(page.locator("#redrive-job")).to_have_attribute("data-state", "cancelled", timeout=10_000)
    moved = int(page.locator("#redrive-copied").inner_text())
    assert 1 <= moved < 5
    page.reload()
    assert len(shown_offsets(page.content())) == 5 - moved  # the rest wait
    page.goto("/console/audit?action=deadletter.redrive")
    actions = page.locator("#audit td.action").all_inner_texts()
    assert {"deadletter.redrive.start", "deadletter.redrive.cancel", "deadletter.redrive"} <= set(actions)
