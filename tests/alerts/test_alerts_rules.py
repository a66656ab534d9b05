"""The alert rules without a gateway (mqgate.alerts.rules): lag over a threshold, dead letters
growing over a sliding window, what a check changes, and the notification's body."""

from __future__ import annotations

from mqgate.alerts.rules import (
    ALERT_OFF,
    BELOW_THRESHOLD,
    CONSUMER_GONE,
    DEAD_LETTERS,
    FIRING,
    LAG,
    NO_NEW_DEAD_LETTERS,
    RESOLVED,
    UNSURE,
    Clear,
    Condition,
    DeadLetterWatch,
    alert_key,
    decide,
    growth,
    lag_verdict,
    notification,
)


def test_lag_fires_only_over_the_threshold() -> None:
    assert lag_verdict("c", "t", "p", 11, 10) == Condition(LAG, "c", "t", "p", 11, 10)
    assert lag_verdict("c", "t", "p", 10, 10) == Clear(BELOW_THRESHOLD, 10)  # at the threshold: not over
    assert lag_verdict("c", "t", "p", 10**9, 0) == Clear(ALERT_OFF)  # 0 = no alert
    cond = lag_verdict("c", "t", "p", 11, 10)
    assert isinstance(cond, Condition)
    assert cond.key == "lag:c" and cond.summary == "consumer c on topic t: lag 11 over 10"


def test_growth_counts_within_the_window_and_says_whether_it_is_covered() -> None:
    assert growth([], 1000, 100) == (0, False)
    assert growth([(950, 5)], 1000, 100) == (0, False)  # one point inside: no baseline yet
    assert growth([(950, 5), (990, 8)], 1000, 100) == (3, False)
    assert growth([(800, 1), (900, 5), (950, 7)], 1000, 100) == (2, True)  # 900 is the window's start
    assert growth([(800, 1), (850, 4), (950, 4)], 1000, 100) == (0, True)
    assert growth([(890, 9), (950, 2), (990, 3)], 1000, 100) == (3, True)  # recreated: counts from the fall


def test_dead_letter_watch_fires_on_growth_and_clears_after_a_quiet_window() -> None:
    w = DeadLetterWatch(threshold=2, window_ms=1000)
    assert w.verdict("c", "t", "p", 0) is UNSURE  # never observed
    w.observe("c", 10, 0)  # old dead letters are the baseline, not an alert
    assert w.verdict("c", "t", "p", 0) is UNSURE  # not a whole window watched yet
    w.observe("c", 11, 500)
    assert w.verdict("c", "t", "p", 500) is UNSURE  # one new: under the threshold, window not covered
    w.observe("c", 12, 900)
    fired = w.verdict("c", "t", "p", 900)
    assert fired == Condition(DEAD_LETTERS, "c", "t", "p", 2, 2, 1.0)
    assert "2 new dead letters in the last 1 s" in fired.summary
    w.observe("c", 12, 1600)  # the window (600, 1600] holds one new (at 900): under the threshold
    assert w.verdict("c", "t", "p", 1600) == Clear(NO_NEW_DEAD_LETTERS, 1)
    w.observe("c", 12, 2000)
    assert w.verdict("c", "t", "p", 2000) == Clear(NO_NEW_DEAD_LETTERS, 0)
    assert len(w._points["c"]) <= 3  # old points are dropped, one before the window is kept


def test_the_verdict_changes_with_no_new_count_only_when_the_window_passes_a_count() -> None:
    """What lets a check skip a consumer whose dead letters did not move (issue 27): equal counts
    are not kept (they change no verdict), and `next_change` says when time alone may."""
    w = DeadLetterWatch(threshold=2, window_ms=1000)
    assert w.next_change("c", 0) is None  # never observed
    w.observe("c", 10, 0)
    w.observe("c", 10, 300)  # unchanged: not kept
    assert list(w._points["c"]) == [(0, 10)]
    assert w.next_change("c", 300) == 1000  # then a whole window is watched: sure
    w.observe("c", 12, 900)
    assert w.verdict("c", "t", "p", 900) == Condition(DEAD_LETTERS, "c", "t", "p", 2, 2, 1.0)
    assert w.next_change("c", 900) == 1000
    assert w.verdict("c", "t", "p", 999) == w.verdict("c", "t", "p", 900)  # nothing before it
    assert w.next_change("c", 1000) == 1900  # then the two leave the window
    assert w.verdict("c", "t", "p", 1899) == Condition(DEAD_LETTERS, "c", "t", "p", 2, 2, 1.0)
    assert w.verdict("c", "t", "p", 1900) == Clear(NO_NEW_DEAD_LETTERS, 0)
    assert w.next_change("c", 1900) is None  # and nothing ever again, without a new count
    assert DeadLetterWatch(threshold=0, window_ms=1000).next_change("c", 0) is None


