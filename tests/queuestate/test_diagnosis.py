"""Every diagnosis rule: when it fires (with what evidence and since when) and when it must not."""

from __future__ import annotations

from collections.abc import Sequence

from mqgate.queuestate.diagnosis import CONSUMER_SIDE, QUEUE_SIDE, Thresholds, diagnose
from mqgate.queuestate.rows import NO_QUEUE, ConsumerInterval, ProduceInterval, ProjectWindow, QueueInterval

IV = 60_000
B = 1_700_000_040_000
NOW = B + 10 * IV  # intervals 0..9 are closed; interval 9 ended just now


def start(k: int) -> int:
    return B + k * IV


def backlog_row(
    k: int,
    backlog: float | None,
    *,
    consumer: str = "billing",
    queue: int = 0,
    pulls: int = 0,
    delivered: int = 0,
    acked: int = 0,
    last_pull_ms: int | None = None,
) -> ConsumerInterval:
    sampled = backlog is not None
    return ConsumerInterval(
        "shop",
        consumer,
        "orders",
        queue,
        start(k),
        IV,
        int(backlog) if backlog is not None else None,
        int((backlog or 0) * IV),
        IV if sampled else 0,
        60 if sampled else 0,
        pulls,
        delivered,
        1 if acked else 0,
        acked,
        last_pull_ms if last_pull_ms is not None else (start(k) + 1000 if pulls else None),
    )


def queue_row(k: int, max_length: int, *, limit: int | None = None, dropped: int = 0) -> QueueInterval:
    return QueueInterval(
        "shop", "orders", 0, start(k), IV, max_length, max_length * IV, IV, 60, limit, dropped
    )


def window(
    consumers: Sequence[ConsumerInterval] = (),
    queues: Sequence[QueueInterval] = (),
    produce: Sequence[ProduceInterval] = (),
) -> ProjectWindow:
    return ProjectWindow("shop", NOW - 20 * IV, NOW, list(queues), list(consumers), list(produce))


def busy(backlogs: Sequence[float], first: int = 10, **kw: int) -> list[ConsumerInterval]:
    """A consumer pulling and acking every interval while its backlog follows `backlogs`,
    the last value in the latest interval."""
    k0 = first - len(backlogs)
    return [backlog_row(k0 + i, b, pulls=20, delivered=200, acked=200, **kw) for i, b in enumerate(backlogs)]


# -- consumers_too_slow -----------------------------------------------------------------------


def test_a_growing_backlog_while_the_consumer_pulls_and_acks_is_consumers_too_slow() -> None:
    health = diagnose(window(busy([300, 100, 150, 150, 250])), NOW)
    assert health.verdict == "consumer_fault" and not health.healthy
    (f,) = health.findings
    assert (f.rule, f.side, f.project, f.topic, f.queue, f.consumer) == (
        "consumers_too_slow",
        CONSUMER_SIDE,
        "shop",
        "orders",
        0,
        "billing",
    )
    # The non-falling run is 100 → 150 → 150 → 250 (the 300 before it fell): since interval 6.
    assert f.since_ms == start(6)
    assert f.evidence["backlog"] == [150.0, 150.0, 250.0]
    assert f.evidence["pulls"] == [20, 20, 20] and f.evidence["acked"] == [200, 200, 200]
    assert f.evidence["growth_per_s"] == round(100 / 180, 3)
    assert f.evidence["acked_per_s"] == round(600 / 180, 3)


def test_a_shrinking_or_flat_or_barely_growing_backlog_is_not_too_slow() -> None:
    for backlogs in ([400, 300, 200], [200, 200, 200], [200, 204, 209], [100, 300, 250]):
        assert diagnose(window(busy(backlogs)), NOW).healthy, backlogs


def test_growth_needs_the_last_n_intervals_and_the_threshold_is_a_parameter() -> None:
    assert diagnose(window(busy([100, 200])), NOW).healthy  # two intervals only
    t = Thresholds(growth_intervals=2, min_growth=100)
    assert [f.rule for f in diagnose(window(busy([100, 200])), NOW, t).findings] == ["consumers_too_slow"]
    t = Thresholds(growth_intervals=2, min_growth=101)
    assert diagnose(window(busy([100, 200])), NOW, t).healthy


