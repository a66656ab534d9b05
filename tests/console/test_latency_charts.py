"""Produce→delivered latency charts from the trace index (issue 29): the sample the index gives
per point (tracing/query.py `delivery_latencies`), bounded in rows, bytes and by primary-key
ranges; and over HTTP, a traced topic's and consumer's charts beside an untraced one's note."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import sqlalchemy as sa

from mqgate.console.app import Console, now_ms
from mqgate.console.charts import Chart, percentile
from mqgate.console.pages import topic as pages
from mqgate.core.ids import new_message_id
from mqgate.registry.records import TopicRecord
from mqgate.tracing.events import Resource, TraceEvent, encode_event
from mqgate.tracing.index import IndexRow, TraceIndex, events
from mqgate.tracing.query import Latencies, delivery_latencies
from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, sign_in

STEP = 60_000
T0 = 1_800_000_000_000 - 1_800_000_000_000 % STEP
STARTS = [T0 + i * STEP for i in range(5)]
GW = Resource("gw-1")


def hop(hop: str, accepted: int, at: int, topic: str = "t", consumer: str = "c", **more: Any) -> IndexRow:
    e = TraceEvent(new_message_id(accepted), hop, at, "p", topic, GW, consumer=consumer, queue=0, **more)  # type: ignore[arg-type]
    return IndexRow(e.msg_id, None, e.time_ms, (), encode_event(e).decode())


def loaded(tmp_path: Path, rows: list[IndexRow]) -> TraceIndex:
    index = TraceIndex(f"sqlite:///{tmp_path}/trace-index.sqlite")
    index.create_schema()
    index.bulk_load(list(enumerate(rows, start=1)))
    return index


def sample(index: TraceIndex, consumer: str | None = None, **kw: Any) -> list[list[int]]:
    found = delivery_latencies(
        index, topic="t", consumer=consumer, starts=STARTS, step_ms=STEP, max_bytes=10**7, **kw
    )
    return [sorted(p) for p in found.points]


def test_latencies_are_first_deliveries_of_the_topic_per_point(tmp_path: Path) -> None:
    rows = [
        hop("delivered", T0 - 5, T0 + 10),  # 15 ms, point 0
        hop("delivered", T0 + 100, T0 + 350),  # 250 ms, point 0
        hop("acked", T0 + 100, T0 + 400),  # not a delivery
        hop("delivered", T0 + 100, T0 + 900, attempt=2),  # a redelivery
        hop("delivered", T0 + 100, T0 + 900, source="%RETRY%c"),  # from the retry queue
        hop("delivered", T0 + 100, T0 + 500, topic="other"),  # another topic
        hop("delivered", T0 + STEP, T0 + 2 * STEP + 7, consumer="d"),  # 60,007 ms, point 2, consumer d
        hop("delivered", T0 + 4 * STEP, T0 + 4 * STEP + 3),  # 3 ms, the last point
        hop("delivered", T0, T0 + 5 * STEP),  # after the range
        hop("delivered", T0 - STEP, T0 - 1),  # before it
    ]
    index = loaded(tmp_path, rows)
    assert sample(index) == [[15, 250], [], [60_007], [], [3]]
    assert sample(index, "c") == [[15, 250], [], [], [], [3]]
    assert sample(index, "nobody") == [[], [], [], [], []]
    assert percentile([15, 250], 0.5) == 15 and percentile([15, 250], 0.99) == 250
    assert percentile([], 0.5) is None
    empty = TraceIndex(f"sqlite:///{tmp_path}/empty.sqlite")
    empty.create_schema()
    assert sample(empty) == [[], [], [], [], []]


def test_a_busy_index_is_sampled_within_its_row_and_byte_budgets(tmp_path: Path) -> None:
    # 2,000 deliveries in point 1, interleaved with 2,000 hops of another topic.
    rows = []
    for i in range(2000):
        rows.append(hop("delivered", T0 + STEP, T0 + STEP + i * 20, topic="busy"))
        rows.append(hop("delivered", T0 + STEP + i * 20 - 40, T0 + STEP + i * 20))
    index = loaded(tmp_path, rows)
    found = delivery_latencies(index, topic="t", consumer=None, starts=STARTS, step_ms=STEP, max_bytes=10**7,
                               scan_rows=500)  # fmt: skip
    assert found.scanned <= 500 and not found.cut
    assert 30 <= len(found.points[1]) <= 100 and set(found.points[1]) == {40}
    assert [len(p) for i, p in enumerate(found.points) if i != 1] == [0, 0, 0, 0]
    everything = delivery_latencies(index, topic="t", consumer=None, starts=STARTS, step_ms=STEP,
                                    max_bytes=10**7, scan_rows=10**6)  # fmt: skip
    assert len(everything.points[1]) == 2000
    small = delivery_latencies(index, topic="t", consumer=None, starts=STARTS, step_ms=STEP, max_bytes=3000)
    assert small.cut and 0 < len(small.points[1]) < 20
    # Each point's read is a range of the primary key (no scan of the table).
    with index.engine.connect() as conn:
        query = f"SELECT event FROM {events.name} WHERE id >= 5 AND id < 50 AND event LIKE '%x%'"
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + query).all()
    assert any("INTEGER PRIMARY KEY" in str(row) for row in plan), plan
    assert sa.inspect(index.engine).has_table(events.name)


# --- over HTTP -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(tmp_path_factory.mktemp("latency") / "data")
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    for project in ("lit", "dark"):
        srv.admin("POST", "/admin/projects", name=project)
        srv.admin("POST", "/admin/topics", name=f"{project}-t", queues=2, project=project)
    srv.admin("POST", "/admin/trace-policies", mode="project", project="lit", level="info")
    yield srv
    srv.stop()


def chart_data(page: str, key: str) -> dict[str, Any] | None:
    found = re.search(rf'<script type="application/json" id="chart-{key}-data">(.*?)</script>', page)
    return None if found is None else dict(json.loads(html.unescape(found.group(1))))


def produce_and_pull(srv: ConsoleServer, project: str) -> None:
    ptoken = srv.admin("POST", "/admin/producers", name=f"{project}-p", topic=f"{project}-t")["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{project}-c", topic=f"{project}-t",
                       start="earliest")["token"]  # fmt: skip
    batch = {"producer": f"{project}-p", "messages": [{"message": f"m{i}"} for i in range(20)]}
    r = httpx.post(srv.url + "/mq/produce/batch", headers={"Authorization": f"Bearer {ptoken}"}, json=batch)
    assert r.status_code == 200, r.text
    query: dict[str, str | int] = {"topic": f"{project}-t", "consumer": f"{project}-c", "max": 20}
    auth = {"Authorization": f"Bearer {ctoken}"}

    def pulled() -> int:
        got = httpx.get(srv.url + "/mq/message", params=query, headers=auth, timeout=30).json()["result"]
        if got["status"] == "FOUND":
            httpx.post(srv.url + "/mq/ack", json={"requestId": got["requestId"]}, headers=auth, timeout=10)
        return len(got.get("msgList") or [])

    wait_until(pulled, 30, "a batch to pull")


def test_a_traced_topic_and_its_consumer_chart_their_delivery_latency(traced: ConsoleServer) -> None:
    produce_and_pull(traced, "lit")
    client = sign_in(traced, "admin")

    def charted(path: str) -> dict[str, Any] | None:
        page = client.get(path).text
        p50, p99 = chart_data(page, "latency-p50"), chart_data(page, "latency-p99")
        assert p50 is not None and p99 is not None and 'id="chart-latency-note"' not in page, page[-3000:]
        return p99 if any(v is not None for v in p50["values"]) else None

    for path in ("/console/topics/lit-t", "/console/consumers/lit-c"):
        p99 = wait_until(lambda p=path: charted(p), 30, f"a latency point on {path}")
        assert len(p99["times"]) == 60 and p99["unit"] == "ms"
        known = [v for v in p99["values"] if v is not None]
        assert known and all(0 <= v < 60_000 for v in known)
    week = client.get("/console/live/topics/lit-t/charts", params={"range": "week"})
    data = chart_data(week.text, "latency-p50")
    assert week.status_code == 200 and data is not None and len(data["times"]) == 168


def test_an_untraced_topic_says_so_with_the_way_to_trace_it(traced: ConsoleServer) -> None:
    produce_and_pull(traced, "dark")
    client = sign_in(traced, "admin")
    for path in ("/console/topics/dark-t", "/console/consumers/dark-c", "/console/live/topics/dark-t/charts"):
        page = client.get(path).text
        assert chart_data(page, "latency-p50") is None and chart_data(page, "latency-p99") is None
        note = re.search(r'id="chart-latency-note">(.*?)</figure>', page, re.S)
        assert note is not None, path
        assert "No trace policy records the deliveries" in note.group(1)
        assert 'href="/console/traces/policies"' in note.group(1)
    # A policy for the consumer alone: its page charts, and so does its topic's.
    traced.admin("POST", "/admin/trace-policies", mode="service", service="dark-c", level="info")

    def noted(path: str) -> bool:
        return 'id="chart-latency-note"' not in client.get(path).text

    wait_until(
        lambda: noted("/console/consumers/dark-c") and noted("/console/topics/dark-t"), 30, "the policy"
    )


# --- kept points ----------------------------------------------------------------------------


def test_a_refresh_reads_only_the_points_not_settled_yet() -> None:
    asked: list[list[int]] = []

    async def latencies(*, starts: list[int], **_: Any) -> Latencies:
        asked.append(list(starts))
        return Latencies([[10, 20, 30] for _ in starts], 0, False)

    policy = SimpleNamespace(mode="service", service="c", project=None, topic=None)
    c = SimpleNamespace(
        cache={},
        settings=SimpleNamespace(max_answer_bytes=10**6),
        url=lambda path: "/console" + path,
        platform=SimpleNamespace(
            tracing=SimpleNamespace(
                policies=SimpleNamespace(policies=(policy,)), query=SimpleNamespace(latencies=latencies)
            )
        ),
    )
    t = TopicRecord("t", 1, 3_600_000, None, 0, project="p")
    w = pages.window_of("hour", now_ms(), 1000)

    async def go() -> list[Any]:
        first = await pages.latency_charts(cast(Console, c), t, w, "c")
        again = await pages.latency_charts(cast(Console, c), t, w, "c")
        return [first, again]

    first, again = asyncio.run(go())
    assert asked[0] == list(w.starts)
    # Points closed 5 minutes ago are kept: the refresh asks for the last five or six only.
    assert asked[1] == list(w.starts)[-len(asked[1]) :] and 5 <= len(asked[1]) <= 6
    for charts in (first, again):
        assert [ch.key for ch in charts] == ["latency-p50", "latency-p99"]
        p50, p99 = charts
        assert isinstance(p50, Chart) and isinstance(p99, Chart)
        assert p50.values == [20] * 60 and p99.values == [30] * 60
    other = pages.delivery_traced(cast(Console, c), t, "d")
    assert not other
