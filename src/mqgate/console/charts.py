"""The console's charts as data: pure functions from (time, value) points to what a page needs.
The browser draws them with uPlot (static/vendor/uplot, static/charts.js) from a JSON block the
page carries; the summary and the table of points are text for screen readers and for a
browser without script."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

TABLE_ROWS: Final = 60  # the table of points shows the newest ones, up to this many
DIGITS: Final = 3  # values sent to the browser are rounded to this many decimals


class Chart(msgspec.Struct, frozen=True):
    key: str  # an id for the page: produce, consume, lag
    title: str
    unit: str
    times: list[int]  # seconds since the epoch (uPlot's time axis), oldest first
    values: list[float | None]  # None: nothing recorded (a gap in the line)
    top: float  # the value axis runs from 0 to here
    latest: str  # the newest value, as text
    lowest: str
    highest: str
    points: int  # points with a value
    summary: str  # the chart in one sentence (its accessible name)
    rows: list[tuple[str, str]]  # (UTC time, value) of the newest points with a value, newest first

    def data(self) -> dict[str, Any]:
        """What static/charts.js draws (the page carries it as JSON)."""
        return {
            "title": self.title,
            "unit": self.unit,
            "top": self.top,
            "times": self.times,
            "values": self.values,
        }


class ChartNote(msgspec.Struct, frozen=True):
    """What stands in a chart's place when there is nothing it could draw (a latency chart of a
    topic nobody traces): why, and a link to what would change that; never an empty chart."""

    key: str
    title: str
    text: str
    link: str
    link_text: str


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def nice_ceiling(value: float) -> float:
    """The least of 1, 2, 2.5, 5 × 10^n at or above `value` (the chart's top line)."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def number(value: float) -> str:
    if value >= 1000 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def clock(ms: int, with_date: bool) -> str:
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M")


def with_unit(value: float | None, unit: str, fmt: Callable[[float], str] = number) -> str:
    return "no data" if value is None else f"{fmt(value)} {unit}"


def table_rows(
    values: Sequence[tuple[int, float | None]], unit: str, limit: int = TABLE_ROWS
) -> list[tuple[str, str]]:
    """The newest `limit` points with a value, newest first, as (UTC time, value) text."""
    known = [(at, v) for at, v in values if v is not None]
    return [(clock(at, True), with_unit(v, unit)) for at, v in reversed(known[-limit:])]


def line_chart(
    key: str,
    title: str,
    unit: str,
    values: Sequence[tuple[int, float | None]],
    *,
    span_label: str,
) -> Chart:
    """A chart of (epoch ms, value or None) points, oldest first; None leaves a gap."""
    known = [v for _, v in values if v is not None]
    latest = next((v for _, v in reversed(values) if v is not None), None)
    lowest = with_unit(min(known), unit) if known else "no data"
    highest = with_unit(max(known), unit) if known else "no data"
    summary = f"{title} over the last {span_label}: latest {with_unit(latest, unit)}, highest {highest}."
    return Chart(
        key=key,
        title=title,
        unit=unit,
        times=[at // 1000 for at, _ in values],
        values=[None if v is None else round(v, DIGITS) for _, v in values],
        top=nice_ceiling(max(known, default=0.0)),
        latest=with_unit(latest, unit),
        lowest=lowest,
        highest=highest,
        points=len(known),
        summary=summary,
        rows=table_rows(values, unit),
    )
