"""What went wrong with the gateway's storage, counted and shown instead of kept silent.

A `Health` counts faults by component ("message_log", "offsets_journal", "schedule_log", ...)
and kind ("corrupt_record_skipped", "torn_tail_cut", "disk_full", ...), logs each with its
running count, and holds the degraded states that last while a condition does (the disk below
its free-space floor: writes refused). `/healthz` shows `snapshot()`; the Prometheus counter
`mqgate_storage_faults_total{component,kind}` and the gauge `mqgate_degraded{condition}` show
the same in the gateway's metrics registry.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final

import msgspec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("mqgate.health")

# A fault that repeats (every refused produce while the disk is full) is logged at most this
# often; its count keeps going up meanwhile.
LOG_EVERY_S: Final = 10.0


class _Fault(msgspec.Struct):
    count: int = 0
    last: str = ""
    logged_at: float = -LOG_EVERY_S
    logged_count: int = 0


class Health:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._faults: dict[tuple[str, str], _Fault] = {}
        self._degraded: dict[str, str] = {}
        self._counter: Any = None
        self._gauge: Any = None
        if registry is not None:
            from prometheus_client import Counter, Gauge

            self._counter = Counter(
                "mqgate_storage_faults",
                "Storage faults (truncations, skipped or dropped records, failed writes and tasks)",
                ["component", "kind"],
                registry=registry,
            )
            self._gauge = Gauge(
                "mqgate_degraded", "1 while a degraded condition lasts", ["condition"], registry=registry
            )

    def fault(self, component: str, kind: str, detail: str, count: int = 1) -> None:
        """Count `count` faults of this kind and log them (repeats at most every LOG_EVERY_S)."""
        fault = self._faults.setdefault((component, kind), _Fault())
        fault.count += count
        fault.last = detail
        if self._counter is not None:
            self._counter.labels(component, kind).inc(count)
        now = time.monotonic()
        if now - fault.logged_at >= LOG_EVERY_S:
            log.error(
                "%s: %s x%d (%d in all, %d since last logged): %s",
                component,
                kind,
                count,
                fault.count,
                fault.count - fault.logged_count,
                detail,
            )
            fault.logged_at = now
            fault.logged_count = fault.count

    def degrade(self, condition: str, reason: str) -> None:
        if self._degraded.get(condition) != reason:
            log.error("degraded: %s: %s", condition, reason)
        self._degraded[condition] = reason
        if self._gauge is not None:
            self._gauge.labels(condition).set(1)

    def restore(self, condition: str) -> None:
        if self._degraded.pop(condition, None) is not None:
            log.warning("no longer degraded: %s", condition)
            if self._gauge is not None:
                self._gauge.labels(condition).set(0)

    def count(self, component: str, kind: str) -> int:
        fault = self._faults.get((component, kind))
        return 0 if fault is None else fault.count

    @property
    def degraded(self) -> dict[str, str]:
        return dict(self._degraded)

    def snapshot(self) -> dict[str, Any]:
        """{"status": "ok" | "degraded", "degraded": {condition: reason},
        "faults": [{"component", "kind", "count", "last"}]}."""
        return {
            "status": "degraded" if self._degraded else "ok",
            "degraded": dict(self._degraded),
            "faults": [
                {"component": c, "kind": k, "count": f.count, "last": f.last}
                for (c, k), f in sorted(self._faults.items())
            ],
        }
