"""The sampler's roll-up arithmetic, with explicit timestamps (no clock, no sleeping)."""

from __future__ import annotations

import pytest

from mqgate.queuestate.rows import NO_QUEUE, QueueInterval
from mqgate.queuestate.sampler import QueueStateSampler

IV = 60_000  # the interval, ms
B = 1_700_000_040_000  # an interval boundary (a multiple of 60 000)
assert B % IV == 0


def only_queue(rows: list[QueueInterval]) -> QueueInterval:
    assert len(rows) == 1, rows
    return rows[0]


def test_one_sample_a_second_averages_to_the_plain_mean_and_keeps_the_max() -> None:
    s = QueueStateSampler()  # 60 s intervals, samples every 1 s
    lengths = [(i * 37) % 101 for i in range(60)]
    for i, length in enumerate(lengths):
        s.observe_queue("p", "orders", 3, length, B + i * 1000)
    assert not s.roll_up(B + IV - 1).queues  # the interval is not over yet
    row = only_queue(s.roll_up(B + IV).queues)
    assert (row.project, row.topic, row.queue, row.start_ms, row.interval_ms) == ("p", "orders", 3, B, IV)
    assert row.samples == 60 and row.covered_ms == IV
    assert row.max_length == max(lengths)
    assert row.avg_length == pytest.approx(sum(lengths) / 60)
    assert not s.roll_up(B + IV + 5).queues  # a row is handed out once


def test_the_average_is_weighted_by_time_and_a_sample_holds_two_periods_at_most() -> None:
    s = QueueStateSampler()
    s.observe_queue("p", "t", 0, 100, B)
    s.observe_queue("p", "t", 0, 0, B + 500)
    # Nothing for 9.5 s (the sampler stalled): the 0 holds until B+2500, then nothing is known.
    s.observe_queue("p", "t", 0, 50, B + 10_000)
    row = only_queue(s.roll_up(B + IV).queues)
    assert row.covered_ms == 500 + 2000 + 2000
    assert row.length_area == 100 * 500 + 0 * 2000 + 50 * 2000
    assert row.avg_length == pytest.approx(150_000 / 4500)
    assert row.max_length == 100


def test_a_sample_carries_over_the_boundary_into_the_next_interval() -> None:
    s = QueueStateSampler()
    s.observe_queue("p", "t", 0, 40, B + IV - 500)
    s.observe_queue("p", "t", 0, 80, B + IV + 500)
    first, second = s.roll_up(B + 2 * IV).queues
    assert (first.start_ms, first.covered_ms, first.avg_length, first.max_length) == (B, 500, 40, 40)
    # [IV, IV+500): the 40 carried in; then 80 holds 2 s.
    assert second.start_ms == B + IV
    assert second.covered_ms == 2500
    assert second.avg_length == pytest.approx((40 * 500 + 80 * 2000) / 2500)
    assert second.max_length == 80  # the carried 40 counts too, 80 is larger


def test_intervals_with_no_observation_get_no_row_and_idle_keys_are_forgotten() -> None:
    s = QueueStateSampler()
    s.observe_queue("p", "t", 0, 7, B + 1000)
    s.observe_queue("p", "t", 0, 9, B + 4 * IV + 1000)
    rows = s.roll_up(B + 4 * IV + 2000).queues
    assert [r.start_ms for r in rows] == [B]  # intervals 1..3 saw nothing; 4 is still open
    assert s.tracked_keys() == 1
    rows = s.roll_up(B + 6 * IV).queues
    assert [r.start_ms for r in rows] == [B + 4 * IV]
    assert s.tracked_keys() == 0  # nothing holds and nothing was counted: the key is dropped


def test_a_clock_stepping_back_never_makes_negative_time() -> None:
    s = QueueStateSampler()
    s.observe_queue("p", "t", 0, 10, B + 5000)
    s.observe_queue("p", "t", 0, 30, B + 4000)  # counted at B+5000
    row = only_queue(s.roll_up(B + IV).queues)
    assert row.covered_ms == 2000 and row.length_area == 30 * 2000 and row.max_length == 30


def test_limit_and_retention_drops_are_kept_with_the_queue_row() -> None:
    s = QueueStateSampler()
    s.observe_queue("p", "t", 1, 95, B, limit=100)
    s.count_dropped("p", "t", 1, 12, B + 100)
    s.count_dropped("p", "t", 1, 3, B + 200)
    s.count_dropped("p", "t", 2, 4, B + 300)  # a queue whose length was never sampled
    one, two = sorted(s.roll_up(B + IV).queues, key=lambda r: r.queue)
    assert (one.length_limit, one.dropped, one.max_length) == (100, 15, 95)
    assert (two.dropped, two.max_length, two.avg_length, two.samples) == (4, None, None, 0)


