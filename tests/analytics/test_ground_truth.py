"""The report of a generated 8-hour load test against the generator's own figures: counts,
rates and capacities exactly, percentiles within the stated rank error, and each injected
fault localised to its node, service and queue."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mqgate.analytics import truth as truth_mod
from mqgate.analytics.generator import DEFAULT_START_MS, MINUTE_MS
from mqgate.analytics.latency import HOPS
from tests.analytics.conftest import Loaded

pytestmark = pytest.mark.slow

# The stated error of a percentile: within ±0.1% of rank of the exact value (Spark's
# percentile_approx at accuracy 10,000 promises ±0.01%).
RANK_ERROR = 0.001


@pytest.fixture(scope="module")
def truth(loaded: Loaded) -> truth_mod.Truth:
    return truth_mod.compute(loaded.trace)


def test_counts_are_exact_overall_and_per_project(loaded: Loaded, truth: truth_mod.Truth) -> None:
    counts = loaded.report["counts"]
    assert counts["total"] == truth.counts["all"]
    assert counts["byProject"] == {p: v for p, v in truth.counts.items() if p != "all"}
    # The faults show in the counts: refused produces, expiries and dead letters happened.
    assert counts["total"]["produced"] == 40_000
    assert (
        counts["total"]["failed"] > 0
        and counts["total"]["expired"] > 0
        and counts["total"]["deadLettered"] > 0
    )


def test_rates_per_minute_and_per_hour_are_exact(loaded: Loaded, truth: truth_mod.Truth) -> None:
    rates = loaded.report["rates"]
    per_hour = {
        p["t"]: {k: p[k] for k in ("accepted", "delivered", "acked", "errors")} for p in rates["perHour"]
    }
    assert per_hour == truth.per_hour
    # Eight hours of load (20:00 to 04:00 UTC), and the events after the last produce.
    assert sorted(per_hour)[:8] == [DEFAULT_START_MS + h * 3_600_000 for h in range(8)]
    per_minute = {
        p["t"]: {k: p[k] for k in ("accepted", "delivered", "acked", "errors")} for p in rates["perMinute"]
    }
    assert per_minute == truth.per_minute
    # The 3x burst of minutes 330-340 is the busiest stretch of accepted messages.
    busiest = max(per_minute, key=lambda t: per_minute[t]["accepted"])
    assert 330 <= (busiest - DEFAULT_START_MS) // MINUTE_MS < 340


def test_capacity_of_every_producer_consumer_client_and_gateway_is_exact(
    loaded: Loaded, truth: truth_mod.Truth
) -> None:
    got = {
        (c["role"], c["name"]): {k: c[k] for k in ("events", "peakPerS", "sustainedPerS")}
        for c in loaded.report["capacity"]
    }
    assert got == truth.capacity
    roles = {role for role, _ in got}
    assert roles == {"producer", "consumer", "client", "gateway"}
    for figures in got.values():
        assert figures["peakPerS"] >= figures["sustainedPerS"] > 0


def _exact_bounds(values: np.ndarray, q: float) -> tuple[int, int]:
    lo = values[max(0, int(np.floor((q - RANK_ERROR) * len(values))) - 1)]
    hi = values[min(len(values) - 1, int(np.ceil((q + RANK_ERROR) * len(values))))]
    return int(lo), int(hi)


def test_latency_percentiles_per_topic_and_consumer_are_within_the_stated_error(
    loaded: Loaded, truth: truth_mod.Truth
) -> None:
    groups = {g["topic"]: g for g in loaded.report["latency"]["byTopicConsumer"] if g["consumer"]}
    assert {(g["topic"], g["consumer"]) for g in groups.values()} == {
        ("orders", "billing"),
        ("clicks", "stats"),
        ("payments", "ledger"),
    }
    for topic, hops in truth.latency.items():
        for hop in HOPS:
            exact = hops[hop]
            figures = groups[topic][hop]
            assert figures["count"] == len(exact), (topic, hop)
            assert figures["max"] == int(exact[-1])
            for q in (0.5, 0.9, 0.99):
                lo, hi = _exact_bounds(exact, q)
                assert lo <= figures[f"p{round(q * 100)}"] <= hi, (topic, hop, q, lo, hi, figures)


def test_the_slowest_messages_are_listed_with_their_ids(loaded: Loaded, truth: truth_mod.Truth) -> None:
    slowest = loaded.report["latency"]["slowest"]
    assert [(s["endToEnd"], s["msgId"]) for s in slowest] == truth.slowest
    assert slowest[0]["topic"] == "clicks"  # redelivered after lock expiries: the slow consumer's


def _finding(report: dict[str, Any], kind: str, type_: str | None = None) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["kind"] == kind and (type_ is None or f.get("type") == type_)]
    assert len(found) == 1, report["findings"]
    return found[0]


def test_the_failing_gateway_is_localised(loaded: Loaded, truth: truth_mod.Truth) -> None:
    fault = truth.faults["failing gateway"]
    f = _finding(loaded.report, "failures", "unavailable")
    assert {f["node"]} == fault["nodes"] == {"gw-3"}
    assert set(f["services"]) == fault["services"] == {"order-api", "web", "pay-api"}
    assert f["queues"] == []  # refused before a queue was chosen
    assert (f["count"], f["startedMs"]) == (fault["count"], fault["firstMs"])
    by_node = {n["node"]: n["count"] for n in loaded.report["errors"]["byNode"]}
    assert by_node["gw-3"] == fault["count"]


def test_the_dead_queue_is_localised(loaded: Loaded, truth: truth_mod.Truth) -> None:
    fault = truth.faults["dead queue"]
    f = _finding(loaded.report, "failures", "ttl")
    assert {f["node"]} == fault["nodes"] == {"broker-a"}
    assert set(f["services"]) == fault["services"] == {"ledger"}
    assert [(q["project"], q["topic"], q["queue"]) for q in f["queues"]] == [("pay", "payments", 2)]
    assert (f["count"], f["startedMs"]) == (fault["count"], fault["firstMs"])
    by_queue = {(q["topic"], q["queue"]): q["count"] for q in loaded.report["errors"]["byQueue"]}
    assert by_queue[("payments", 2)] == fault["count"]  # the only payments queue with failures
    assert not any(t == "payments" and q not in (2, None) for t, q in by_queue)  # None: refused produces


def test_the_slow_consumer_is_localised(loaded: Loaded, truth: truth_mod.Truth) -> None:
    fault = truth.faults["slow consumer"]
    slow = _finding(loaded.report, "slow consumer")
    assert (slow["node"], slow["service"], slow["topic"]) == ("stats-2@10.0.2.2", "stats", "clicks")
    f = _finding(loaded.report, "failures", "lock_expired")
    assert {f["node"]} == fault["nodes"] == {"stats-2@10.0.2.2"}
    assert set(f["services"]) == fault["services"] == {"stats"}
    assert {(q["topic"], q["queue"]) for q in f["queues"]} == {(t, q) for _, t, q in fault["queues"]}
    assert (f["count"], f["startedMs"]) == (fault["count"], fault["firstMs"])
    # Its peer, and the other consumers, are not named.
    named = {x["node"] for x in loaded.report["findings"]}
    assert named == {"gw-3", "broker-a", "stats-2@10.0.2.2"}


def test_malformed_records_are_counted_and_reported(loaded: Loaded) -> None:
    m = loaded.report["malformed"]
    assert m["count"] == loaded.trace.spec.malformed == 7
    assert sum(m["byReason"].values()) == 7
    assert m["byReason"]["unknown hop"] == 1
    assert "teleported" in " ".join(s["sample"] for s in m["samples"])
