"""`QueueStateHistory.queue_page`: a project's queue intervals a page at a time, on both
databases. A steady run is one row and several intervals, two gateways' rows of one queue may
overlap, and a run may reach into the window from before it: whatever the page size, the pages
one after the other give every interval `queue_history` gives, once, in its order."""

from __future__ import annotations

import random

import pytest

from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.rows import MAX_RUN_MS, QueueInterval, Rollup

STEP = 600_000  # ten minutes: six intervals make a run as long as a run can be (MAX_RUN_MS)
BASE = 1_700_000_400_000  # a multiple of STEP


def row(topic: str, queue: int, start: int, intervals: int, length: int) -> QueueInterval:
    span = intervals * STEP
    return QueueInterval(
        project="p", topic=topic, queue=queue, start_ms=start, interval_ms=span, max_length=length,
        length_area=length * span + intervals - 1, covered_ms=span, samples=12 * intervals,
        length_limit=None, dropped=intervals % 3, intervals=intervals,
    )  # fmt: skip


def seed(history: QueueStateHistory, rng: random.Random) -> None:
    """Runs, single intervals and gaps on six queues; another gateway's rows inside some runs
    (one interval, or a run of its own, starting in the middle of the first's)."""
    rows = []
    for topic in ("a", "b"):
        for queue in range(3):
            t = BASE
            for _ in range(14):
                k = rng.choice((1, 1, 2, 3, 6))
                rows.append(row(topic, queue, t, k, rng.randrange(0, 50)))
                if k > 2 and rng.random() < 0.4:  # a second gateway, starting inside the run
                    inside = t + rng.randrange(1, k) * STEP
                    rows.append(row(topic, queue, inside, rng.choice((1, 2)), rng.randrange(0, 50)))
                t += (k + rng.choice((0, 0, 1))) * STEP
    rows.append(row("c", 0, BASE, 1, 1))
    history.write(Rollup(queues=rows))
    history.write(Rollup(queues=[QueueInterval(**{**_fields(rows[0]), "project": "q"})]))


def _fields(r: QueueInterval) -> dict[str, object]:
    return {name: getattr(r, name) for name in QueueInterval.__struct_fields__}


def pages(history: QueueStateHistory, limit: int, **query: object) -> list[list[QueueInterval]]:
    out: list[list[QueueInterval]] = []
    after = None
    while True:
        page, more = history.queue_page("p", after=after, limit=limit, **query)  # type: ignore[arg-type]
        assert len(page) <= limit
        out.append(page)
        if not more:
            return out
        assert page, "a page that says more follow holds something"
        last = page[-1]
        after = (last.topic, last.queue, last.start_ms)


WINDOWS = [
    {},
    {"since_ms": BASE + 7 * STEP},  # inside runs: they reach into the window from before it
    {"since_ms": BASE + 5 * STEP + 1, "until_ms": BASE + 31 * STEP},
    {"until_ms": BASE + 9 * STEP},
    {"topic": "b"},
    {"topic": "a", "queue": 2, "since_ms": BASE + 3 * STEP},
]


@pytest.mark.parametrize("limit", [1, 2, 5, 13, 10_000])
def test_pages_give_every_interval_once_in_order(history: QueueStateHistory, limit: int) -> None:
    seed(history, random.Random(27))
    for window in WINDOWS:
        whole = history.queue_history("p", **window)  # type: ignore[arg-type]
        assert len(whole) > (20 if window else 150)
        got = pages(history, limit, **window)
        assert [i for page in got for i in page] == whole, window
        assert len(got) == max(1, -(-len(whole) // limit))  # full pages, then the rest


def test_a_page_ends_inside_a_run_and_the_next_goes_on_inside_it(history: QueueStateHistory) -> None:
    """The longest run there is (MAX_RUN_MS), another gateway's run inside it, cut after each of
    its intervals: the cursor names an interval, so the page after it reads the run's row again
    (from MAX_RUN_MS back) and gives the intervals after the cut, merged as the whole gives them."""
    history.write(Rollup(queues=[row("a", 0, BASE, 6, 4), row("a", 0, BASE + 2 * STEP, 2, 9)]))
    whole = history.queue_history("p")
    assert [i.start_ms for i in whole] == [BASE + i * STEP for i in range(6)]
    assert [i.max_length for i in whole] == [4, 4, 9, 9, 4, 4]  # the second gateway's merged in
    assert 6 * STEP == MAX_RUN_MS
    for cut in range(6):
        after = ("a", 0, BASE + cut * STEP)
        page, more = history.queue_page("p", after=after, limit=100)
        assert (page, more) == (whole[cut + 1 :], False)
