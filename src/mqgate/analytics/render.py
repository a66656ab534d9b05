"""The report as one self-contained HTML page (plots inline as SVG, no external file) and
as JSON (every figure the page shows, and the data behind each plot)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{padding:3px 10px;border-bottom:1px solid #ddd}
th{text-align:left;background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
h2{border-bottom:2px solid #4477aa;padding-bottom:3px;margin-top:1.6em}.note{color:#666}
.finding{background:#fff4e5;border-left:4px solid #ee6677;padding:6px 10px;margin:6px 0}
"""


def _cell(value: Any) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], empty: str = "none") -> str:
    if not rows:
        return f'<p class="note">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(k)) for k, _ in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _latency_rows(groups: list[dict[str, Any]], hops: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for g in groups:
        row = {k: g.get(k) for k in ("topic", "consumer", "client")}
        for h in hops:
            for q in ("p50", "p90", "p99", "max"):
                row[f"{h}.{q}"] = g[h][q]
            row[f"{h}.count"] = g[h]["count"]
        rows.append(row)
    return rows


def _finding_queues(f: dict[str, Any]) -> str:
    """The queues a cause's failed messages were stored in; those it hit before a queue was
    chosen (a refused produce) and those whose queue the window does not show, counted."""
    named = [f"{q['topic']}/{q['queue']}" for q in f["queues"]]
    before, unknown = f.get("beforeStoring", 0), f.get("queueUnknown", 0)
    if unknown:
        named.append(f"unknown for {unknown:,} (no stored hop with a queue in the window)")
    if not named:
        return "none (before storing)"
    if before:
        named.append(f"none for {before:,} (before storing)")
    return ", ".join(named)


def _finding(f: dict[str, Any]) -> str:
    if f["kind"] == "slow consumer":
        text = (
            f"Slow consumer: client {f['node']} of {f['service']} (topic {f['topic']}) processes in "
            f"{f['processP50Ms']:,} ms (median; p99 {f['processP99Ms']:,} ms) against {f['peersP50Ms']:,} ms "
            "for its peers."
        )
    else:
        queues = _finding_queues(f)
        text = (
            f"{f['count']:,} failures ({f['share']:.1%}) of type {f['type']} at node {f['node']}, "
            f"services {', '.join(f['services']) or '-'}, queues {queues}, "
            f"from {f['started']} to {f['last']}."
        )
    return f'<div class="finding">{html.escape(text)}</div>'


def _redrive(section: dict[str, Any] | None) -> list[str]:
    """The paths after a redrive, apart from the first paths above (docs/ANALYTICS.md)."""
    if not section or not section["redriven"]:
        return []
    hops = ("deliver", "process", "endToEnd")
    groups = section["byTopicConsumer"]
    rows = [
        {**row, "redriven": g["redriven"], "acked": g["acked"]}
        for g, row in zip(groups, _latency_rows(groups, hops), strict=True)
    ]
    cols = [("topic", "topic"), ("consumer", "consumer"), ("redriven", "redriven"), ("acked", "acked")]
    cols += [(f"{h}.{q}", f"{h} {q}") for h in hops for q in ("p50", "p99", "max")]
    title = f"After a redrive ({section['redriven']:,} dead letters redriven, {section['acked']:,} acked)"
    return [
        f"<h3>{title}</h3>",
        '<p class="note">Each redrive is a path of its own: redriven → first delivery (deliver), '
        "that delivery → its ack (process), redriven → ack (endToEnd). The times above are of the "
        "first path only: a message dead-lettered there is not acked, whatever its redrive did.</p>",
        table(rows, cols),
    ]


def _causes(causes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**c, "queues": [f"{q['topic']}/{q['queue']}" for q in c["queues"]]} for c in causes]


def _queue_faults(section: dict[str, Any] | None, svgs: dict[str, str]) -> list[str]:
    parts = ["<h2>Queue fault vs consumer fault over time (queue state)</h2>"]
    if section is None:
        return [*parts, '<p class="note">not read: no gateway (--report-only) and no --queue-state-url</p>']
    src = section["source"]
    parts.append(
        f"<p>From the {'history at ' if src['kind'] == 'history' else 'gateway at '}"
        f"{html.escape(src['url'])}, judged interval by interval with the gateway's health rules "
        "(queue-side rules on each interval alone; a consumer-side finding marks the intervals from "
        "its start).</p>"
    )
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in section["notes"]]
    if not section["projects"]:
        parts.append('<p class="note">no queue state recorded in this window</p>')
    state_cols = [("project", "project"), ("intervals", "intervals"), ("healthy", "healthy"),
                  ("queueFault", "queue fault"), ("consumerFault", "consumer fault"),
                  ("queueAndConsumerFault", "both"), ("noData", "no data")]  # fmt: skip
    rows = [{"project": p, **tl["totals"]} for p, tl in section["projects"].items()]
    if rows:
        parts.append(table(rows, state_cols))
    run_cols = [("side", "side"), ("rule", "rule"), ("topic", "topic"), ("queue", "queue"),
                ("consumer", "consumer"), ("from", "from"), ("to", "to"), ("intervals", "intervals"),
                ("summary", "first finding")]  # fmt: skip
    for project, tl in section["projects"].items():
        parts.append(f"<h3>{html.escape(project)} (intervals of {tl['intervalMs'] / 1000:g} s)</h3>")
        parts.append(svgs.get(f"queueFaults:{project}", ""))
        parts.append(table(tl["runs"], run_cols, "no fault in this window"))
    return parts


