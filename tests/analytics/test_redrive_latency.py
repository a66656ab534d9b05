"""Issue 27: the figures of messages that went through the retry queue, a dead letter and a
redrive, or to two consumer groups, from events shaped as the gateway traces them (hops at
the retry queue and the inbox name it as their `source` and have no queue; a refused ack is
an `acked` hop with status error; a redrive is a `redriven` hop, then a delivery from the
inbox with the attempts counted from 1 again)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from mqgate.analytics.generator import DEFAULT_START_MS
from mqgate.analytics.ingest import ingest_frame
from mqgate.analytics.job import build_report
from mqgate.analytics.render import render_html
from mqgate.analytics.reports import Window
from mqgate.tracing.events import Resource, TraceEvent, encode_event

pytestmark = pytest.mark.slow

T0 = DEFAULT_START_MS
RETRY, INBOX = "%RETRY%billing", "%INBOX%billing"


def _event(msg: str, hop: str, t: int, **fields: Any) -> TraceEvent:
    return TraceEvent(
        msg_id=msg,
        hop=hop,  # type: ignore[arg-type]
        time_ms=T0 + t,
        project="shop",
        topic="orders",
        resource=Resource("gw-1", service="mqgate"),
        **fields,
    )


def _dead_lettered_through_the_retry_queue(msg: str, queue: int) -> list[TraceEvent]:
    """Stored in `queue`, delivered twice (the second time from the retry queue), both locks
    expired, dead-lettered from the retry queue; redriven 300 s later and delivered again."""
    c = {"consumer": "billing"}
    return [
        _event(msg, "accepted", 0, producer="order-api"),
        _event(msg, "stored", 2, queue=queue, offset=0, producer="order-api"),
        _event(msg, "delivered", 30, queue=queue, offset=0, client_id="b-1", attempt=1, **c),
        _event(msg, "lock_expired", 5_100, queue=queue, offset=0, attempt=1, **c),
        _event(msg, "redelivered", 5_100, queue=queue, offset=0, attempt=2, **c),
        _event(msg, "due", 6_100, source=RETRY),
        _event(msg, "stored", 6_100, source=RETRY, offset=0, detail=RETRY),
        _event(msg, "delivered", 6_130, source=RETRY, offset=0, client_id="b-2", attempt=2, **c),
        _event(msg, "lock_expired", 11_200, source=RETRY, offset=0, attempt=2, **c),
        _event(
            msg,
            "dead_lettered",
            11_200,
            source=RETRY,
            offset=0,
            attempt=2,
            status="error",
            error_type="max_attempts",
            error_node="billing",
            **c,
        ),
        _event(msg, "redriven", 300_000, source=INBOX, offset=0, **c),
        _event(msg, "delivered", 300_050, source=INBOX, offset=0, client_id="b-1", attempt=1, **c),
    ]


def scenario() -> list[TraceEvent]:
    events: list[TraceEvent] = []
    # Redriven, not acked since; the first client's late ack (after its lock expired) refused.
    events += _dead_lettered_through_the_retry_queue("m-redriven-open", 1)
    events.append(
        _event(
            "m-redriven-open",
            "acked",
            5_600,
            queue=1,
            offset=0,
            consumer="billing",
            client_id="b-1",
            status="error",
            error_type="lock_expired",
            error_node="billing",
        )
    )
    # Redriven and acked from the inbox 80 ms after the redrive.
    events += _dead_lettered_through_the_retry_queue("m-redriven-acked", 3)
    events.append(
        _event("m-redriven-acked", "acked", 300_080, source=INBOX, consumer="billing", client_id="b-1")
    )
    # Two consumer groups: billing acks at once, audit is delivered later and has not acked.
    events += [
        _event("m-two-groups", "accepted", 0, producer="order-api"),
        _event("m-two-groups", "stored", 2, queue=0, offset=0, producer="order-api"),
        _event("m-two-groups", "delivered", 20, queue=0, offset=0, consumer="billing", client_id="b-1"),
        _event("m-two-groups", "acked", 40, queue=0, offset=0, consumer="billing", client_id="b-1"),
        _event("m-two-groups", "delivered", 500, queue=0, offset=0, consumer="audit", client_id="a-1"),
    ]
    # Plain: delivered once, acked.
    events += [
        _event("m-plain", "accepted", 0, producer="order-api"),
        _event("m-plain", "stored", 2, queue=2, offset=0, producer="order-api"),
        _event("m-plain", "delivered", 10, queue=2, offset=0, consumer="billing", client_id="b-2"),
        _event("m-plain", "acked", 25, queue=2, offset=0, consumer="billing", client_id="b-2"),
    ]
    # A produce the gateway refused: it failed before any queue was chosen.
    events.append(
        _event(
            "m-refused",
            "failed",
            7,
            producer="order-api",
            status="error",
            error_type="unavailable",
            error_node="gw-3",
        )
    )
    return events


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rows = [
        (
            "%TRACE%shop",
            0,
            offset,
            dt.datetime.fromtimestamp(e.time_ms / 1000, dt.UTC),
            encode_event(e).decode(),
        )
        for offset, e in enumerate(scenario())
    ]
    raw = spark.createDataFrame(
        rows, "topic string, queue int, offset long, timestamp timestamp, body string"
    )
    out: Path = tmp_path_factory.mktemp("redrive") / "out"
    ingest_frame(raw, out)
    return build_report(spark, out, Window())


def _all_figures(report: dict[str, Any]) -> list[tuple[str, str, Any]]:
    lat = report["latency"]
    found: list[tuple[str, str, Any]] = []
    groups = [("overall", lat["overall"])]
    groups += [(f"{g['topic']}/{g['consumer']}", g) for g in lat["byTopicConsumer"]]
    groups += [(f"client {g['client']}", g) for g in lat["byClient"]]
    groups += [("redrive", lat["redrive"]["overall"])] if "redrive" in lat else []
    for name, g in groups:
        for hop in ("store", "deliver", "process", "endToEnd"):
            if hop in g:
                found += [(name, f"{hop}.{q}", g[hop][q]) for q in ("p50", "p90", "p99", "max")]
    for s in lat["slowest"]:
        found += [(s["msgId"], hop, s[hop]) for hop in ("store", "deliver", "process", "endToEnd")]
    return found


def test_no_phase_is_ever_negative(report: dict[str, Any]) -> None:
    negative = [f for f in _all_figures(report) if f[2] is not None and f[2] < 0]
    assert negative == []


def test_processing_time_pairs_each_ack_with_the_delivery_it_acked(report: dict[str, Any]) -> None:
    lat = report["latency"]
    groups = {(g["topic"], g["consumer"]): g for g in lat["byTopicConsumer"]}
    # billing acked two messages of their first path: m-plain (15 ms) and m-two-groups (20 ms);
    # a refused ack is no ack, and the redriven ones are counted in their redrive.
    assert groups[("orders", "billing")]["process"]["count"] == 2
    assert groups[("orders", "billing")]["process"]["max"] == 20
    # audit was delivered m-two-groups 498 ms after it was stored and has not acked it.
    audit = groups[("orders", "audit")]
    assert (audit["deliver"]["max"], audit["process"]["count"], audit["endToEnd"]["count"]) == (498, 0, 0)


def test_a_redrive_is_its_own_path_segment_not_part_of_the_end_to_end_time(report: dict[str, Any]) -> None:
    lat = report["latency"]
    # End to end is produce to ack along one path: m-redriven-acked was dead-lettered on its
    # first, so its ack after the redrive is not a 300-second end-to-end time.
    assert [(s["msgId"], s["endToEnd"]) for s in lat["slowest"]] == [("m-two-groups", 40), ("m-plain", 25)]
    assert lat["overall"]["endToEnd"]["max"] == 40
    redrive = lat["redrive"]
    assert (redrive["redriven"], redrive["acked"]) == (2, 1)
    overall = redrive["overall"]
    # redriven -> first delivery from the inbox, that delivery -> its ack, redriven -> ack.
    assert (overall["deliver"]["max"], overall["process"]["max"], overall["endToEnd"]["max"]) == (50, 30, 80)
    # Not acked along their first path: the two dead letters, audit's copy, the refused produce.
    assert lat["unacked"] == 4


def test_findings_name_the_queue_a_message_dead_lettered_after_storing_was_stored_in(
    report: dict[str, Any],
) -> None:
    findings = {f.get("type"): f for f in report["findings"] if f["kind"] == "failures"}
    dead = findings["max_attempts"]
    assert [(q["topic"], q["queue"]) for q in dead["queues"]] == [("orders", 1), ("orders", 3)]
    assert findings["unavailable"]["queues"] == []  # refused before a queue was chosen
    by_queue = {(q["topic"], q["queue"]): q["count"] for q in report["errors"]["byQueue"]}
    assert by_queue == {("orders", 1): 2, ("orders", 3): 1, ("orders", None): 1}
    html = render_html({**report, "queueFaults": None}, {}, None)
    assert "queues orders/1, orders/3," in html
    assert html.count("none (before storing)") == 1  # the refused produce's finding only
