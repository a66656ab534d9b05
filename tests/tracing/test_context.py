"""A message's W3C trace context: the producer's kept, else derived from the message id."""

from __future__ import annotations

from mqgate.core.ids import new_message_ids
from mqgate.core.trace_context import (
    TraceParent,
    context_of,
    derived_traceparent,
    parse_traceparent,
    request_context,
    with_traceparent,
)
from mqgate.tracing.events import TraceEvent
from mqgate.tracing.paths import build_path
from tests.tracing.conftest import event

HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_traceparent_parse() -> None:
    parsed = parse_traceparent(HEADER)
    assert parsed == TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert parsed.header() == HEADER and parsed.sampled
    assert parse_traceparent(HEADER.upper()) == parsed
    for bad in (
        None,
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # v00 has no more
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    ):
        assert parse_traceparent(bad) is None, bad
    future = parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more")
    assert future is not None and future.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_request_s_context_is_its_valid_header_as_version_00() -> None:
    assert request_context(HEADER) == HEADER
    assert request_context(HEADER.upper()) == HEADER
    assert request_context("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more") == HEADER
    assert request_context("garbage") is None and request_context(None) is None


def test_a_derived_context_is_valid_stable_and_its_own_per_message() -> None:
    ids = new_message_ids(1_700_000_000_000, 1000)  # one millisecond's run: ids differ in a counter
    derived = [derived_traceparent(i) for i in ids]
    assert derived == [derived_traceparent(i) for i in ids]  # every gateway derives the same
    parsed = [parse_traceparent(d) for d in derived]
    assert all(p is not None and p.sampled and p.header() == d for p, d in zip(parsed, derived, strict=True))
    assert len({p.trace_id for p in parsed if p}) == 1000
    # Pseudo-random, not the id's counter: a sampler reading a trace id's low bits (OpenTelemetry's
    # ratio sampler) keeps about half of them at ratio 0.5.
    low_half = sum(int(p.trace_id[16:], 16) < 2**63 for p in parsed if p)
    assert 400 < low_half < 600  # 1,000 fair draws: outside with a chance of about 1e-9


def test_a_message_s_context_is_its_own_valid_one_else_derived() -> None:
    assert context_of("m1", HEADER) == HEADER
    assert context_of("m1", None) == derived_traceparent("m1") == context_of("m1", "not a context")
    assert with_traceparent({}, HEADER) == {"traceparent": HEADER}
    own = {"traceparent": derived_traceparent("m2"), "shop": "17"}
    assert with_traceparent(own, HEADER) is own
    assert with_traceparent({"traceparent": "bad"}, HEADER) == {"traceparent": HEADER}


def test_a_path_shows_the_recorded_context_else_the_derived_one() -> None:
    hops: list[TraceEvent] = [event("m1", "accepted", 1000), event("m1", "stored", 1001)]
    assert build_path("m1", hops).traceparent == derived_traceparent("m1")
    given = [event("m1", "accepted", 1000), event("m1", "stored", 1001, traceparent=HEADER)]
    assert build_path("m1", given).traceparent == HEADER
