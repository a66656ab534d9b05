"""The trace index on SQLite and PostgreSQL: paths by message id, request id and key in time
order with latencies, positions moved only from where they were, retention by age and count."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from mqgate.tracing.events import TraceEvent, encode_event
from mqgate.tracing.index import IndexRow, PositionMove, StalePositions, TraceIndex
from tests.tracing.conftest import event

DAY_MS = 24 * 3600 * 1000


def rows(*events: TraceEvent) -> list[IndexRow]:
    return [IndexRow(e.msg_id, e.request_id, e.time_ms, e.keys, encode_event(e).decode()) for e in events]


def test_paths_by_msg_id_request_id_and_key(index: TraceIndex) -> None:
    first = [
        event("m1", "accepted", 1_000, producer="p1", keys=["order-7"]),
        event("m1", "stored", 1_002, queue=1, offset=40, keys=["order-7"]),
        event("m2", "accepted", 1_005, producer="p1", keys=["order-7", "vip"]),
    ]
    second = [
        event("m1", "delivered", 1_050, consumer="c1", client_id="cl-1", request_id="req-1"),
        event("m2", "stored", 1_006, queue=0, offset=3),
        event("m2", "delivered", 1_051, consumer="c1", client_id="cl-1", request_id="req-1"),
        event("m1", "released", 1_090, consumer="c1", request_id="req-1"),
        event(
            "m1",
            "dead_lettered",
            1_100,
            status="error",
            error_type="max_attempts",
            error_node="gw-1",
            consumer="c1",
            detail="3 attempts",
        ),
    ]
    index.write(rows(*first), {("%TRACE%shop", 0): PositionMove(None, 3)})
    index.write(rows(*second), {("%TRACE%shop", 0): PositionMove(3, 8)})
    assert index.positions() == {("%TRACE%shop", 0): 8}

    [path] = index.paths(msg_id="m1")
    assert [h.hop for h in path.hops] == ["accepted", "stored", "delivered", "released", "dead_lettered"]
    assert [h.latency_ms for h in path.hops] == [None, 2, 48, 40, 10]
    assert path.hops[2].consumer == "c1" and path.hops[2].client_id == "cl-1"
    assert path.hops[1].queue == 1 and path.hops[1].offset == 40
    assert path.hops[-1].failure is not None and path.hops[-1].failure.cause == "max_attempts"
    assert path.hops[-1].failure.node == "gw-1" and path.hops[-1].failure.service == "c1"

    by_request = index.paths(request_id="req-1")
    assert [p.msg_id for p in by_request] == ["m1", "m2"]  # newest indexed event first
    assert [h.hop for h in by_request[1].hops] == ["accepted", "stored", "delivered"]
    by_key = index.paths(key="order-7")
    assert sorted(p.msg_id for p in by_key) == ["m1", "m2"]
    assert [p.msg_id for p in index.paths(key="vip")] == ["m2"]
    assert index.paths(msg_id="nothing") == [] and index.paths(key="nothing") == []
    with pytest.raises(ValueError):
        index.paths(msg_id="m1", key="order-7")


def test_no_time_window_a_year_old_path_is_found(index: TraceIndex) -> None:
    index.write(rows(event("old", "accepted", 1_000), event("old", "acked", 2_000)), {})
    [path] = index.paths(msg_id="old")
    assert [h.hop for h in path.hops] == ["accepted", "acked"]


def test_a_position_moves_only_from_where_it_was(index: TraceIndex) -> None:
    where = ("%TRACE%shop", 0)
    index.write(rows(event("a", "accepted", 1)), {where: PositionMove(None, 1)})
    with pytest.raises(StalePositions):  # another indexer created it first
        index.write(rows(event("b", "accepted", 2)), {where: PositionMove(None, 1)})
    with pytest.raises(StalePositions):  # another indexer moved it on
        index.write(rows(event("c", "accepted", 3)), {where: PositionMove(0, 1)})
    assert index.paths(msg_id="b") == [] and index.paths(msg_id="c") == []  # nothing of either
    assert index.positions() == {where: 1}
    assert index.counters.written == 1


def test_retention_by_count_and_by_age_is_counted(index: TraceIndex) -> None:
    now = 100 * DAY_MS
    old = [event(f"o{i}", "accepted", now - 10 * DAY_MS + i, keys=[f"k{i}"]) for i in range(30)]
    young = [event(f"y{i}", "accepted", now - DAY_MS + i, keys=[f"k{i}"]) for i in range(20)]
    index.write(rows(*old), {})
    index.write(rows(*young), {})
    assert index.event_count() == 50

    assert index.prune(now, max_age_ms=None, max_events=45) == 5  # the 5 oldest
    assert index.paths(msg_id="o4") == [] and index.paths(msg_id="o5") != []
    assert [p.msg_id for p in index.paths(key="k4")] == ["y4"]  # the key row of o4 went too

    assert index.prune(now, max_age_ms=7 * DAY_MS, max_events=None, chunk=10) == 10  # chunked
    assert index.prune(now, max_age_ms=7 * DAY_MS, max_events=None, chunk=10) == 10
    assert index.prune(now, max_age_ms=7 * DAY_MS, max_events=None, chunk=10) == 5
    assert index.prune(now, max_age_ms=7 * DAY_MS, max_events=None) == 0
    assert index.event_count() == 20 and index.counters.pruned == 30
    assert index.paths(msg_id="y0") != [] and index.paths(msg_id="o29") == []
    assert index.prune(now + 30 * DAY_MS, max_age_ms=7 * DAY_MS, max_events=None) == 20
    assert index.event_count() == 0 and index.paths(key="k1") == []


def test_request_and_key_answers_are_bounded(index_url: str) -> None:
    index = TraceIndex(index_url, max_paths=5)
    index.create_schema()
    try:
        index.write(
            rows(*(event(f"m{i}", "delivered", i, request_id="r", keys=["hot"]) for i in range(12))), {}
        )
        assert [p.msg_id for p in index.paths(request_id="r")] == [f"m{i}" for i in range(11, 6, -1)]
        assert [p.msg_id for p in index.paths(key="hot")] == [f"m{i}" for i in range(11, 6, -1)]
    finally:
        index.dispose()


def test_the_request_id_index_holds_only_hops_with_one_on_either_database(index: TraceIndex) -> None:
    """The partial index's condition reaches both dialects' DDL: PostgreSQL's is given when its
    schema is created (naming it in the table loads that dialect in every gateway)."""
    with index.engine.connect() as conn:
        if index.is_sqlite:
            ddl = conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE name = 'mqgate_trace_events_request'")
            ).scalar_one()
        else:
            ddl = conn.execute(
                sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = 'mqgate_trace_events_request'")
            ).scalar_one()
    assert "request_id IS NOT NULL" in ddl, ddl
