"""The report's plots, drawn with matplotlib (Agg, no display) as SVG text to embed inline."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

COLORS = {"accepted": "#4477aa", "delivered": "#66ccee", "acked": "#228833", "errors": "#ee6677"}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline in HTML


def _times(points: list[dict[str, Any]]) -> Any:  # datetimes: matplotlib's stubs want numbers
    return [dt.datetime.fromtimestamp(p["t"] / 1000, dt.UTC) for p in points]


def rate_plot(points: list[dict[str, Any]], unit: str) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    times = _times(points)
    for series, color in COLORS.items():
        values = [p[series] for p in points]
        if unit == "hour":
            ax.plot(times, values, marker="o", color=color, label=series)
        else:
            ax.plot(times, values, linewidth=0.8, color=color, label=series)
    ax.set_ylabel(f"events per {unit}")
    ax.legend(loc="upper left", fontsize=8, ncol=4)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _svg(fig)


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


def latency_plot(groups: list[dict[str, Any]]) -> str:
    hops = ("store", "deliver", "process", "endToEnd")
    fig, axes = plt.subplots(1, len(hops), figsize=(12, 0.4 * max(1, len(groups)) + 1.6), sharey=True)
    labels = [f"{g['topic']} / {g['consumer'] or '-'}" for g in groups]
    ys = range(len(groups))
    for ax, hop in zip(axes, hops, strict=True):
        for q, color, shift in (("p50", "#4477aa", -0.2), ("p99", "#ee6677", 0.2)):
            values = [max(g[hop][q] or 0, 0.5) for g in groups]
            ax.barh([y + shift for y in ys], values, height=0.4, color=color, label=q)
        ax.set_xscale("log")
        ax.set_title(hop, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(ys), labels, fontsize=8)
    axes[0].legend(fontsize=7)
    fig.supxlabel("milliseconds (log)", fontsize=9)
    return _svg(fig)


def failures_plot(over_time: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(10, 3))
    for node, points in over_time["nodes"].items():
        ax.plot(_times(points), [p["count"] for p in points], marker=".", label=node)
    ax.set_ylabel(f"failures per {over_time['bucketMs'] // 60_000} min")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _svg(fig)


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