def test_dead_letter_watch_off_forgets_and_survives_a_clock_step_back() -> None:
    assert DeadLetterWatch(threshold=0, window_ms=1000).verdict("c", "t", "p", 5) == Clear(ALERT_OFF)
    w = DeadLetterWatch(threshold=1, window_ms=1000)
    w.observe("c", 3, 5000)
    w.observe("c", 4, 4000)  # the clock went back: start again from this point
    assert w.verdict("c", "t", "p", 4000) is UNSURE
    w.observe("gone", 1, 4000)
    w.keep_only(["c"])
    assert w.verdict("gone", "t", "p", 4000) is UNSURE


def test_decide_fires_keeps_and_resolves() -> None:
    over = Condition(LAG, "a", "t", "p", 20, 10)
    still = Condition(LAG, "b", "t", "p", 30, 10)
    d = decide(
        active=[still.key, "lag:c", "dead_letters:d", "lag:gone", "lag:e"],
        verdicts={
            over.key: over,
            still.key: still,
            "lag:c": Clear(BELOW_THRESHOLD, 4),
            "dead_letters:d": Clear(NO_NEW_DEAD_LETTERS, 0),
            "lag:e": UNSURE,  # could not be read: stays as it is
            "lag:f": Clear(BELOW_THRESHOLD),  # not active: nothing to do
        },
    )
    assert d.fire == [over] and d.keep == [still]
    assert d.resolve == [
        ("dead_letters:d", Clear(NO_NEW_DEAD_LETTERS, 0)),
        ("lag:c", Clear(BELOW_THRESHOLD, 4)),
        ("lag:gone", Clear(CONSUMER_GONE)),
    ]
    # A check of some consumers only (what moved): an active key it did not evaluate stays,
    # unless its consumer is gone.
    active = ["lag:idle", "dead_letters:idle", "lag:gone", "lag:x:y"]
    d = decide(active, {over.key: over}, present={"idle", "a", "x:y"})
    assert d.fire == [over] and d.keep == [] and d.resolve == [("lag:gone", Clear(CONSUMER_GONE))]


def test_notification_bodies() -> None:
    row = {"key": alert_key(LAG, "c"), "kind": LAG, "consumer": "c", "topic": "t", "project": "p",
           "value": 12, "peak": 15, "threshold": 10, "since_ms": 1000, "window_s": 0.0,
           "summary": "consumer c on topic t: lag 12 over 10"}  # fmt: skip
    fired = notification(FIRING, row, gateway="gw:1", at_ms=1000)
    assert fired["status"] == "firing" and fired["lag"] == 12 and fired["threshold"] == 10
    assert fired["consumer"] == "c" and fired["topic"] == "t" and fired["since"] == 1000
    assert "reason" not in fired and "resolvedAt" not in fired and "deadLetters" not in fired
    resolved = notification(RESOLVED, row, gateway="gw:1", at_ms=2000, reason=BELOW_THRESHOLD)
    assert resolved["status"] == "resolved" and resolved["resolvedAt"] == 2000
    assert resolved["reason"] == "below_threshold" and resolved["since"] == 1000
    dl = notification(FIRING, {**row, "key": "dead_letters:c", "kind": DEAD_LETTERS, "window_s": 300.0},
                      gateway="gw:1", at_ms=5)  # fmt: skip
    assert dl["deadLetters"] == 12 and dl["windowS"] == 300.0 and "lag" not in dl
