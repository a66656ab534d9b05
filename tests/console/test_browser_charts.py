"""The charts in a real browser (Debian's Chromium, headless) against a real gateway: drawn by
uPlot from the page's data, a value on hover, fitted at 1280 and 390 px, redrawn by a live swap
without leaving old plots behind, a table without script, nothing from another origin, and
pages under the issue's 500 KB. The sizes measured go to artifacts/chart-page-sizes.json."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.console.conftest import ARTIFACTS, ConsoleServer, open_page, shot
from tests.console.conftest import sign_in as http_sign_in
from tests.console.test_browser import produce, sign_in

pytestmark = pytest.mark.slow

KEYS = ("produce", "consume", "lag")
SERIES_RGB = (31, 95, 191)  # the line's colour in static/charts.js
PAGE_LIMIT = 500 * 1024

# Pixels of the series' colour on a chart's canvas: only a drawn line or point has them (the
# grid, axes and labels are grey).
SERIES_PIXELS = """(canvas, rgb) => {
  const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] > 200 && Math.abs(d[i] - rgb[0]) < 24 && Math.abs(d[i + 1] - rgb[1]) < 24
        && Math.abs(d[i + 2] - rgb[2]) < 24) n += 1;
  }
  return n;
}"""


@pytest.fixture(scope="module")
def charted(console: ConsoleServer) -> ConsoleServer:
    """A gateway whose history has throughput in it."""
    console.admin("POST", "/admin/topics", name="uplot-t", queues=1)
    token = console.admin("POST", "/admin/producers", name="uplot-p", topic="uplot-t")["token"]
    for i in range(20):
        produce(console, token, "uplot-p", message=f"m{i}")
    return console


CHART_TIMEOUT_MS = 20_000


@pytest.fixture
def page(browser: Any, charted: ConsoleServer) -> Iterator[Any]:
    yield from open_page(browser, charted, 1280, CHART_TIMEOUT_MS)


@pytest.fixture
def narrow(browser: Any, charted: ConsoleServer) -> Iterator[Any]:
    yield from open_page(browser, charted, 390, CHART_TIMEOUT_MS)


def signed_in(page: Any) -> None:
    sign_in(page, "admin")
    page.wait_for_url("**/console/")


def wait_for_charts(page: Any) -> None:
    for key in KEYS:
        expect(page.locator(f"#chart-{key} .uplot canvas")).to_be_visible()


def test_charts_are_drawn_by_uplot_with_a_value_on_hover(page: Any) -> None:
    signed_in(page)
    page.goto("/console/charts?range=hour")
    wait_for_charts(page)
    assert page.locator(".charts svg").count() == 0  # one renderer: uPlot's canvas
    canvas = page.locator("#chart-produce .uplot canvas")
    shot(page, "charts-uplot")
    pixels = canvas.evaluate(SERIES_PIXELS, list(SERIES_RGB))
    assert pixels > 10, pixels  # the line itself, not only axes and grid
    assert page.evaluate("window.mqgateCharts.count()") == 3

    legend = page.locator("#chart-produce .u-legend .u-series").nth(1).locator(".u-value")
    time_value = page.locator("#chart-produce .u-legend .u-series").nth(0).locator(".u-value")
    over = page.locator("#chart-produce .u-over")
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)  # the newest point
    expect(legend).to_have_text(re.compile(r"^[\d,.]+ msg/s$"))
    expect(time_value).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d$"))
    assert page.locator("#chart-produce").get_attribute("role") == "img"
    assert "latest" in page.locator("#chart-produce").get_attribute("aria-label")
    shot(page, "charts-uplot-hover")


def test_charts_fit_at_390_px_and_follow_a_resize(narrow: Any) -> None:
    signed_in(narrow)
    for path in ("/console/", "/console/charts?range=week"):
        narrow.goto(path)
        wait_for_charts(narrow)
        assert narrow.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), path
        assert narrow.evaluate("document.querySelector('main').scrollWidth <= 390"), path
        for key in KEYS:
            figure = narrow.locator(f"figure[data-chart='{key}']").bounding_box()
            plot = narrow.locator(f"#chart-{key} .u-wrap").bounding_box()
            assert plot["width"] > 200 and plot["x"] + plot["width"] <= figure["x"] + figure["width"] + 0.5
    shot(narrow, "charts-uplot-390")

    before = narrow.locator("#chart-produce .u-wrap").bounding_box()["width"]
    narrow.set_viewport_size({"width": 1280, "height": 900})  # wider: the plots follow
    wide = narrow.locator("#chart-produce .u-wrap")
    room = narrow.locator("#chart-produce").evaluate("e => e.clientWidth")
    expect(wide).to_have_js_property("offsetWidth", room)
    assert wide.bounding_box()["width"] > before + 30


def test_a_live_swap_redraws_the_charts_and_destroys_the_old_ones(page: Any, charted: ConsoleServer) -> None:
    signed_in(page)
    page.goto("/console/charts?range=hour")
    wait_for_charts(page)
    page.locator("#chart-produce .uplot").evaluate("e => { e.dataset.old = 'yes'; }")
    token = charted.admin("POST", "/admin/producers", name="uplot-swap", topic="uplot-t")["token"]
    for i in range(5):  # the charts' data changes: the next poll (every 15 s) swaps them in
        produce(charted, token, "uplot-swap", message=f"s{i}")
    expect(page.locator(".uplot[data-old]")).to_have_count(0, timeout=45_000)
    wait_for_charts(page)
    assert page.locator(".uplot").count() == 3
    assert page.evaluate("window.mqgateCharts.count()") == 3  # the old three were destroyed
    pixels = page.locator("#chart-produce .uplot canvas").evaluate(SERIES_PIXELS, list(SERIES_RGB))
    assert pixels > 10, pixels


def test_without_script_the_points_are_a_table(browser: Any, charted: ConsoleServer) -> None:
    for page in open_page(browser, charted, 1280, CHART_TIMEOUT_MS, java_script_enabled=False):
        signed_in(page)
        page.goto("/console/charts?range=hour")
        assert page.locator(".uplot").count() == 0
        table = page.locator("#chart-produce-table")
        page.locator("details.chart-points summary").first.click()
        expect(table).to_be_visible()
        assert table.locator("tbody tr").count() >= 1
        assert re.fullmatch(r"[\d,.]+ msg/s", table.locator("td.num").first.inner_text())


def measure(page: Any, path: str) -> tuple[int, list[str], list[str]]:
    """Bytes transferred to show `path` (bodies and headers), the URLs fetched, and the URLs
    asked of any other origin."""
    asked: list[Any] = []
    finished: list[Any] = []
    page.on("request", lambda r: asked.append(r))
    page.on("requestfinished", lambda r: finished.append(r))
    page.goto(path, wait_until="load")
    wait_for_charts(page)
    total = 0
    for r in finished:
        s = r.sizes()
        total += s["responseBodySize"] + s["responseHeadersSize"]
    origin = page.url.split("/console/")[0] + "/"
    return total, [r.url for r in finished], [r.url for r in asked if not r.url.startswith(origin)]


def test_pages_stay_on_this_origin_and_under_500_kb(browser: Any, charted: ConsoleServer) -> None:
    sizes: dict[str, int] = {}
    for path in ("/console/", "/console/charts?range=week"):
        for page in open_page(browser, charted, 1280, CHART_TIMEOUT_MS):  # a fresh context: nothing cached
            session = http_sign_in(charted, "admin").cookies["mqgate_console"]
            page.context.add_cookies([{"name": "mqgate_console", "value": session, "url": charted.url}])
            total, urls, elsewhere = measure(page, path)
            assert page.url.startswith(charted.url + "/")
            assert any("/static/vendor/uplot/uPlot.iife.min.js" in u for u in urls), urls
            assert elsewhere == []
            sizes[path] = total
            assert 50_000 < total < PAGE_LIMIT, (path, total, urls)  # uPlot alone is about 50 KB
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "chart-page-sizes.json").write_text(json.dumps(sizes, indent=2) + "\n")
    print("bytes transferred per page", sizes)
