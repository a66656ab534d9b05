"""Aggregation mode (SPEC E6): when a key's pending aggregate is written to its final table.

Workers add each newly applied event to a pending row per (type, key) in the same
transaction as the ledger, so a count can never be applied twice. A pending row is flushed
into the final table when it has `count` events or is `age_s` old, and every pending row is
flushed when the pipeline shuts down.
"""

from __future__ import annotations

from typing import Final

import msgspec

REASON_COUNT: Final = "count"
REASON_AGE: Final = "age"
REASON_SHUTDOWN: Final = "shutdown"


class FlushRule(msgspec.Struct, frozen=True):
    count: int
    age_s: float


def flush_reason(count: int, first_ms: int, now_ms: int, rule: FlushRule, shutdown: bool) -> str | None:
    """Why a pending aggregate of `count` events, the first pending since `first_ms`, is flushed
    now, or None when it stays pending."""
    if count >= rule.count:
        return REASON_COUNT
    if now_ms - first_ms >= rule.age_s * 1000:
        return REASON_AGE
    if shutdown and count > 0:
        return REASON_SHUTDOWN
    return None
