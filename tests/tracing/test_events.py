"""The trace event on the wire, the fields a policy keeps and a message's path from its events."""

from __future__ import annotations

import msgspec
import pytest

from mqgate.tracing.events import (
    TRACE_TOPIC_PREFIX,
    decode_event,
    encode_event,
    keep_fields,
    project_of_trace_topic,
    trace_topic,
)
from mqgate.tracing.paths import build_path
from mqgate.tracing.policy import Level, Mode, recorded_fields
from tests.tracing.conftest import GATEWAY, event


def test_an_event_encodes_compactly_and_round_trips() -> None:
    e = event(
        "m1", "stored", 1000, queue=3, offset=42, keys=["k1"], traceparent=f"00-{'1' * 32}-{'2' * 16}-01"
    )
    raw = encode_event(e)
    as_json = msgspec.json.decode(raw)
    assert (
        as_json["msgId"] == "m1" and as_json["timeMs"] == 1000 and as_json["resource"]["gatewayId"] == "gw-1"
    )
    # Unset optional fields are not on the wire.
    assert "consumer" not in as_json and "errorType" not in as_json and "status" not in as_json
    assert decode_event(raw) == e
    with pytest.raises(msgspec.ValidationError):
        decode_event(b'{"msgId": "m1", "hop": "teleported", "timeMs": 1, "project": "p", "topic": "t",'
                     b' "resource": {"gatewayId": "g"}}')  # fmt: skip


def test_trace_topic_names() -> None:
    assert trace_topic("shop") == TRACE_TOPIC_PREFIX + "shop" == "%TRACE%shop"
    assert project_of_trace_topic("%TRACE%shop") == "shop"
    assert project_of_trace_topic("orders") is None


def test_keep_fields_drops_what_the_policy_does_not_keep_and_cuts_the_body() -> None:
    full = event(
        "m1", "dead_lettered", 5, status="error", consumer="c1", producer="p1", queue=1, body="é" * 100,
        error_type="max_attempts", error_node="gw-2", detail="5 attempts", client_addr="10.0.0.1:5000",
    )  # fmt: skip
    info = keep_fields(full, recorded_fields([Mode.SERVICE], Level.INFO), body_max_bytes=10)
    assert (info.consumer, info.producer, info.queue) == ("c1", "p1", 1)
    assert info.body is None and info.error_type is None and info.detail is None
    assert info.status == "error"  # a failed hop is recorded as failed at every level
    error = keep_fields(full, recorded_fields([Mode.SERVICE], Level.ERROR), body_max_bytes=10)
    assert (error.error_type, error.error_node, error.detail) == ("max_attempts", "gw-2", None)
    debug = keep_fields(full, recorded_fields([Mode.SERVICE], Level.DEBUG), body_max_bytes=10)
    assert debug.detail == "5 attempts" and debug.body == "é" * 5
    route = keep_fields(full, recorded_fields([Mode.ROUTE], Level.INFO), body_max_bytes=1000)
    assert route.body == "é" * 100 and route.queue is None and route.client_addr is None


def test_a_path_orders_hops_with_latencies_and_names_the_failure() -> None:
    events = [
        event("m1", "delivered", 130, consumer="c1", client_id="cl-1", request_id="r1", queue=0),
        event("m1", "accepted", 100, producer="p1", keys=["order-9"]),
        event("m1", "stored", 100, queue=0, offset=7),
        event(
            "m1",
            "lock_expired",
            200,
            status="error",
            consumer="c1",
            error_type="lock_expired",
            error_node="gw-2",
            level="error",
        ),
        event("m1", "redelivered", 200, attempt=2),
    ]
    path = build_path("m1", events)
    assert [h.hop for h in path.hops] == ["accepted", "stored", "delivered", "lock_expired", "redelivered"]
    assert [h.latency_ms for h in path.hops] == [None, 0, 30, 70, 0]
    assert path.keys == ["order-9"] and path.producer == "p1" and path.level == "error"
    assert path.hops[2].consumer == "c1" and path.hops[2].client_id == "cl-1"
    assert path.hops[0].resource == GATEWAY
    [failed] = path.failures
    assert failed.hop == "lock_expired" and failed.failure is not None
    assert (failed.failure.node, failed.failure.service, failed.failure.cause) == (
        "gw-2",
        "c1",
        "lock_expired",
    )
