"""The SQL history on an SQLite file and on the machine's PostgreSQL: round trip, merging of rows
of the same key, queries by project / topic / queue / consumer / time, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqgate.errors import BadRequest
from mqgate.queuestate.diagnosis import diagnose
from mqgate.queuestate.history import QueueStateHistory, history_url
from mqgate.queuestate.rows import ConsumerInterval, ProduceInterval, QueueInterval, Rollup
from mqgate.queuestate.sampler import QueueStateSampler
from tests.queuestate.conftest import PG_URL

IV = 60_000
B = 1_700_000_040_000
DAY_MS = 24 * 3600 * 1000


def sampled_rollup() -> Rollup:
    s = QueueStateSampler()
    for i in range(120):  # two intervals
        now = B + i * 1000
        for queue in (0, 1):
            s.observe_queue("shop", "orders", queue, i + queue * 100, now, limit=1000)
            s.observe_backlog("shop", "billing", "orders", queue, i // 2, now)
        s.observe_queue("other", "logs", 0, 5, now)
        if i % 10 == 0:
            s.count_pull("shop", "billing", "orders", i % 2, 3, now)
            s.count_ack("shop", "billing", "orders", i % 2, 3, now + 1)
            s.count_produce("shop", "orders", True, None, now, messages=4)
        if i == 0:
            s.count_produce("shop", "orders", False, "storage", now + 5)
            s.count_produce("shop", "payments", False, "disk_full", now + 6)  # nothing accepted
    return s.roll_up(B + 2 * IV)


def test_rows_round_trip_and_queries_select_by_project_topic_queue_consumer_and_time(
    history: QueueStateHistory,
) -> None:
    rollup = sampled_rollup()
    assert history.write(rollup) == len(rollup) + 2  # + the two error-type rows
    assert history.projects() == ["other", "shop"]
    queues = history.queue_history("shop")
    assert sorted(queues, key=lambda r: (r.topic, r.queue, r.start_ms)) == sorted(
        [r for r in rollup.queues if r.project == "shop"], key=lambda r: (r.topic, r.queue, r.start_ms)
    )
    assert [(r.queue, r.start_ms) for r in queues] == [(0, B), (0, B + IV), (1, B), (1, B + IV)]
    q1 = history.queue_history("shop", topic="orders", queue=1, since_ms=B + IV)
    assert len(q1) == 1 and q1[0].max_length == 219 and q1[0].avg_length == pytest.approx(189.5)
    assert q1[0].length_limit == 1000
    assert history.queue_history("shop", until_ms=B + IV) == [r for r in queues if r.start_ms == B]
    assert history.queue_history("shop", topic="nope") == []
    consumers = history.consumer_history("shop", consumer="billing", queue=0)
    assert [(r.start_ms, r.pulls, r.acked, r.max_backlog) for r in consumers] == [
        (B, 6, 18, 29),
        (B + IV, 6, 18, 59),
    ]
    assert consumers[1].last_pull_ms == B + 110_000
    produce = history.produce_history("shop")
    assert [(r.topic, r.start_ms, r.produced, r.errors) for r in produce] == [
        ("orders", B, 24, {"storage": 1}),
        ("orders", B + IV, 24, {}),
        ("payments", B, 0, {"disk_full": 1}),
    ]
    window = history.window("shop", B, B + 2 * IV)
    assert (len(window.queues), len(window.consumers), len(window.produce)) == (4, 4, 3)
    health = diagnose(window, B + 2 * IV)
    assert [(f.rule, f.topic) for f in health.findings] == [
        ("store_fault", "orders"),
        ("store_fault", "payments"),
    ]


def test_rows_of_the_same_key_add_up_across_writes_and_within_one_batch(history: QueueStateHistory) -> None:
    part1 = QueueInterval("p", "t", 0, B, IV, 40, 40 * 20_000, 20_000, 20, None, 1)
    part2 = QueueInterval("p", "t", 0, B, IV, 90, 90 * 40_000, 40_000, 40, 500, 2)
    c1 = ConsumerInterval("p", "c", "t", 0, B, IV, None, 0, 0, 0, 2, 10, 1, 10, B + 10)
    c2 = ConsumerInterval("p", "c", "t", 0, B, IV, 7, 7 * 1000, 1000, 1, 1, 5, 0, 0, None)
    history.write(Rollup([part1], [c1], [ProduceInterval("p", "t", B, IV, 3, {"storage": 1})]))
    # One batch holding the same key twice (a stop and a restart within one flush period).
    history.write(
        Rollup(
            [part2, part1],
            [c2],
            [ProduceInterval("p", "t", B, IV, 4, {"storage": 2, "bad_request": 1})],
        )
    )
    (q,) = history.queue_history("p")
    assert (q.max_length, q.covered_ms, q.samples, q.length_limit, q.dropped) == (90, 80_000, 80, 500, 4)
    assert q.length_area == 40 * 20_000 * 2 + 90 * 40_000
    (c,) = history.consumer_history("p")
    assert (c.max_backlog, c.pulls, c.delivered, c.acks, c.acked, c.last_pull_ms) == (7, 3, 15, 1, 10, B + 10)
    (p,) = history.produce_history("p")
    assert (p.produced, p.errors) == (7, {"storage": 3, "bad_request": 1})


def test_retention_prunes_rows_older_than_its_age_and_counts_them(tmp_path: Path) -> None:
    history = QueueStateHistory(tmp_path / "qs.db", retention_s=2 * 24 * 3600)
    history.create_schema()
    now = B + 10 * DAY_MS
    rows = Rollup()
    for day in (0, 7, 8, 9):  # 10, 3, 2 (exactly: kept) and 1 days old
        start = B + day * DAY_MS
        rows.queues.append(QueueInterval("p", "t", 0, start, IV, 1, IV, IV, 60, None, 0))
        rows.consumers.append(ConsumerInterval("p", "c", "t", 0, start, IV, 1, IV, IV, 60, 1, 1, 1, 1, start))
        rows.produce.append(ProduceInterval("p", "t", start, IV, 1, {"storage": 1}))
    history.write(rows)
    pruned = history.prune(now)
    assert (pruned.queues, pruned.consumers, pruned.produce, pruned.errors, pruned.total) == (2, 2, 2, 2, 8)
    kept = [B + 8 * DAY_MS, B + 9 * DAY_MS]
    assert [r.start_ms for r in history.queue_history("p")] == kept
    assert [r.start_ms for r in history.consumer_history("p")] == kept
    assert [(r.start_ms, r.errors) for r in history.produce_history("p")] == [
        (k, {"storage": 1}) for k in kept
    ]
    assert history.prune(now).total == 0
    history.dispose()


def test_default_retention_is_seven_days_and_prune_works_on_postgresql(history: QueueStateHistory) -> None:
    assert history.retention_ms == 7 * DAY_MS
    old = QueueInterval("p", "t", 0, B, IV, 1, IV, IV, 60, None, 0)
    new = QueueInterval("p", "t", 0, B + 7 * DAY_MS, IV, 1, IV, IV, 60, None, 0)
    history.write(Rollup([old, new]))
    assert history.prune(B + 7 * DAY_MS + 1).queues == 1
    assert [r.start_ms for r in history.queue_history("p")] == [B + 7 * DAY_MS]


def test_two_prefixes_in_one_database_are_separate_histories(tmp_path: Path) -> None:
    a = QueueStateHistory(tmp_path / "shared.db", table_prefix="a_")
    b = QueueStateHistory(tmp_path / "shared.db", table_prefix="b_")
    a.create_schema()
    b.create_schema()
    a.write(Rollup([QueueInterval("p", "t", 0, B, IV, 1, IV, IV, 60, None, 0)]))
    assert len(a.queue_history("p")) == 1 and b.queue_history("p") == []
    a.dispose()
    b.dispose()


def test_targets_and_bad_settings() -> None:
    assert history_url("/var/lib/mqgate/qs.db") == "sqlite:////var/lib/mqgate/qs.db"
    assert history_url(PG_URL) == PG_URL
    with pytest.raises(BadRequest) as bad:
        QueueStateHistory("mysql://x/y")
    assert bad.value.field == "url"
    with pytest.raises(BadRequest):
        QueueStateHistory("x.db", table_prefix="Robert'); DROP TABLE x;--")
    with pytest.raises(BadRequest):
        QueueStateHistory("x.db", retention_s=0)


def test_a_write_costs_a_few_python_calls_a_row_whatever_the_rows_class(history: QueueStateHistory) -> None:
    """10 000 queues is the design point: a flush is one write of all their rows, in a thread
    that holds the interpreter. Reading a row's fields through `msgspec.structs.fields`
    evaluated its class's annotations again for every row (186 µs and hundreds of calls a row,
    4.6 s for 20 000 rows). Counted, not timed: the calls of a write of 400 rows against one of
    200, per row."""
    import sys

    def rows(n: int, start_ms: int) -> Rollup:
        queues = [QueueInterval("p", "t", q, start_ms, IV, 1, 60_000, IV, 60, None, 0) for q in range(n)]
        consumers = [
            ConsumerInterval("p", "c", "t", q, start_ms, IV, None, 0, 0, 0, 1, 1, 1, 1, start_ms)
            for q in range(n)
        ]
        return Rollup(queues, consumers, [])

    def calls(rollup: Rollup) -> int:
        count = 0

        def profile(_frame: object, event: str, _arg: object) -> None:
            nonlocal count
            if event == "call":
                count += 1

        sys.setprofile(profile)
        try:
            history.write(rollup)
        finally:
            sys.setprofile(None)
        return count

    calls(rows(10, B))  # warmed up: statements compiled, the connection open
    small, large = calls(rows(200, B + IV)), calls(rows(400, B + 2 * IV))
    per_row = (large - small) / 400  # 200 more queue rows and 200 more consumer rows
    assert per_row < 60, (small, large, per_row)  # 7.5 on SQLite, 26.5 on PostgreSQL; before: 137, 156
