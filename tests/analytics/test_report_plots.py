"""Issue 27: the report's plots say what the data says. Checked on the matplotlib figures
(their lines, limits and tick labels), not on pixels."""

from __future__ import annotations

import datetime as dt
from typing import Any

import matplotlib.dates as mdates
from matplotlib.figure import Figure

from mqgate.analytics import plots
from mqgate.analytics.generator import DEFAULT_START_MS

MINUTE = 60_000
DAY = 86_400_000


def _minute(m: int, n: int) -> dict[str, Any]:
    return {"t": DEFAULT_START_MS + m * MINUTE, "accepted": n, "delivered": n, "acked": n, "errors": 0}


def _num(ms: int) -> float:
    return float(mdates.date2num(dt.datetime.fromtimestamp(ms / 1000, dt.UTC)))


def _span_ms(fig: Figure) -> tuple[float, float]:
    lo, hi = fig.axes[0].get_xlim()
    return lo, hi


def test_minutes_without_events_are_drawn_at_zero_not_bridged() -> None:
    # Traffic in minutes 0-2 and 10-11; nothing in minutes 3-9.
    points = [_minute(0, 5), _minute(1, 6), _minute(2, 7), _minute(10, 8), _minute(11, 9)]
    fig = plots.rate_figure(points, "minute")
    line = next(ln for ln in fig.axes[0].lines if ln.get_label() == "accepted")
    xy = [(float(x), float(y)) for x, y in line.get_xydata()]
    # Every minute of the gap the line passes through is at zero: at minute 3 and at minute 9
    # (what the line shows there: a straight segment between them stays at zero).
    assert (_num(DEFAULT_START_MS + 3 * MINUTE), 0.0) in xy
    assert (_num(DEFAULT_START_MS + 9 * MINUTE), 0.0) in xy
    gap = [
        y for x, y in xy if _num(DEFAULT_START_MS + 3 * MINUTE) <= x <= _num(DEFAULT_START_MS + 9 * MINUTE)
    ]
    assert gap and set(gap) == {0.0}
    # Minutes with events are drawn as they are, and nothing is drawn before or after them.
    assert [y for x, y in xy if y] == [5, 6, 7, 8, 9]
    assert min(x for x, _ in xy) == _num(DEFAULT_START_MS) and max(x for x, _ in xy) == _num(
        DEFAULT_START_MS + 11 * MINUTE
    )


def test_hours_without_events_are_drawn_at_zero() -> None:
    hour = 60 * MINUTE
    points = [{**_minute(0, 5), "t": DEFAULT_START_MS}, {**_minute(0, 5), "t": DEFAULT_START_MS + 5 * hour}]
    line = plots.rate_figure(points, "hour").axes[0].lines[0]
    ys = [float(y) for _, y in line.get_xydata()]
    assert ys == [5.0, 0.0, 0.0, 5.0]


def test_failures_per_bucket_without_failures_are_zero() -> None:
    bucket = 600_000
    over_time = {
        "bucketMs": bucket,
        "nodes": {
            "gw-3": [{"t": DEFAULT_START_MS, "count": 4}, {"t": DEFAULT_START_MS + 6 * bucket, "count": 2}]
        },
    }
    ys = [float(y) for _, y in plots.failures_figure(over_time).axes[0].lines[0].get_xydata()]
    assert ys == [4.0, 0.0, 0.0, 2.0]


def test_one_failure_bucket_spans_about_an_hour_not_years() -> None:
    bucket = 600_000
    t = DEFAULT_START_MS + 130 * MINUTE
    fig = plots.failures_figure({"bucketMs": bucket, "nodes": {"gw-3": [{"t": t, "count": 4}]}})
    lo, hi = _span_ms(fig)
    assert lo <= _num(t) and _num(t + bucket) <= hi  # the point and its bucket are shown
    assert hi - lo <= 2 / 24  # days: at most two hours (it was four years)
    assert hi - lo >= 3 * bucket / DAY  # a sane width around one point


def test_the_failures_axis_spans_the_data() -> None:
    bucket = 600_000
    first, last = DEFAULT_START_MS, DEFAULT_START_MS + 8 * 60 * MINUTE
    over_time = {
        "bucketMs": bucket,
        "nodes": {"gw-3": [{"t": first, "count": 1}], "b": [{"t": last, "count": 1}]},
    }
    lo, hi = _span_ms(plots.failures_figure(over_time))
    assert lo <= _num(first) and _num(last + bucket) <= hi
    assert (hi - lo) - (_num(last + bucket) - _num(first)) <= 2 * bucket / DAY + 1e-9


def test_one_minute_of_rates_spans_minutes_not_years() -> None:
    lo, hi = _span_ms(plots.rate_figure([_minute(5, 3)], "minute"))
    assert lo <= _num(DEFAULT_START_MS + 5 * MINUTE) <= hi
    assert hi - lo <= 1 / 24


def _latency_group(topic: str, values: tuple[int, int, int, int], spread: int) -> dict[str, Any]:
    hops = ("store", "deliver", "process", "endToEnd")
    return {
        "topic": topic,
        "consumer": "c",
        **{
            h: {"p50": v, "p90": v * spread, "p99": v * spread, "max": v * spread, "count": 9}
            for h, v in zip(hops, values, strict=True)
        },
    }


def _tick_labels(fig: Figure) -> list[list[tuple[str, Any]]]:
    """Per axis, the x tick labels drawn: visible, non-empty, inside the axis's limits."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    out = []
    for ax in fig.axes:
        lo, hi = sorted(ax.get_xlim())
        shown = []
        for ticks in (ax.xaxis.get_major_ticks(), ax.xaxis.get_minor_ticks()):
            for tick in ticks:
                label = tick.label1
                if label.get_visible() and label.get_text() and lo <= tick.get_loc() <= hi:
                    shown.append((label.get_text(), label.get_window_extent(renderer)))
        out.append(shown)
    return out


def test_log_scale_tick_labels_are_few_and_do_not_overlap() -> None:
    cases = [
        # Within one decade: matplotlib labels the minor ticks (2x10^1, 3x10^1, ...).
        [_latency_group("orders", (20, 25, 30, 40), 3)],
        # Over many decades: a redelivered message's 500,000 ms beside 1 ms stores.
        [
            _latency_group("orders", (1, 25, 12, 40), 12_000),
            _latency_group("clicks", (2, 30, 3500, 9000), 60),
        ],
    ]
    for groups in cases:
        fig = plots.latency_figure(groups)
        per_axis = _tick_labels(fig)
        for shown in per_axis:
            assert 2 <= len(shown) <= 5, [t for t, _ in shown]
            assert not any("times" in t for t, _ in shown), [t for t, _ in shown]  # no 2x10^1
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        # The tick labels, and the figure's own texts (the axis title under them).
        boxes = [box for shown in per_axis for _, box in shown]
        boxes += [t.get_window_extent(renderer) for t in fig.texts if t.get_text()]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not a.overlaps(b), (a, b)
