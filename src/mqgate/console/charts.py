"""Line charts as SVG drawn on the server (no script, nothing from another origin): pure
functions from points to markup, labelled for screen readers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from markupsafe import Markup, escape

WIDTH: Final = 560
HEIGHT: Final = 150
LEFT: Final = 52  # room for the value labels
BOTTOM: Final = 20  # room for the time labels
TOP: Final = 8
RIGHT: Final = 8
MAX_DOTS: Final = 200  # each point gets a dot (with its value as a tooltip) up to this many


@dataclass(slots=True, frozen=True)
class Chart:
    key: str  # an id for the page: produce, consume, lag
    title: str
    svg: Markup
    latest: str  # the newest value, as text
    points: int  # points with a value


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
    return moment.strftime("%m-%d %H:%M" if with_date else "%H:%M")


def line_chart(
    key: str,
    title: str,
    unit: str,
    values: Sequence[tuple[int, float | None]],
    *,
    span_label: str,
    with_date: bool = False,
    fmt: Callable[[float], str] = number,
) -> Chart:
    """A chart of (epoch ms, value or None) points, oldest first; None leaves a gap."""
    known = [v for _, v in values if v is not None]
    top = nice_ceiling(max(known, default=0.0))
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = max(len(values) - 1, 1)

    def x(i: int) -> float:
        return LEFT + inner_w * i / n

    def y(v: float) -> float:
        return TOP + inner_h * (1 - v / top)

    parts = ['<g class="grid" stroke="#d8dde6" stroke-width="1">']
    labels = []
    for fraction in (0.0, 0.5, 1.0):
        gy = y(top * fraction)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>')
        labels.append(
            f'<text x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">{escape(fmt(top * fraction))}</text>'
        )
    parts.append("</g>")
    if values:
        for i, anchor in ((0, "start"), (len(values) // 2, "middle"), (len(values) - 1, "end")):
            labels.append(
                f'<text x="{x(i):.1f}" y="{HEIGHT - 5}" text-anchor="{anchor}">'
                f"{escape(clock(values[i][0], with_date))}</text>"
            )
    parts.append(f'<g class="labels" fill="#5d6675" font-size="13">{"".join(labels)}</g>')
    segment: list[str] = []
    lines: list[str] = []
    dots: list[str] = []
    for i, (at, v) in enumerate(values):
        if v is None:
            if segment:
                lines.append(" ".join(segment))
            segment = []
            continue
        segment.append(f"{x(i):.1f},{y(v):.1f}")
        if len(known) <= MAX_DOTS:
            tip = f"{clock(at, True)} UTC: {fmt(v)} {unit}"
            dot = f'<circle class="pt" cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5">'
            dots.append(f"{dot}<title>{escape(tip)}</title></circle>")
    if segment:
        lines.append(" ".join(segment))
    color = "#1f5fbf"
    for pts in lines:
        if " " not in pts:  # one point alone: a dot shows it
            continue
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
    parts.append(f'<g fill="{color}">{"".join(dots)}</g>')
    latest = next((v for _, v in reversed(values) if v is not None), None)
    latest_text = "no data" if latest is None else f"{fmt(latest)} {unit}"
    peak = f"{fmt(max(known))} {unit}" if known else "no data"
    summary = f"{title} over the last {span_label}: latest {latest_text}, highest {peak}."
    svg = (
        f'<svg class="chart" id="chart-{escape(key)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="chart-{escape(key)}-t chart-{escape(key)}-d" data-points="{len(known)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title id="chart-{escape(key)}-t">{escape(title)}</title>'
        f'<desc id="chart-{escape(key)}-d">{escape(summary)}</desc>{"".join(parts)}</svg>'
    )
    return Chart(key, title, Markup(svg), latest_text, len(known))
