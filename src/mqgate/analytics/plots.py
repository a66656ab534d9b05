"""The report's plots, drawn with matplotlib (Agg, no display) as SVG text to embed inline."""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Sequence
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

COLORS = {"accepted": "#4477aa", "delivered": "#66ccee", "acked": "#228833", "errors": "#ee6677"}
STEP_MS: Final = {"minute": 60_000, "hour": 3_600_000}
# A time axis is at least this many steps (minutes, hours, failure buckets) wide.
MIN_STEPS_SHOWN: Final = 6
# Labelled ticks on each latency (log) axis: a few, so they never overlap.
MAX_LOG_TICKS: Final = 4


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline in HTML


def _times(points: list[dict[str, Any]]) -> Any:  # datetimes: matplotlib's stubs want numbers
    return [_when(p["t"]) for p in points]


def _when(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def zero_filled(points: list[dict[str, Any]], step_ms: int, keys: Sequence[str]) -> list[dict[str, Any]]:
    """`points` (one per step with events, ascending `t`) with a zero point at each end of
    every gap: the line drawn through them stays at zero over the steps that had no events,
    instead of bridging them (the report lists only steps with events)."""
    out: list[dict[str, Any]] = []
    zero = dict.fromkeys(keys, 0)
    for p in points:
        if out:
            last = out[-1]["t"]
            if p["t"] - last > step_ms:
                out.append({"t": last + step_ms, **zero})
                if p["t"] - last > 2 * step_ms:
                    out.append({"t": p["t"] - step_ms, **zero})
        out.append(p)
    return out


def _span(ax: Axes, first_ms: int, last_ms: int, step_ms: int) -> None:
    """The x axis over the data: from the first step to the end of the last, a step's margin
    each side, and at least MIN_STEPS_SHOWN steps wide (centred) around a single point
    (matplotlib alone spans four years around one date)."""
    lo, hi = first_ms - step_ms, last_ms + 2 * step_ms
    short = MIN_STEPS_SHOWN * step_ms - (hi - lo)
    if short > 0:
        lo, hi = lo - short // 2, hi + short - short // 2
    ax.set_xlim(_when(lo), _when(hi))  # type: ignore[arg-type]


def rate_figure(points: list[dict[str, Any]], unit: str) -> Figure:
    """Events per minute or hour of each series; a step without events is drawn at zero."""
    step = STEP_MS[unit]
    filled = zero_filled(points, step, tuple(COLORS))
    fig, ax = plt.subplots(figsize=(10, 3.2))
    times = _times(filled)
    for series, color in COLORS.items():
        values = [p[series] for p in filled]
        if unit == "hour":
            ax.plot(times, values, marker="o", color=color, label=series)
        else:
            ax.plot(times, values, linewidth=0.8, color=color, label=series)
    if points:
        _span(ax, points[0]["t"], points[-1]["t"], step)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"events per {unit}")
    ax.legend(loc="upper left", fontsize=8, ncol=4)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return fig


def rate_plot(points: list[dict[str, Any]], unit: str) -> str:
    return _svg(rate_figure(points, unit))