def test_consumer_rows_count_pulls_acks_and_time_weight_the_backlog() -> None:
    s = QueueStateSampler()
    for i in range(60):
        s.observe_backlog("p", "billing", "orders", 0, i, B + i * 1000)
    s.count_pull("p", "billing", "orders", 0, 10, B + 1000)
    s.count_pull("p", "billing", "orders", 0, 5, B + 3000)
    s.count_pull("p", "billing", "orders", NO_QUEUE, 0, B + 7000)  # found nothing
    s.count_ack("p", "billing", "orders", 0, 15, B + 8000)
    rows = {r.queue: r for r in s.roll_up(B + IV).consumers}
    q0, empty = rows[0], rows[NO_QUEUE]
    assert (q0.pulls, q0.delivered, q0.acks, q0.acked, q0.last_pull_ms) == (2, 15, 1, 15, B + 3000)
    assert q0.max_backlog == 59 and q0.avg_backlog == pytest.approx(29.5)
    assert (empty.pulls, empty.delivered, empty.max_backlog, empty.last_pull_ms) == (1, 0, None, B + 7000)


def test_produce_counts_and_errors_by_type_roll_at_the_boundary() -> None:
    s = QueueStateSampler()
    s.count_produce("p", "t", True, None, B, messages=10)
    s.count_produce("p", "t", False, "storage", B + 10)
    s.count_produce("p", "t", False, "storage", B + 20)
    s.count_produce("p", "t", False, "bad_request", B + 30)
    s.count_produce("p", "t", True, None, B + IV + 1)  # the next interval closes the first
    assert s.pending_rows() == 1
    (row,) = s.roll_up(B + IV + 2).produce
    assert (row.start_ms, row.produced, row.errors, row.error_count) == (
        B,
        10,
        {"storage": 2, "bad_request": 1},
        3,
    )
    (row,) = s.roll_up(B + 2 * IV).produce
    assert (row.start_ms, row.produced, row.errors) == (B + IV, 1, {})


def test_final_roll_up_hands_out_the_open_interval_and_what_follows_adds_up_exactly() -> None:
    """Stop mid-interval (partial rows), keep going: the two partial rows summed equal the row an
    uninterrupted sampler makes."""
    whole, split = QueueStateSampler(), QueueStateSampler()
    partial = []
    for i in range(60):
        for s in (whole, split):
            s.observe_queue("p", "t", 0, i * i, B + i * 1000)
            s.count_pull("p", "c", "t", 0, 1, B + i * 1000)
        if i == 20:
            partial.append(split.roll_up(B + i * 1000 + 500, final=True))
    partial.append(split.roll_up(B + IV))
    expected_q = only_queue(whole.roll_up(B + IV).queues)
    qs = [r for p in partial for r in p.queues]
    assert len(qs) == 2 and {r.start_ms for r in qs} == {B}
    assert sum(r.length_area for r in qs) == expected_q.length_area
    assert sum(r.covered_ms for r in qs) == expected_q.covered_ms == IV
    assert max(r.max_length or 0 for r in qs) == expected_q.max_length
    cs = [r for p in partial for r in p.consumers]
    assert sum(r.pulls for r in cs) == 60 and sum(r.delivered for r in cs) == 60


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        QueueStateSampler(interval_s=0)
    with pytest.raises(ValueError):
        QueueStateSampler(sample_every_s=-1)


def test_a_sweep_in_steps_with_observations_in_between_closes_each_interval_once() -> None:
    s = QueueStateSampler()
    for q in range(4):
        s.observe_queue("p", "t", q, 10 + q, B + 1000)
    steps = s.sweep(B + IV + 10, chunk=1)
    next(steps)  # queue 0 swept
    s.observe_queue("p", "t", 3, 99, B + IV + 20)  # queue 3 crosses the boundary itself
    s.observe_queue("p", "t", 0, 77, B + IV + 30)  # queue 0 is already in the new interval
    for _ in steps:
        pass
    rows = s.take_closed().queues
    assert sorted((r.queue, r.start_ms, r.max_length) for r in rows) == [(q, B, 10 + q) for q in range(4)]
    later = s.roll_up(B + 2 * IV).queues
    assert sorted((r.queue, r.max_length) for r in later) == [(0, 77), (3, 99)]  # 1, 2: nothing held
