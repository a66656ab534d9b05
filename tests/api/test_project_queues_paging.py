"""`GET /admin/projects/{name}/queues` in pages (issue 27: one answer was 185 MB for a project
with many queues). A real gateway with a small answer budget reads a queue state history of
steady runs (one row, several intervals), another gateway's rows inside them, and gaps, on
SQLite and on PostgreSQL: each page's intervals stay within `max_answer_bytes` (at least one),
a page may end inside a run, and following `next` reaches every interval the history holds,
once, in order, with any filter and page size. A cursor that is not one the query gave is a
400 naming `cursor`."""

from __future__ import annotations

import base64
import contextlib
import itertools
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.rows import QueueInterval, Rollup
from tests.conftest import PG_ADMIN_URL, Server, require_service

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

BUDGET = 2048
STEP = 60_000  # the gateway's interval
# Two days ago, on an interval boundary: within the history's retention (7 days), which the
# gateway prunes to when it starts.
BASE = (int(time.time() * 1000) - 2 * 86_400_000) // STEP * STEP
PROJECT = "big"
TOPICS = ("alpha", "beta", "gamma")
QUEUES = 4


def run_row(topic: str, queue: int, start: int, intervals: int, length: int) -> QueueInterval:
    span = intervals * STEP
    return QueueInterval(
        project=PROJECT, topic=topic, queue=queue, start_ms=start, interval_ms=span, max_length=length,
        length_area=length * span, covered_ms=span, samples=12 * intervals, length_limit=None,
        dropped=0, intervals=intervals,
    )  # fmt: skip


def history_rows(rng: random.Random) -> list[QueueInterval]:
    """Each queue: runs of up to 40 intervals, single intervals and gaps; another gateway's
    single interval inside some runs (merged into the run's interval of the same start)."""
    rows = []
    for topic in TOPICS:
        for queue in range(QUEUES):
            t = BASE
            for _ in range(6):
                k = rng.choice((1, 2, 7, 40))
                rows.append(run_row(topic, queue, t, k, rng.randrange(100)))
                if k > 2 and rng.random() < 0.5:
                    rows.append(run_row(topic, queue, t + rng.randrange(1, k) * STEP, 1, 1000))
                t += (k + rng.choice((0, 1))) * STEP
    return rows


def seed(target: str | Path) -> list[QueueInterval]:
    """The history's rows written where the gateway will read them; the intervals it holds."""
    history = QueueStateHistory(target)
    try:
        history.create_schema()
        rows = history_rows(random.Random(185))
        history.write(Rollup(queues=rows))
        return history.queue_history(PROJECT)
    finally:
        history.dispose()