def capacity_plot(services: list[dict[str, Any]]) -> str:
    shown = [s for s in services if s["role"] != "client"]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(shown) + 1.2))
    labels = [f"{s['role']} {s['name']}" for s in shown]
    ys = range(len(shown))
    ax.barh(
        [y + 0.2 for y in ys],
        [s["peakPerS"] for s in shown],
        height=0.4,
        color="#ee6677",
        label="peak (1 min)",
    )
    ax.barh(
        [y - 0.2 for y in ys],
        [s["sustainedPerS"] for s in shown],
        height=0.4,
        color="#4477aa",
        label="sustained (10 min)",
    )
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.set_xlabel("events per second")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def _ms_label(value: float, _pos: object = None) -> str:
    """A tick label in milliseconds: 0.5, 5, 20, 500, 2k, 50k, 1M."""
    for factor, suffix in ((1_000_000, "M"), (1_000, "k")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def log_ticks(lo: float, hi: float, most: int = MAX_LOG_TICKS) -> list[float]:
    """At most `most` ticks between lo and hi (0 < lo < hi) from the 1-2-5 sequence, fewer
    steps per decade as the range widens, then every second decade, and so on."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        found = [m * 10.0**d for d in range(first, last + 1) for m in mantissas]
        found = [v for v in found if lo <= v <= hi]
        if len(found) <= most:
            return found
    stride = 2
    decades = [10.0**d for d in range(first, last + 1) if lo <= 10.0**d <= hi]
    while len(decades[::stride]) > most:
        stride += 1
    return decades[::stride]


def _log_axis(ax: Axes, values: list[float]) -> None:
    """A log x axis over `values` (positive), at least a decade wide, with a few plain labels
    (matplotlib labels minor ticks as 2x10^1, 3x10^1, ... within a decade: they overlap)."""
    lo, hi = min(values) / 1.5, max(values) * 1.5
    if hi / lo < 10:
        middle = math.sqrt(lo * hi)
        lo, hi = middle / math.sqrt(10), middle * math.sqrt(10)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
    ax.xaxis.set_major_formatter(FuncFormatter(_ms_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=8)


def latency_figure(groups: list[dict[str, Any]]) -> Figure:
    hops = ("store", "deliver", "process", "endToEnd")
    fig, axes = plt.subplots(
        1,
        len(hops),
        figsize=(12, 0.4 * max(1, len(groups)) + 1.6),
        sharey=True,
        layout="constrained",  # the axis title below the tick labels, not over them
    )
    labels = [f"{g['topic']} / {g['consumer'] or '-'}" for g in groups]
    ys = range(len(groups))
    for ax, hop in zip(axes, hops, strict=True):
        shown: list[float] = []
        for q, color, shift in (("p50", "#4477aa", -0.2), ("p99", "#ee6677", 0.2)):
            values = [max(g[hop][q] or 0, 0.5) for g in groups]
            shown += values
            ax.barh([y + shift for y in ys], values, height=0.4, color=color, label=q)
        _log_axis(ax, shown)
        ax.set_title(hop, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(ys), labels, fontsize=8)
    axes[0].legend(fontsize=7)
    fig.supxlabel("milliseconds (log)", fontsize=9)
    return fig


def latency_plot(groups: list[dict[str, Any]]) -> str:
    return _svg(latency_figure(groups))


def failures_figure(over_time: dict[str, Any]) -> Figure:
    """Failures per bucket of each top node; a bucket without failures is drawn at zero."""
    step = over_time["bucketMs"]
    fig, ax = plt.subplots(figsize=(10, 3))
    times = [p["t"] for points in over_time["nodes"].values() for p in points]
    for node, points in over_time["nodes"].items():
        filled = zero_filled(points, step, ("count",))
        ax.plot(_times(filled), [p["count"] for p in filled], marker=".", label=node)
    if times:
        _span(ax, min(times), max(times), step)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"failures per {step // 60_000} min")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return fig


def failures_plot(over_time: dict[str, Any]) -> str:
    return _svg(failures_figure(over_time))


STATE_COLORS = {
    "healthy": "#a6d8a6",
    "queue_fault": "#ee6677",
    "consumer_fault": "#ccbb44",
    "queue_and_consumer_fault": "#aa3377",
    "no_data": "#dddddd",
}
MAX_LANES = 40


def _project_runs(tl: dict[str, Any]) -> list[tuple[int, int, str]]:
    runs: list[tuple[int, int, str]] = []
    step = tl["intervalMs"]
    for i in tl["intervals"]:
        if runs and runs[-1][2] == i["state"] and runs[-1][1] == i["t"]:
            runs[-1] = (runs[-1][0], i["t"] + step, i["state"])
        else:
            runs.append((i["t"], i["t"] + step, i["state"]))
    return runs


def fault_timeline_plot(tl: dict[str, Any]) -> str:
    """One lane for the project, then one per topic's queues and per consumer group on a
    topic (the most faulty MAX_LANES): each interval coloured by what it was."""
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    lanes = sorted(tl["lanes"], key=lambda lane: -lane["faultIntervals"])[:MAX_LANES]
    lanes.sort(key=lambda lane: (lane["side"] != "queue", lane["topic"], lane["consumer"] or ""))
    rows = [("project " + tl["project"], _project_runs(tl))]
    rows += [
        (lane["label"], [(r["fromMs"], r["toMs"], r["state"]) for r in lane["states"]]) for lane in lanes
    ]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.3))
    day_ms = 86_400_000
    epoch_day = float(mdates.date2num(dt.datetime(1970, 1, 1, tzinfo=dt.UTC)))  # type: ignore[no-untyped-call]
    for y, (_, runs) in enumerate(rows):
        spans = [(epoch_day + a / day_ms, (b - a) / day_ms) for a, b, _ in runs]
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=[STATE_COLORS[s] for _, _, s in runs])
    ax.set_yticks(list(range(len(rows))), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis_date()
    ax.legend(
        handles=[Patch(color=c, label=s.replace("_", " ")) for s, c in STATE_COLORS.items()],
        fontsize=7,
        ncol=5,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
    )
    ax.grid(axis="x", alpha=0.3)
    fig.autofmt_xdate()
    return _svg(fig)


def plots(report: dict[str, Any]) -> dict[str, str]:
    """Every plot of a report that has data, by name."""
    out: dict[str, str] = {}
    r = report["rates"]
    if r["perMinute"]:
        out["perMinute"] = rate_plot(r["perMinute"], "minute")
        out["perHour"] = rate_plot(r["perHour"], "hour")
    if report["capacity"]:
        out["capacity"] = capacity_plot(report["capacity"])
    if report["latency"]["byTopicConsumer"]:
        out["latency"] = latency_plot(report["latency"]["byTopicConsumer"])
    if report["errors"]["overTime"]["nodes"]:
        out["failures"] = failures_plot(report["errors"]["overTime"])
    for project, tl in report.get("queueFaults", {}).get("projects", {}).items():
        if tl["intervals"]:
            out[f"queueFaults:{project}"] = fault_timeline_plot(tl)
    return out