def test_a_gap_or_stale_rows_do_not_count_as_growth() -> None:
    gapped = [backlog_row(5, 100, pulls=1, acked=1), *busy([200, 300])]
    assert diagnose(window(gapped), NOW).healthy  # intervals 5, 8, 9: not consecutive
    stale = busy([100, 200, 300], first=7)  # the latest row ended three intervals ago
    assert diagnose(window(stale), NOW).healthy


def test_growth_without_acks_is_not_too_slow() -> None:
    rows = [backlog_row(k, b, pulls=20) for k, b in zip((7, 8, 9), (100, 200, 300), strict=True)]
    assert diagnose(window(rows), NOW).healthy  # pulls that found nothing, no acks: not "slow"


# -- consumer_not_acking ----------------------------------------------------------------------


def test_delivered_but_never_acked_is_consumer_not_acking() -> None:
    rows = [backlog_row(k, 500, pulls=5, delivered=50) for k in (7, 8, 9)]
    (f,) = diagnose(window(rows), NOW).findings
    assert (f.rule, f.side, f.consumer, f.queue, f.since_ms) == (
        "consumer_not_acking",
        CONSUMER_SIDE,
        "billing",
        None,
        start(7),
    )
    assert f.evidence == {"delivered": [50, 50, 50], "acked": 0, "backlog": 500.0}
    rows[1] = backlog_row(8, 500, pulls=5, delivered=50, acked=1)
    assert diagnose(window(rows), NOW).healthy


# -- consumer_down ----------------------------------------------------------------------------


def test_backlog_and_no_pull_for_t_is_consumer_down_naming_the_consumer() -> None:
    rows = busy([50, 50, 50], first=3)  # pulled until interval 2
    rows += [backlog_row(k, 50 + k) for k in range(3, 10)]
    health = diagnose(window(rows), NOW)
    (f,) = health.findings
    assert (f.rule, f.side, f.consumer, f.topic, f.queue) == (
        "consumer_down",
        CONSUMER_SIDE,
        "billing",
        "orders",
        None,
    )
    assert f.since_ms == start(2) + 1000  # its last pull
    assert f.evidence["silent_ms"] == NOW - start(2) - 1000
    assert f.evidence["backlog"] == 59.0 and f.evidence["backlog_by_queue"] == {"0": 59.0}


def test_consumer_down_counts_a_pull_that_found_nothing_and_takes_t_as_a_parameter() -> None:
    rows = [backlog_row(k, 30) for k in range(10)]
    assert [f.rule for f in diagnose(window(rows), NOW).findings] == ["consumer_down"]
    alive = [*rows, backlog_row(8, None, queue=NO_QUEUE, pulls=3)]  # empty pulls 1.x min ago
    assert diagnose(window(alive), NOW).healthy
    t = Thresholds(silent_after_ms=60_000)
    assert [f.rule for f in diagnose(window(alive), NOW, t).findings] == ["consumer_down"]


def test_a_paused_but_empty_consumer_is_not_down() -> None:
    rows = [backlog_row(k, 0) for k in range(10)]  # never pulls, nothing to pull
    assert diagnose(window(rows), NOW).healthy
    assert diagnose(window(rows), NOW, paused={"billing"}).healthy


def test_a_paused_consumer_with_backlog_is_left_out_of_the_consumer_rules() -> None:
    rows = [backlog_row(k, 100 + 50 * k) for k in range(10)]
    assert not diagnose(window(rows), NOW).healthy
    assert diagnose(window(rows), NOW, paused={"billing"}).healthy


def test_a_consumer_seen_for_less_than_t_is_not_judged_down() -> None:
    rows = [backlog_row(k, 40) for k in (7, 8, 9)]  # the recorder started 3 minutes ago
    assert diagnose(window(rows), NOW).healthy


def test_down_wins_over_the_other_consumer_rules_and_other_consumers_are_judged_apart() -> None:
    rows = [backlog_row(k, 100 * k) for k in range(10)]  # growing, never pulling
    rows += busy([10, 10, 10], consumer="audit")
    (f,) = diagnose(window(rows), NOW).findings
    assert (f.rule, f.consumer) == ("consumer_down", "billing")


