"""The detector's state machine and the active-cluster choice (core/failure_detection.py), directly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqgate.core.failure_detection import (
    HARD_FAILURES,
    SERVING,
    ClusterState,
    DetectionRules,
    Detector,
    Outcome,
    choose_active,
)

H, S, F, R = ClusterState.HEALTHY, ClusterState.SUSPECT, ClusterState.FAILED, ClusterState.RECOVERING
ALLOWED = {(H, S), (S, H), (H, F), (S, F), (F, R), (F, H), (R, H), (R, F)}

rules_st = st.builds(
    DetectionRules,
    send_timeout_s=st.just(1.0),
    fail_after=st.integers(1, 4),
    window_s=st.sampled_from([1.0, 5.0, 30.0]),
    error_rate=st.sampled_from([0.2, 0.5, 1.0]),
    min_samples=st.integers(1, 30),
    rejoin_probes=st.integers(1, 6),
    rejoin_min_s=st.sampled_from([0.0, 0.5]),
)
steps_st = st.lists(st.tuples(st.sampled_from(list(Outcome)), st.integers(0, 700)), max_size=120)


def run(rules: DetectionRules, steps: list[tuple[Outcome, int]]) -> tuple[Detector, list[tuple[int, object]]]:
    det = Detector("c", rules, 0)
    now = 0
    seen = []
    for i, (outcome, dt) in enumerate(steps):
        now += dt
        change = det.observe(outcome, now)
        if change is not None:
            seen.append((i, change))
    return det, seen


@settings(max_examples=400, deadline=None)
@given(rules_st, steps_st)
def test_transitions_follow_the_machine(rules: DetectionRules, steps: list[tuple[Outcome, int]]) -> None:
    det, seen = run(rules, steps)
    state = H
    for i, change in seen:
        assert change.before == state  # type: ignore[attr-defined]
        assert (change.before, change.after) in ALLOWED  # type: ignore[attr-defined]
        state = change.after  # type: ignore[attr-defined]
        outcome = steps[i][0]
        if state is F and change.before in SERVING:  # type: ignore[attr-defined]
            since_ok = [o for o, _ in steps[: i + 1]]
            tail = (
                since_ok[len(since_ok) - 1 - since_ok[::-1].index(Outcome.OK) + 1 :]
                if Outcome.OK in since_ok
                else since_ok
            )
            hard = sum(o in HARD_FAILURES for o in tail)
            by_rate = change.reason.startswith("error rate")  # type: ignore[attr-defined]
            assert hard >= rules.fail_after or by_rate
            if by_rate:
                bad = sum(o is not Outcome.OK for o, _ in steps[: i + 1])
                assert bad >= rules.error_rate * rules.min_samples
        if state is H and change.before in (F, R):  # type: ignore[attr-defined]
            last = [o for o, _ in steps[max(0, i + 1 - rules.rejoin_probes) : i + 1]]
            assert last == [Outcome.OK] * rules.rejoin_probes  # hysteresis: N good in a row
        if state is S:
            assert outcome in HARD_FAILURES
    assert det.state == state


@settings(max_examples=300, deadline=None)
@given(rules_st, steps_st)
def test_enough_good_answers_always_bring_a_cluster_back(
    rules: DetectionRules, steps: list[tuple[Outcome, int]]
) -> None:
    det, _ = run(rules, steps)
    now = sum(dt for _, dt in steps)
    gap = int(rules.rejoin_min_s * 1000 / max(1, rules.rejoin_probes)) + 1
    for _ in range(rules.rejoin_probes + 2):
        now += gap
        det.observe(Outcome.OK, now)
    assert det.state is H


@settings(max_examples=300, deadline=None)
@given(
    rules_st,
    st.lists(st.tuples(st.sampled_from([Outcome.OK, Outcome.ERROR, Outcome.RETRY]), st.integers(0, 50))),
)
def test_errors_below_the_rate_never_fail(rules: DetectionRules, steps: list[tuple[Outcome, int]]) -> None:
    """Without hard failures a cluster fails only by the rate: fewer bad answers than the
    rate's minimum can never fail it."""
    bad = sum(o is not Outcome.OK for o, _ in steps)
    det, seen = run(rules, steps)
    if bad < rules.error_rate * rules.min_samples:
        assert seen == [] and det.state is H


