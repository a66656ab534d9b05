"""The console with the keyboard alone (issue 13: keyboard-usable pages), in a real browser:
sign in, skip to the content, reach a page through the navigation, create a topic and find it,
each step by Tab, typing and Enter; every element that takes the focus shows it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.console.conftest import PASSWORD, ConsoleServer, shot

pytestmark = pytest.mark.slow

MAX_TABS = 80  # more presses than any page here has focusable elements before its form

# What the focused element is, as the keyboard user meets it.
ACTIVE = """() => {
  const e = document.activeElement;
  const style = getComputedStyle(e);
  return {tag: e.tagName, id: e.id, name: e.getAttribute('name') || '',
          text: (e.innerText || e.value || '').trim(), outline: style.outlineStyle,
          outlineWidth: style.outlineWidth, left: e.getBoundingClientRect().left};
}"""


def tab_to(page: Any, wanted: Any, what: str) -> dict[str, Any]:
    """Press Tab until the focused element is the one `wanted` accepts; every element passed
    on the way must show its focus."""
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        active = dict(page.evaluate(ACTIVE))
        if active["tag"] in ("A", "BUTTON", "INPUT", "SELECT"):
            assert active["outline"] != "none" and active["outlineWidth"] != "0px", active
        if wanted(active):
            return active
    raise AssertionError(f"{what} not reached with {MAX_TABS} presses of Tab")


def test_sign_in_navigate_and_create_a_topic_with_the_keyboard_alone(
    page: Any, console: ConsoleServer
) -> None:
    page.goto("/console/signin")
    tab_to(page, lambda a: a["tag"] == "INPUT" and a["name"] == "name", "the user name field")
    page.keyboard.type("admin")
    page.keyboard.press("Tab")
    assert page.evaluate(ACTIVE)["name"] == "password"
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/console/?$"))

    # The first stop is the skip link, shown on the page while it has the focus.
    skip = tab_to(page, lambda a: a["tag"] == "A", "the first link")
    assert skip["text"] == "Skip to content" and skip["left"] >= 0
    page.keyboard.press("Enter")
    # The jump to the anchor is a navigation of its own: waited for (CI once read the URL first).
    page.wait_for_url(re.compile(r"#main$"))

    page.goto("/console/")
    tab_to(page, lambda a: a["tag"] == "A" and a["text"] == "Topics", "the Topics link")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/console/topics$"))

    tab_to(page, lambda a: a["id"] == "t-name", "the new topic's name field")
    page.keyboard.type("typed-by-keys")
    page.keyboard.press("Tab")  # the project: the first one is chosen
    page.keyboard.press("Tab")
    page.keyboard.press("Control+A")
    page.keyboard.type("3")
    page.keyboard.press("Enter")  # submits the form, as a button press would
    page.wait_for_load_state()
    row = page.locator("tr", has_text="typed-by-keys")
    row.wait_for()
    assert "3" in row.inner_text()
    shot(page, "keyboard-topic-created")

    # Find it with the search form, from the keyboard too.
    page.goto("/console/topics")
    tab_to(page, lambda a: a["tag"] == "INPUT" and a["name"] == "q", "the find field")
    page.keyboard.type("typed-by")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/console/topics\?q=typed-by"))
    assert page.locator("tr", has_text="typed-by-keys").count() == 1


# Every control a screen reader announces needs a name: a <label>, aria-label(ledby), a title,
# or (buttons, links) its text.
UNNAMED = """() => [...document.querySelectorAll('a, button, input, select, textarea')]
  .filter(e => e.type !== 'hidden' && e.getClientRects().length > 0)
  .filter(e => !((e.labels && e.labels.length) || e.getAttribute('aria-label')
                 || e.getAttribute('aria-labelledby') || e.title
                 || ((e.tagName === 'A' || e.tagName === 'BUTTON') && e.innerText.trim())))
  .map(e => e.outerHTML.slice(0, 120))"""

PAGES = [
    "/console/",
    "/console/projects",
    "/console/topics",
    "/console/clients",
    "/console/messages",
    "/console/traces",
    "/console/traces/policies",
    "/console/charts",
    "/console/applications",
    "/console/audit",
    "/console/users",
    "/console/clusters",
    "/console/settings",
    "/console/topics/kbd-names",
    "/console/topics/kbd-names/queues/0",
    "/console/topics/kbd-names/send",
    "/console/topics/kbd-names/purge",
    "/console/consumers/kbd-names-c",
    "/console/consumers/kbd-names-c/purge",
    "/console/consumers/kbd-names-c/dead-letters",
]


def test_every_control_on_every_page_has_a_name_for_screen_readers(page: Any, console: ConsoleServer) -> None:
    console.admin("POST", "/admin/topics", name="kbd-names", queues=2)
    console.admin("POST", "/admin/producers", name="kbd-names-p", topic="kbd-names")
    console.admin("POST", "/admin/consumers", name="kbd-names-c", topic="kbd-names")
    page.goto("/console/signin")
    assert page.evaluate(UNNAMED) == []
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/?$"))
    for path in PAGES:
        page.goto(path)
        assert page.evaluate("document.documentElement.lang") == "en"
        assert page.evaluate(UNNAMED) == [], path
        for chart in page.locator("[role=img]").all():
            assert chart.get_attribute("aria-label"), path