# -- store_fault ------------------------------------------------------------------------------


def test_produce_errors_of_the_store_are_a_store_fault_with_their_types() -> None:
    produce = [
        ProduceInterval("shop", "orders", start(7), IV, 500, {}),
        ProduceInterval("shop", "orders", start(8), IV, 300, {"disk_full": 4, "bad_request": 2}),
        ProduceInterval("shop", "orders", start(9), IV, 0, {"storage": 1}),
    ]
    health = diagnose(window(produce=produce), NOW)
    assert health.verdict == "queue_fault"
    (f,) = health.findings
    assert (f.rule, f.side, f.topic, f.queue, f.consumer, f.since_ms) == (
        "store_fault",
        QUEUE_SIDE,
        "orders",
        None,
        None,
        start(8),
    )
    assert f.evidence["store_errors"] == {"disk_full": 4, "storage": 1}
    assert f.evidence["client_errors"] == {"bad_request": 2}
    assert f.evidence["produced"] == 800 and f.evidence["error_ratio"] == round(5 / 805, 4)


def test_client_errors_or_old_errors_are_not_a_store_fault() -> None:
    client = [ProduceInterval("shop", "orders", start(9), IV, 10, {"bad_request": 40, "too_large": 1})]
    assert diagnose(window(produce=client), NOW).healthy
    old = [ProduceInterval("shop", "orders", start(2), IV, 10, {"storage": 9})]  # 8 min ago
    assert diagnose(window(produce=old), NOW).healthy
    t = Thresholds(error_window_ms=10 * IV)
    assert [f.rule for f in diagnose(window(produce=old), NOW, t).findings] == ["store_fault"]
    t = Thresholds(min_errors=2)
    one = [ProduceInterval("shop", "orders", start(9), IV, 10, {"storage": 1})]
    assert diagnose(window(produce=one), NOW, t).healthy


# -- queue_full -------------------------------------------------------------------------------


def test_a_queue_at_its_limit_or_losing_unread_messages_to_retention_is_full() -> None:
    at_limit = [queue_row(7, 500, limit=1000), queue_row(8, 960, limit=1000), queue_row(9, 990, limit=1000)]
    (f,) = diagnose(window(queues=at_limit), NOW).findings
    assert (f.rule, f.side, f.topic, f.queue, f.since_ms) == ("queue_full", QUEUE_SIDE, "orders", 0, start(8))
    assert f.evidence == {"max_length": 990, "length_limit": 1000, "dropped": 0, "full_intervals": 2}
    dropping = [queue_row(8, 20), queue_row(9, 20, dropped=7)]
    (f,) = diagnose(window(queues=dropping), NOW).findings
    assert (f.rule, f.since_ms, f.evidence["dropped"]) == ("queue_full", start(9), 7)


def test_a_long_queue_below_its_limit_or_without_one_is_not_full() -> None:
    assert diagnose(window(queues=[queue_row(9, 900, limit=1000)]), NOW).healthy
    assert diagnose(window(queues=[queue_row(9, 10**9)]), NOW).healthy
    t = Thresholds(full_ratio=0.9)
    assert not diagnose(window(queues=[queue_row(9, 900, limit=1000)]), NOW, t).healthy
    old = [queue_row(1, 1000, limit=1000, dropped=5)]
    assert diagnose(window(queues=old), NOW).healthy


# -- verdicts ---------------------------------------------------------------------------------


def test_verdicts_healthy_no_data_and_both_sides() -> None:
    assert diagnose(window(), NOW).verdict == "no_data"
    calm = window(busy([10, 12, 8]), [queue_row(9, 30, limit=1000)])
    assert diagnose(calm, NOW).verdict == "healthy"
    both = window(busy([100, 200, 300]), [queue_row(9, 1000, limit=1000)])
    health = diagnose(both, NOW)
    assert health.verdict == "queue_and_consumer_fault"
    assert [f.rule for f in health.findings] == ["consumers_too_slow", "queue_full"]


def test_lookback_covers_every_rule() -> None:
    t = Thresholds()
    assert t.lookback_ms(IV) == 360_000
    assert Thresholds(growth_intervals=10).lookback_ms(IV) == 12 * IV