def test_one_failure_is_suspect_and_two_fail() -> None:
    det = Detector("c", DetectionRules(fail_after=2), 0)
    assert det.observe(Outcome.CONNECT_FAILED, 10).after is S  # type: ignore[union-attr]
    assert det.observe(Outcome.OK, 20).after is H  # type: ignore[union-attr]
    det.observe(Outcome.TIMED_OUT, 30)
    change = det.observe(Outcome.CONNECT_FAILED, 40)
    assert change is not None and change.after is F and "2 failures in a row" in change.reason


def test_rejoin_needs_n_good_probes_in_a_row_and_time() -> None:
    det = Detector("c", DetectionRules(fail_after=1, rejoin_probes=3, rejoin_min_s=1.0), 0)
    det.observe(Outcome.CONNECT_FAILED, 0)
    assert det.state is F
    det.observe(Outcome.OK, 100)
    det.observe(Outcome.OK, 200)
    assert det.state is R
    det.observe(Outcome.TIMED_OUT, 300)  # flapping: back out
    assert det.state is F
    for t in (400, 500, 600):
        det.observe(Outcome.OK, t)
    assert det.state is R  # 3 in a row but only 0.2 s
    det.observe(Outcome.OK, 1400)
    assert det.state is H


def test_error_rate_over_the_window() -> None:
    det = Detector("c", DetectionRules(window_s=10.0, error_rate=0.6, min_samples=10), 0)
    for t in range(0, 9000, 1000):
        det.observe(Outcome.OK, t)
        det.observe(Outcome.ERROR, t + 1)
    assert det.state is H  # 9 of 18 bad: under 0.6
    assert [det.observe(Outcome.ERROR, 9500 + i) for i in range(4)] == [None] * 4  # 13 of 22
    change = det.observe(Outcome.ERROR, 9600)  # 14 of 23 = 0.61
    assert change is not None and change.after is F and change.reason.startswith("error rate 14/23")
    # Old outcomes leave the window.
    det2 = Detector("c", DetectionRules(window_s=1.0, error_rate=0.5, min_samples=4), 0)
    for t in range(3):
        det2.observe(Outcome.ERROR, t)
    assert det2.window(5000) == (0, 0)
    det2.observe(Outcome.ERROR, 5000)
    assert det2.state is H


def test_slow_operation_counts_as_timed_out() -> None:
    rules = DetectionRules(send_timeout_s=60.0)
    assert rules.classify_duration(Outcome.OK, 61.0) is Outcome.TIMED_OUT
    assert rules.classify_duration(Outcome.OK, 59.0) is Outcome.OK
    assert rules.classify_duration(Outcome.ERROR, 61.0) is Outcome.ERROR
    with pytest.raises(ValueError):
        DetectionRules(error_rate=0)


states_st = st.fixed_dictionaries(
    {}, optional={"p": st.sampled_from(list(ClusterState)), "b": st.sampled_from(list(ClusterState))}
)


@settings(max_examples=500)
@given(states_st, st.sampled_from([None, "p", "b", "gone"]), st.booleans(), st.booleans())
def test_choice_of_the_active_cluster(
    states: dict[str, ClusterState], current: str | None, has_backup: bool, auto: bool
) -> None:
    backup = "b" if has_backup else None
    if current == "b" and not has_backup:
        current = "gone"
    choice = choose_active(primary="p", backup=backup, current=current, states=states, auto_failback=auto)
    assert choice.cluster in ("p", backup)
    if current in ("p", "b"):
        assert choice.switched == (choice.cluster != current)
        if choice.switched:
            assert states.get(choice.cluster) is H  # only ever to a healthy cluster
        if states.get(current) in SERVING and not (auto and current == "b"):
            assert not choice.switched  # a serving cluster is not left (no flapping)
        other = {"p": backup, "b": "p"}[current]
        if states.get(current) not in SERVING and other is not None and states.get(other) is H:
            assert choice.cluster == other
    else:
        if states.get("p") in SERVING or backup is None or states.get("b") is not H:
            assert choice.cluster == "p"


def test_choice_examples() -> None:
    st_ = {"p": F, "b": H}
    c = choose_active(primary="p", backup="b", current="p", states=st_)
    assert (c.cluster, c.switched, c.reason) == ("b", True, "p is failed")
    c = choose_active(primary="p", backup="b", current="b", states={"p": H, "b": H})
    assert (c.cluster, c.switched) == ("b", False)
    c = choose_active(primary="p", backup="b", current="b", states={"p": H, "b": H}, auto_failback=True)
    assert (c.cluster, c.switched) == ("p", True) and "fail-back" in c.reason
    c = choose_active(primary="p", backup="b", current="p", states={"p": F, "b": F})
    assert (c.cluster, c.switched) == ("p", False) and "no other cluster" in c.reason