def render_html(report: dict[str, Any], svgs: dict[str, str], trace_link: str | None) -> str:
    w = report["window"]
    title = f"mqgate trace analytics: {w['project'] or 'all projects'}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"]
    parts.append(f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>")
    parts.append(
        f"<p>Window: {html.escape(str(w['from'] or 'start'))} to {html.escape(str(w['to'] or 'end'))}. "
        f"Generated {html.escape(report['generated'])}; {report['counts']['total']['events']:,} events.</p>"
    )
    for note in report["notes"]:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    parts.append("<h2>Findings</h2>")
    parts += [_finding(f) for f in report["findings"]] or ['<p class="note">no fault found</p>']
    c = report["counts"]
    parts.append("<h2>Messages</h2>")
    counted = ("produced", "stored", "delivered", "redelivered", "acked", "released", "failed", "expired")
    cols = [(k, k) for k in counted]
    cols = [("project", "project"), *cols, ("lockExpired", "lock expired"), ("deadLettered", "dead-lettered"),
            ("events", "events")]  # fmt: skip
    rows = [{"project": p, **v} for p, v in c["byProject"].items()] + [{"project": "all", **c["total"]}]
    parts.append(table(rows, cols))
    m = report["malformed"]
    parts.append(
        f"<p>Malformed trace records: {m['count']:,}"
        + (f" ({html.escape(json.dumps(m['byReason']))})" if m["count"] else "")
        + "</p>"
    )
    parts.append("<h2>Rates</h2>")
    for name in ("perMinute", "perHour"):
        if name in svgs:
            parts.append(svgs[name])
    ser = ("accepted", "delivered", "acked", "errors")
    parts.append(table(report["rates"]["perHour"], [("time", "hour (UTC)"), *((s, s) for s in ser)]))
    parts.append("<h2>Capacity (events per second)</h2>")
    parts.append(svgs.get("capacity", ""))
    cap_cols = [
        ("role", "role"),
        ("name", "name"),
        ("events", "events"),
        ("sustainedPerS", "sustained/s"),
        ("peakPerS", "peak/s"),
        ("peakAt", "peak at"),
    ]
    parts.append(table(report["capacity"], cap_cols))
    lat = report["latency"]
    parts.append(f"<h2>Latency (ms; percentiles within ±{1 / lat['accuracy']:.2%} rank)</h2>")
    parts.append(svgs.get("latency", ""))
    hops = ("store", "deliver", "process", "endToEnd")
    lat_cols = [("topic", "topic"), ("consumer", "consumer")]
    lat_cols += [(f"{h}.{q}", f"{h} {q}") for h in hops for q in ("p50", "p99", "max")]
    parts.append(table(_latency_rows(lat["byTopicConsumer"], hops), lat_cols))
    client_cols = [
        ("topic", "topic"),
        ("client", "client"),
        *((f"process.{q}", f"process {q}") for q in ("count", "p50", "p90", "p99", "max")),
    ]
    parts.append(table(_latency_rows(lat["byClient"], ("process",)), client_cols))
    parts += _redrive(lat.get("redrive"))
    e = report["errors"]
    parts.append(f"<h2>Errors ({e['total']:,} failed hops)</h2>")
    parts.append(svgs.get("failures", ""))
    when = [("count", "failures"), ("first", "first"), ("last", "last")]
    parts.append(
        "<h3>Causes</h3>"
        + table(
            _causes(e["causes"]),
            [("type", "type"), ("node", "node"), ("services", "services"), ("queues", "queues"), *when],
        )
    )
    for key, cols_ in (
        ("byNode", [("node", "node")]),
        ("byService", [("service", "service")]),
        ("byQueue", [("project", "project"), ("topic", "topic"), ("queue", "queue")]),
        ("byType", [("type", "type")]),
    ):
        parts.append(f"<h3>{key[2:]}</h3>" + table(e[key], [*cols_, *when]))
    parts += _queue_faults(report.get("queueFaults"), svgs)
    parts.append(f"<h2>Slowest messages (end to end; {lat['unacked']:,} not acked in the window)</h2>")
    slow = []
    for s in lat["slowest"]:
        ident = html.escape(s["msgId"])
        link = f'<a href="{html.escape(trace_link + quote(s["msgId"]))}">{ident}</a>' if trace_link else ident
        slow.append({**s, "msgId": link})
    slow_cols = [
        ("msgId", "message"),
        ("topic", "topic"),
        ("consumer", "consumer"),
        ("client", "client"),
        *((h, h) for h in hops),
    ]
    rendered = table(slow, slow_cols)
    for s in slow:  # the links are markup, not text
        rendered = rendered.replace(html.escape(s["msgId"]), s["msgId"], 1)
    parts.append(rendered)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    report: dict[str, Any], svgs: dict[str, str], out: Path, trace_link: str | None
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    html_path, json_path = out / "report.html", out / "report.json"
    html_path.write_text(render_html(report, svgs, trace_link), encoding="utf-8")
    json_path.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return html_path, json_path
