"""The clusters page in a real browser (Debian's Chromium, headless) against a real gateway on two
redis-servers of the test's own: a project failed over by a hung primary shows as such, at
1366 and at 390 px, with a name for every control; its fail-back is previewed and confirmed
with the keyboard alone; the embedded default's page explains itself."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.console.conftest import ADMIN_TOKEN, ConsoleServer, docs_shot, open_page, shot
from tests.console.test_browser import sign_in
from tests.console.test_browser_keyboard import UNNAMED, tab_to
from tests.console.test_clusters_page import cluster_state, clustered_console, failover_of
from tests.failover.conftest import post_once_read

pytestmark = pytest.mark.slow

# Horizontal overflow of the page itself (a table may scroll inside its own box).
OVERFLOW = "() => document.documentElement.scrollWidth - window.innerWidth"
browser_page = contextlib.contextmanager(open_page)


@pytest.fixture(scope="module")
def failed_over(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """Project shop failed over from p to b (p hung, then back and drained); pay on b."""
    srv, primary, backup = clustered_console(tmp_path_factory.mktemp("clusters-browser"))
    try:
        for name, first, second in (("shop", "p", "b"), ("pay", "b", "p")):
            srv.admin("POST", "/admin/projects", name=name, description=f"{name} services")
            srv.admin("PUT", f"/admin/projects/{name}/clusters", primary=first, backup=second)

        # Writes to shop's cluster, each once the switch record was read (post_once_read).
        def admin(path: str, **body: Any) -> Any:
            return post_once_read(srv.url + path, ADMIN_TOKEN, body)

        admin("/admin/topics", name="orders", queues=2, project="shop")
        ptoken = admin("/admin/producers", name="orders-p", topic="orders")["token"]
        admin("/admin/consumers", name="orders-c", topic="orders", start="earliest")
        wait_until(lambda: failover_of(srv, "shop")["active"] == "p", 10, "shop on p")
        body = {"producer": "orders-p", "messages": [{"message": f"m{i}"} for i in range(3)]}
        post_once_read(srv.url + "/mq/produce/batch", ptoken, body)
        primary.pause()
        try:
            wait_until(lambda: failover_of(srv, "shop")["active"] == "b", 20, "shop failed over to b")
        finally:
            primary.resume()
        wait_until(lambda: cluster_state(srv, "p") == "healthy", 20, "p healthy again")
        wait_until(lambda: failover_of(srv, "shop")["draining"] == [], 20, "p drained")
        yield srv
    finally:
        srv.stop()
        primary.stop()
        backup.stop()


def test_clusters_page_at_1366_and_390_px_with_named_controls(
    browser: Any, failed_over: ConsoleServer
) -> None:
    for width in (1366, 390):
        with browser_page(browser, failed_over, width=width) as page:
            sign_in(page, "admin")
            page.wait_for_url(re.compile(r"/console/?$"))
            page.get_by_role("link", name="Clusters", exact=True).click()
            page.wait_for_url(re.compile(r"/console/clusters$"))
            assert page.evaluate(UNNAMED) == []
            assert page.locator("table[data-pool='main'] tr[data-cluster]").count() == 2
            for cell in page.locator("td.latency").all_inner_texts():
                assert re.fullmatch(r"[\d,]+\.\d{1,2} ms|[\d,]+ ms|<0\.01 ms", cell), cell  # formats.latency
            shop = page.locator("#project-shop")
            assert "failed over to b" in shop.inner_text()
            switches = shop.get_by_role("list", name="Switches of shop")
            assert switches.locator("li").count() == 2
            assert "p → b" in switches.locator("li.failed").inner_text()
            assert page.locator("#project-pay").get_by_role("button").count() == 0  # on its primary
            button = shop.get_by_role("button", name="Fail back shop to p: preview")
            assert button.is_visible()
            assert page.evaluate(OVERFLOW) <= 0, f"the page scrolls sideways at {width} px"
            docs_shot(page, f"console-clusters-{width}")


def test_failback_previewed_and_confirmed_with_the_keyboard(browser: Any, failed_over: ConsoleServer) -> None:
    with browser_page(browser, failed_over, width=1366) as page:
        sign_in(page, "admin")
        page.wait_for_url(re.compile(r"/console/?$"))
        page.goto("/console/clusters")
        tab_to(page, lambda a: a["tag"] == "BUTTON" and "Fail back to p" in a["text"], "the fail-back button")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r"/failback/preview$"))
        assert page.evaluate(UNNAMED) == []
        summary = page.get_by_role("status").inner_text()
        assert "moves from b" in summary and "back to its primary p" in summary
        assert page.locator("#failback-consumers tr[data-consumer='orders-c'] td.source").inner_text() == "3"
        shot(page, "console-failback-preview")
        assert failover_of(failed_over, "shop")["active"] == "b"  # the preview changed nothing
        tab_to(page, lambda a: a["id"] == "confirm-failback", "the confirmation button")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r"/console/clusters\?project=shop"))
        assert "failed back from b to p" in page.locator(".note").inner_text()
        assert failover_of(failed_over, "shop")["active"] == "p"
        shop = page.locator("#project-shop")
        assert "on its primary" in shop.inner_text()
        assert shop.get_by_role("list", name="Switches of shop").locator("li").count() == 3


def test_embedded_default_page_in_the_browser(page: Any, console: ConsoleServer) -> None:
    sign_in(page, "admin")
    page.wait_for_url(re.compile(r"/console/?$"))
    page.goto("/console/clusters")
    assert page.get_by_role("heading", name="One store, no clusters").is_visible()
    assert page.evaluate(UNNAMED) == []
    page.goto("/console/projects/default")
    where = page.get_by_role("region", name="Where it lives")
    assert "cannot fail over" in where.inner_text()
    where.get_by_role("link", name="How to add clusters").click()
    page.wait_for_url(re.compile(r"/console/clusters$"))