class Seeded:
    def __init__(self, server: Server, intervals: list[QueueInterval], runs: list[QueueInterval]) -> None:
        self.server = server
        self.intervals = intervals
        self.runs = runs  # the rows that stand for several intervals

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(
            self.server.url + path,
            params=params,
            headers={"Authorization": f"Bearer {self.server.admin_token}"},
            timeout=30,
        )


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database (the machine's server) for this module, dropped after."""
    require_service("127.0.0.1", 5432, "PostgreSQL")
    import psycopg

    name = f"mqgate_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def seeded(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Seeded]:
    data = tmp_path_factory.mktemp("queues") / "data"
    data.mkdir()
    with contextlib.ExitStack() as stack:
        args: list[str] = []
        if request.param == "sqlite":
            intervals = seed(data / "queue-state.sqlite")  # where the gateway keeps its history
        else:
            url = stack.enter_context(pg_database())
            intervals = seed(url)  # the registry's database holds the history
            args = ["--registry", url]
        srv = Server(data, extra_args=args, env={"MQGATE_MAX_ANSWER_BYTES": str(BUDGET)}).start()
        stack.callback(srv.stop)
        srv.admin("POST", "/admin/projects", name=PROJECT)
        srv.admin("POST", "/admin/topics", name="elsewhere", queues=2)  # of the default project
        runs = [r for r in history_rows(random.Random(185)) if r.intervals > 1]
        yield Seeded(srv, intervals, runs)


def key(i: dict[str, Any]) -> tuple[str, int, int]:
    return (i["topic"], i["queue"], i["startMs"])


def wire(i: QueueInterval) -> tuple[Any, ...]:
    return (i.topic, i.queue, i.start_ms, i.interval_ms, i.max_length, i.avg_length, i.dropped)


def as_read(i: dict[str, Any]) -> tuple[Any, ...]:
    return (i["topic"], i["queue"], i["startMs"], i["intervalMs"], i.get("maxLength"), i.get("avgLength"),
            i["dropped"])  # fmt: skip


def read_pages(s: Seeded, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of the query, following `next` (each checked: within the budget, not empty)."""
    pages = []
    cursor = None
    while True:
        r = s.get(f"/admin/projects/{PROJECT}/queues", **params, **({"cursor": cursor} if cursor else {}))
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        assert result["project"] == PROJECT
        intervals = result["intervals"]
        pages.append(intervals)
        assert len(msgspec.json.encode(intervals)) <= BUDGET + 2 or len(intervals) == 1
        cursor = result.get("next")
        if cursor is None:
            return pages
        assert intervals, "a page with a next page holds at least one interval"
        assert len(pages) < 2000, "the cursor does not move"


def test_pages_within_the_budget_reach_every_interval_once(seeded: Seeded) -> None:
    whole = seeded.intervals
    assert len(msgspec.json.encode([wire(i) for i in whole])) > 10 * BUDGET  # no one answer holds it
    pages = read_pages(seeded)
    assert len(pages) > 10
    got = [as_read(i) for page in pages for i in page]
    assert got == [wire(i) for i in whole]  # every interval once, in (topic, queue, start) order

    # Some page ends inside a steady run, and the next goes on inside the same run.
    inside = 0
    for a, b in itertools.pairwise(pages):
        last, first = key(a[-1]), key(b[0])
        inside += any(
            (r.topic, r.queue) == last[:2] == first[:2] and r.start_ms <= last[2] < first[2] < r.end_ms
            for r in seeded.runs
        )
    assert inside > 0


@pytest.mark.parametrize(
    "query",
    [
        {"limit": 25},
        {"limit": 1, "topic": "beta", "queue": 2},
        {"since": BASE + 10 * STEP + 1, "until": BASE + 90 * STEP},  # runs reach in from before
        {"topic": "gamma", "since": BASE + 33 * STEP, "limit": 10_000},
    ],
)
def test_filters_and_page_sizes_page_the_same_intervals(seeded: Seeded, query: dict[str, Any]) -> None:
    since, until = query.get("since"), query.get("until")
    wanted = [
        wire(i)
        for i in seeded.intervals
        if query.get("topic", i.topic) == i.topic
        and query.get("queue", i.queue) == i.queue
        and (since is None or i.start_ms >= since)
        and (until is None or i.start_ms < until)
    ]
    pages = read_pages(seeded, **query)
    assert [as_read(i) for page in pages for i in page] == wanted
    assert all(len(page) <= query.get("limit", 1000) for page in pages)
    if query.get("limit") == 1:
        assert len(pages) == len(wanted)


def test_a_cursor_not_given_by_the_query_is_refused_naming_it(seeded: Seeded) -> None:
    path = f"/admin/projects/{PROJECT}/queues"
    first = seeded.get(path, topic="alpha", limit=3).json()["result"]["next"]
    routers = seeded.get("/admin/routers", limit=1)
    assert routers.status_code == 200, routers.text
    made_up = msgspec.json.encode(["tag", "alpha", 0, BASE])
    forged = base64.urlsafe_b64encode(made_up).decode().rstrip("=")
    wrong_types = base64.urlsafe_b64encode(msgspec.json.encode(["x", 1, "0", None])).decode()
    for params in [
        {"cursor": "not a cursor!"},
        {"cursor": "AAAA"},
        {"cursor": first + "x"},
        {"cursor": first[:-3]},
        {"cursor": forged},  # well formed, but no query of this gateway made it
        {"cursor": wrong_types},
        {"cursor": "é"},
        {"cursor": "x" * 5000},
        {"cursor": first, "topic": "beta"},  # another query's
        {"cursor": routers.json()["result"]["next"]},  # another list's
    ]:
        r = seeded.get(path, **params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["result"] == {"code": "bad_request", "field": "cursor"}, r.text
    for limit in ("0", "10001", "-1", "ten"):
        r = seeded.get(path, limit=limit)
        assert r.status_code == 400, r.text
        assert r.json()["result"]["field"] == "limit"
    ok = seeded.get(path, topic="alpha", limit=3, cursor=first)
    assert ok.status_code == 200, ok.text
    assert [key(i) for i in ok.json()["result"]["intervals"]] == [
        (i.topic, i.queue, i.start_ms) for i in seeded.intervals if i.topic == "alpha"
    ][3:6]
