"""The charts' data (mqgate.console.charts, pure functions), the page's JSON block for them, and
uPlot shipped inside the package: in the wheel, and served by the console with its type and a
long cache (the page asks for it by version)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import httpx
import jinja2

from mqgate.console.app import HERE, VENDOR_CACHE, VENDORED
from mqgate.console.charts import TABLE_ROWS, line_chart, number, table_rows
from tests.conftest import ROOT
from tests.console.conftest import ConsoleServer, sign_in

UPLOT_FILES = ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE")
MINUTE_MS = 60_000


def test_a_chart_without_data_says_so() -> None:
    chart = line_chart("lag", "Lag", "messages", [(0, None), (MINUTE_MS, None)], span_label="hour")
    assert chart.points == 0 and chart.latest == "no data" and chart.highest == "no data"
    assert chart.top == 1.0 and chart.rows == [] and chart.values == [None, None]
    assert chart.summary == "Lag over the last hour: latest no data, highest no data."


def test_series_are_seconds_and_rounded_values_with_a_nice_top() -> None:
    points = [(i * MINUTE_MS, v) for i, v in enumerate([0.1234567, None, 7.5, 2.0])]
    chart = line_chart("produce", "Produced", "msg/s", points, span_label="day")
    assert chart.times == [0, 60, 120, 180]
    assert chart.values == [0.123, None, 7.5, 2.0]
    assert chart.top == 10.0 and chart.lowest == "0.12 msg/s" and chart.highest == "7.50 msg/s"
    assert chart.latest == "2 msg/s" and chart.points == 3
    assert chart.summary == "Produced over the last day: latest 2 msg/s, highest 7.50 msg/s."
    data = chart.data()
    assert json.loads(json.dumps(data)) == data  # what the page carries is plain JSON
    assert data["times"] == chart.times and data["values"] == chart.values and data["top"] == 10.0


def test_the_table_keeps_the_newest_points_with_a_value_newest_first() -> None:
    points = [(i * MINUTE_MS, None if i % 3 == 0 else float(i)) for i in range(200)]
    rows = table_rows(points, "msg/s")
    assert len(rows) == TABLE_ROWS
    assert rows[0] == ("1970-01-01 03:19", "199 msg/s")  # 199 minutes in, the newest
    assert rows[1] == ("1970-01-01 03:17", "197 msg/s")  # minute 198 has no value: left out
    assert table_rows(points, "msg/s", limit=2) == rows[:2]


def test_numbers_read_like_the_hover() -> None:
    # static/charts.js formats the same way: whole numbers with separators, small ones to 2 places
    got = [number(v) for v in (0, 3, 0.5, 9.999, 12.34, 1234.5)]
    assert got == ["0", "3", "0.50", "10.00", "12.3", "1,234"]


def test_the_page_carries_the_data_as_json_that_cannot_end_its_block() -> None:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    title = "Sneaky </script><script>alert(1)</script>"
    chart = line_chart("produce", title, "msg/s", [(0, 1.0), (MINUTE_MS, 2.0)], span_label="hour")
    html = env.get_template("charts_part.html").render(charts=[chart], span="hour", spans=["hour"])
    blocks = re.findall(r'<script type="application/json" id="chart-produce-data">(.*?)</script>', html, re.S)
    assert len(blocks) == 1 and json.loads(blocks[0]) == chart.data()
    assert "<script>alert" not in html
    plot = re.search(r'<div class="plot" id="chart-produce" role="img" aria-label="([^"]+)"', html)
    assert plot is not None and "latest 2 msg/s" in plot.group(1)
    assert html.count("<tr><td>") == 2  # the table of points, for screen readers and without script


def test_uplot_is_in_the_package_at_the_version_the_pages_ask_for() -> None:
    folder = files("mqgate.console") / "static" / "vendor" / "uplot"
    for name in UPLOT_FILES:
        assert (folder / name).is_file(), name
    banner = (folder / "uPlot.iife.min.js").read_text(encoding="utf-8")[:100]
    assert f"(v{VENDORED['uplot']})" in banner, banner
    assert "MIT License" in (folder / "LICENSE").read_text(encoding="utf-8")
    script = (ROOT / "scripts" / "vendor_uplot.sh").read_text(encoding="utf-8")
    assert f"\nVERSION={VENDORED['uplot']}\n" in script  # `make vendor` fetches what the pages name


def test_the_wheel_carries_uplot_and_the_charts_script(tmp_path: Path) -> None:
    # Built from a copy: a build in the worktree would leave build/ behind
    source = tmp_path / "src-copy"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), "."],
        cwd=source, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("mqgate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"mqgate/console/static/vendor/uplot/{n}" for n in UPLOT_FILES}
    wanted |= {"mqgate/console/static/charts.js", "mqgate/console/templates/chart_assets.html"}
    assert wanted <= names, sorted(wanted - names)


def test_the_console_serves_uplot_with_its_type_and_a_long_cache(console: ConsoleServer) -> None:
    base = f"{console.url}/console/static/vendor/uplot/"
    folder = HERE / "static" / "vendor" / "uplot"
    for name, kind in (("uPlot.iife.min.js", "text/javascript"), ("uPlot.min.css", "text/css")):
        r = httpx.get(base + name + "?v=" + VENDORED["uplot"])  # no session needed
        assert r.status_code == 200 and r.content == (folder / name).read_bytes()
        assert r.headers["content-type"] == f"{kind}; charset=utf-8"
        assert r.headers["cache-control"] == VENDOR_CACHE.decode()
        assert r.headers["x-content-type-options"] == "nosniff"
    for missing in ("other/uPlot.min.css", "uplot/nothing.js", "uplot/.hidden"):
        assert httpx.get(f"{console.url}/console/static/vendor/{missing}").status_code == 404
    own = httpx.get(f"{console.url}/console/static/charts.js")
    assert own.status_code == 200 and own.headers["content-type"] == "text/javascript; charset=utf-8"
    assert own.headers["cache-control"] == "no-store"  # the console's own files change with it

    console.add_user("charts-reader", "viewer")
    page = sign_in(console, "charts-reader").get("/console/charts").text
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert f"/console/static/vendor/uplot/{name}?v={VENDORED['uplot']}" in page
    assert "/console/static/charts.js" in page and "<svg" not in page
