"""Trace policies: matching (several policies → one trace at the highest level), validation,
and what each mode and level records (SPEC P2–P4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqgate.errors import BadRequest
from mqgate.tracing.policy import (
    DEBUG_FIELDS,
    ERROR_FIELDS,
    IDENTITY_FIELDS,
    Level,
    MatchedTrace,
    Mode,
    PolicySet,
    TracePolicy,
    cut_body,
    match,
    recorded_fields,
)


def test_levels_are_ordered_info_error_debug() -> None:
    assert Level.INFO < Level.ERROR < Level.DEBUG
    assert Level.parse("DEBUG") is Level.DEBUG and Level.DEBUG.label == "debug"
    with pytest.raises(BadRequest) as exc:
        Level.parse("verbose")
    assert exc.value.field == "level"


def test_each_mode_matches_its_selector_only() -> None:
    project = TracePolicy.create("p", "project", project="shop")
    route = TracePolicy.create("r", "route", topic="orders")
    queue = TracePolicy.create("q", "queue", topic="orders", queue=2)
    service = TracePolicy.create("s", "service", service="billing")
    where = {"project": "shop", "topic": "orders", "queue": 2, "services": ["web", "billing"]}
    for policy in (project, route, queue, service):
        assert match([policy], **where) is not None  # type: ignore[arg-type]
    assert match([project], project="other", topic="orders") is None
    assert match([route], project="shop", topic="payments") is None
    assert match([queue], project="shop", topic="orders", queue=1) is None
    assert match([queue], project="shop", topic="orders", queue=None) is None  # no queue chosen yet
    assert match([service], project="shop", topic="orders", services=["web"]) is None


def test_several_matching_policies_give_one_trace_at_the_highest_level() -> None:
    policies = [
        TracePolicy.create("a", "project", "info", project="shop"),
        TracePolicy.create("b", "route", "debug", topic="orders"),
        TracePolicy.create("c", "service", "error", service="web"),
        TracePolicy.create("d", "route", "debug", topic="payments"),  # does not match
    ]
    found = match(policies, project="shop", topic="orders", queue=0, services=("web",))
    assert found == MatchedTrace(
        Level.DEBUG, frozenset({Mode.PROJECT, Mode.ROUTE, Mode.SERVICE}), ("a", "b", "c")
    )
    assert PolicySet(policies).match(project="shop", topic="orders", queue=0, services=("web",)) == found
    assert match(policies, project="other", topic="x") is None


@pytest.mark.parametrize(
    ("mode", "selectors", "field"),
    [
        ("everything", {"project": "shop"}, "mode"),
        (None, {"project": "shop"}, "mode"),
        ("project", {}, "project"),
        ("route", {"project": "shop"}, "topic"),
        ("queue", {"topic": "orders"}, "queue"),
        ("queue", {"topic": "orders", "queue": -1}, "queue"),
        ("service", {"service": ""}, "service"),
        ("route", {"topic": "orders", "service": "web"}, "service"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(
    mode: object, selectors: dict[str, object], field: str
) -> None:
    with pytest.raises(BadRequest) as exc:
        TracePolicy.create("x", mode, "info", **selectors)  # type: ignore[arg-type]
    assert exc.value.field == field


def test_a_bad_level_is_refused_naming_level() -> None:
    with pytest.raises(BadRequest) as exc:
        TracePolicy.create("x", "project", "loud", project="shop")
    assert exc.value.field == "level"


def test_recorded_fields_follow_mode_and_level() -> None:
    route_info = recorded_fields([Mode.ROUTE], Level.INFO)
    assert {"producer", "consumer", "body", "status", "time_ms", "resource", "msg_id"} <= route_info
    assert "error_type" not in route_info and "detail" not in route_info
    assert "queue" not in route_info  # a route trace does not list the queue (P3)
    assert "project" in recorded_fields([Mode.QUEUE], Level.INFO)
    project_info = recorded_fields([Mode.PROJECT], Level.INFO)
    assert {"topic", "queue", "offset", "keys", "body", "producer", "consumer"} <= project_info
    service_info = recorded_fields([Mode.SERVICE], Level.INFO)
    assert "body" not in service_info  # P3 lists no content for a service
    assert {"producer", "consumer", "queue"} <= service_info

    service_error = recorded_fields([Mode.SERVICE], Level.ERROR)
    assert service_error == service_info | ERROR_FIELDS and "body" not in service_error
    service_debug = recorded_fields([Mode.SERVICE], Level.DEBUG)
    assert service_debug == service_error | DEBUG_FIELDS and "body" in service_debug
    # Several modes keep the union of their fields.
    assert recorded_fields([Mode.ROUTE, Mode.SERVICE], Level.INFO) == route_info | service_info


def test_cut_body_keeps_whole_characters() -> None:
    assert cut_body("héllo", 100) == "héllo"
    assert cut_body("héllo", 2) == "h"  # "é" is two bytes: not cut in half
    assert cut_body("héllo", 3) == "hé"
    assert cut_body("abc", 0) == ""


_names = st.sampled_from(["a", "b", "c"])
_levels = st.sampled_from(["info", "error", "debug"])


@st.composite
def _policy(draw: st.DrawFn) -> TracePolicy:
    mode = draw(st.sampled_from(list(Mode)))
    selectors: dict[str, object] = {
        Mode.PROJECT: {"project": draw(_names)},
        Mode.ROUTE: {"topic": draw(_names)},
        Mode.QUEUE: {"topic": draw(_names), "queue": draw(st.integers(0, 2))},
        Mode.SERVICE: {"service": draw(_names)},
    }[mode]
    return TracePolicy.create(
        f"{mode.value}-{draw(st.integers(0, 9))}", mode.value, draw(_levels), **selectors
    )  # type: ignore[arg-type]


_policies = st.lists(_policy(), max_size=8, unique_by=lambda p: p.id)


@given(_policies, _names, _names, st.one_of(st.none(), st.integers(0, 2)), st.lists(_names, max_size=2))
def test_match_is_the_max_level_over_matching_policies(
    policies: list[TracePolicy], project: str, topic: str, queue: int | None, services: list[str]
) -> None:
    found = match(policies, project=project, topic=topic, queue=queue, services=services)
    matching = [p for p in policies if p.matches(project, topic, queue, set(services))]
    if not matching:
        assert found is None
    else:
        assert found is not None
        assert found.level == max(p.level for p in matching)
        assert found.modes == {p.mode for p in matching}
        assert set(found.policy_ids) == {p.id for p in matching}
    indexed = PolicySet(policies).match(project=project, topic=topic, queue=queue, services=services)
    assert (indexed is None) == (found is None)
    if indexed is not None and found is not None:
        assert (indexed.level, indexed.modes, set(indexed.policy_ids)) == (
            found.level,
            found.modes,
            set(found.policy_ids),
        )


@given(st.sets(st.sampled_from(list(Mode))), st.sampled_from(list(Level)))
def test_a_higher_level_never_records_less(modes: set[Mode], level: Level) -> None:
    fields = recorded_fields(modes, level)
    assert fields >= IDENTITY_FIELDS
    for higher in Level:
        if higher > level:
            assert fields <= recorded_fields(modes, higher)
