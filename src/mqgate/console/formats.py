"""How the console writes numbers, counts, durations, moments and names: one place, so every page
says "1 copy" and "5.0 ms", never "1 copies" or "4.999999999881766"."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

_IRREGULAR: Final = {"copy": "copies", "entry": "entries", "query": "queries", "retry": "retries"}


def number(n: float | None) -> str:
    """A count with thousands separators; a fraction to at most two places."""
    if n is None:
        return "—"
    if isinstance(n, int) or float(n).is_integer():
        return f"{int(n):,}"
    return f"{n:,.2f}".rstrip("0").rstrip(".")


def plural(word: str, n: int) -> str:
    if n == 1:
        return word
    return _IRREGULAR.get(word, word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s"))


def count(n: int | None, word: str, words: str | None = None) -> str:
    """`n` things: "1 copy", "2 copies", "12,000 messages" (`words`: an irregular plural)."""
    if n is None:
        return "—"
    return f"{number(n)} {word if n == 1 else (words or plural(word, n))}"


def millis(ms: float | None) -> str:
    """A latency: "<0.01 ms", "0.42 ms", "5.0 ms", "1,250 ms" (never "0.00 ms": a probe that
    answers takes some time)."""
    if ms is None:
        return "—"
    if round(ms, 2) < 0.01:
        return "<0.01 ms"
    if round(ms, 2) < 1:  # 0.999 is "1.0 ms", not "1.00 ms"
        return f"{ms:.2f} ms"
    if round(ms, 1) < 100:
        return f"{ms:.1f} ms"
    return f"{round(ms):,} ms"


def retention(ms: int) -> str:
    """A retention as people say it: "7 days", "36 hours", "90 minutes"."""
    for unit_ms, unit in ((86_400_000, "day"), (3_600_000, "hour"), (60_000, "minute"), (1000, "second")):
        if ms >= unit_ms and ms % unit_ms == 0:
            return count(ms // unit_ms, unit)
    if ms >= 3_600_000:
        return f"{round(ms / 3_600_000, 1):g} hours"
    return count(ms, "millisecond")


def per_second(value: float | None) -> str:
    return "no data" if value is None else f"{number(round(value, 2))}/s"


def size(value: int) -> str:
    """Bytes: "1.50 KiB", "1 byte"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:,.2f} {unit}"
    return count(value, "byte")


def in_seconds(ms: int) -> str:
    """How long until a moment `ms` away, rounded to what a reader needs."""
    if ms <= 0:
        return "now"
    return f"in {number(round(ms / 1000, 1))} s" if ms < 60_000 else f"in {number(round(ms / 60_000))} min"


def offsets(first: int, end: int) -> str:
    """The records from `first` up to (not including) `end`: "offsets 0–9 (10 records)"."""
    n = end - first
    if n <= 0:
        return "no records"
    if n == 1:
        return f"offset {number(first)} (1 record)"
    return f"offsets {number(first)}–{number(end - 1)} ({count(n, 'record')})"


def elapsed(ms: float | None) -> str:
    """Time between two moments a reader compares: "12 ms", "6.1 s", "4 min 10 s"."""
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{round(ms):,} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return duration(ms)


def offset_range(first: int, end: int) -> str:
    """The offsets from `first` up to (not including) `end`, uncounted: "offsets 0–68"."""
    if end - first <= 0:
        return "no offsets"
    if end - first == 1:
        return f"offset {number(first)}"
    return f"offsets {number(first)}–{number(end - 1)}"


def duration(ms: float | None) -> str:
    """A span: "850 ms", "12 s", "4 min 10 s", "3 h 5 min"."""
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{round(ms):,} ms"
    s = round(ms / 1000)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    return f"{s // 3600:,} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")


# How a finding's evidence is labelled and written (queuestate/diagnosis.py names the keys).
_EVIDENCE_LABELS: Final = {
    "backlog_by_queue": "backlog by queue",
    "growth_per_s": "growth",
    "acked_per_s": "acked",
    "error_ratio": "failed",
    "last_pull_ms": "last pull",
    "silent_ms": "silent for",
}


def evidence_items(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A finding's evidence as (label, text) pairs a person reads: series as "3 → 5 → 8",
    maps as "queue 0: 12 · queue 1: 3", moments and spans in words, ratios in percent."""
    items = []
    for key in sorted(evidence):
        value = evidence[key]
        label = _EVIDENCE_LABELS.get(key, key.replace("_", " "))
        items.append((label, _evidence_text(key, value)))
    return items


def _evidence_text(key: str, value: Any) -> str:
    if value is None:
        return "never" if key.startswith("last_") else "—"
    if isinstance(value, list):
        return " → ".join(number(x) for x in value) if value else "none"
    if isinstance(value, dict):
        if not value:
            return "none"
        name = "queue " if key.endswith("_by_queue") else ""
        return " · ".join(f"{name}{k}: {number(x)}" for k, x in value.items())
    if key.endswith("_ratio"):
        return f"{value * 100:.1f} %"
    if key.endswith("_per_s"):
        return f"{number(value)}/s"
    if key.startswith("last_") and key.endswith("_ms"):
        return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if key.endswith("_ms"):
        return duration(value)
    if isinstance(value, int | float):
        return number(value)
    return str(value)


# The SQS API's records (docs/SQS.md): topic `sqs.<account>.<queue>`, its `.c` and `.p`.
_SQS_NAME: Final = re.compile(r"sqs\.(\d{12})\.([A-Za-z0-9_-]{1,80}(?:\.fifo)?)(?:\.[cp])?")


def sqs_queue(name: str) -> tuple[str, str] | None:
    """(account, queue) when `name` is an SQS queue's topic, consumer or producer."""
    m = _SQS_NAME.fullmatch(name)
    return (m.group(1), m.group(2)) if m else None


TEMPLATE_GLOBALS: Final = {
    "sqs_queue": sqs_queue,
    "duration": duration,
    "evidence_items": evidence_items,
    "number": number,
    "count": count,
    "plural": plural,
    "millis": millis,
    "retention": retention,
    "per_second": per_second,
    "size": size,
    "in_seconds": in_seconds,
    "offsets": offsets,
    "offset_range": offset_range,
    "elapsed": elapsed,
}
