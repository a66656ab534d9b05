"""Failure detection and the choice of a project's active cluster (SPEC P8): pure rules.

A `Detector` watches one store cluster. It is fed observations (a background probe, or an
operation of the produce/consume path) with the time they ended; it never reads a clock or
does I/O, so every rule here is tested directly. A cluster is

- HEALTHY: serving;
- SUSPECT: a connect failure or a time-out was seen, fewer than `fail_after` in a row; it
  still serves (one lost packet must not move a project);
- FAILED: `fail_after` hard failures in a row (connect failed, or no answer within the send
  time-out), or the share of bad outcomes (errors, retries, hard failures) over the last
  `window_s` passed `error_rate` with at least `min_samples` outcomes in the window;
- RECOVERING: a failed cluster answered again; it rejoins (HEALTHY) after `rejoin_probes`
  good outcomes in a row spanning at least `rejoin_min_s`; one bad outcome sends it back to
  FAILED (hysteresis: a flapping server stays out).

`choose_active` picks the cluster a project writes to from its primary, backup and their
states, with the reason for a switch.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from typing import Final

import msgspec


class ClusterState(enum.StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    FAILED = "failed"
    RECOVERING = "recovering"


class Outcome(enum.StrEnum):
    OK = "ok"
    CONNECT_FAILED = "connect_failed"  # refused, reset, unreachable: a hard failure
    TIMED_OUT = "timed_out"  # no answer within the send (or probe) time-out: a hard failure
    ERROR = "error"  # the server answered with an error (OOM, read-only...): counts in the rate
    RETRY = "retry"  # an operation needed a retry to succeed: counts in the rate


HARD_FAILURES: Final = frozenset({Outcome.CONNECT_FAILED, Outcome.TIMED_OUT})
SERVING: Final = frozenset({ClusterState.HEALTHY, ClusterState.SUSPECT})
# The window's outcomes are counted in this many buckets: memory does not grow with the rate.
_BUCKETS: Final = 10


class DetectionRules(msgspec.Struct, frozen=True):
    """Every threshold of the detector; the defaults are the documented ones (docs/FAILOVER.md)."""

    send_timeout_s: float = 60.0  # an operation slower than this is TIMED_OUT (SPEC P8 default)
    fail_after: int = 2  # hard failures in a row that fail a cluster
    window_s: float = 30.0  # the error-rate window
    error_rate: float = 0.5  # bad share of the window's outcomes that fails a cluster
    min_samples: int = 20  # fewer outcomes in the window: the rate is not judged
    rejoin_probes: int = 5  # good outcomes in a row that bring a failed cluster back
    rejoin_min_s: float = 0.0  # ...spanning at least this long

    def __post_init__(self) -> None:
        if self.send_timeout_s <= 0 or self.window_s <= 0:
            raise ValueError("send_timeout_s and window_s must be positive")
        if self.fail_after < 1 or self.rejoin_probes < 1 or self.min_samples < 1:
            raise ValueError("fail_after, rejoin_probes and min_samples must be at least 1")
        if not 0.0 < self.error_rate <= 1.0:
            raise ValueError("error_rate must be in (0, 1]")

    def classify_duration(self, outcome: Outcome, seconds: float) -> Outcome:
        """An operation that succeeded after the send time-out still counts as timed out."""
        if outcome is Outcome.OK and seconds > self.send_timeout_s:
            return Outcome.TIMED_OUT
        return outcome


class Transition(msgspec.Struct, frozen=True):
    cluster: str
    before: ClusterState
    after: ClusterState
    reason: str
    at_ms: int


class Detector:
    """The state of one cluster, moved by observations (time passed in, in ms)."""

    __slots__ = (
        "_buckets",
        "changed_ms",
        "good_since_ms",
        "good_streak",
        "hard_streak",
        "name",
        "reason",
        "rules",
        "state",
    )

    def __init__(
        self, name: str, rules: DetectionRules, now_ms: int, state: ClusterState = ClusterState.HEALTHY
    ):
        self.name = name
        self.rules = rules
        self.state = state
        self.reason = "started"
        self.changed_ms = now_ms
        self.hard_streak = 0
        self.good_streak = 0
        self.good_since_ms = now_ms
        # (bucket start ms, outcomes, bad outcomes), oldest first.
        self._buckets: deque[list[int]] = deque()

    # --- the error-rate window -----------------------------------------------------------

    def _bucket_ms(self) -> int:
        return max(1, int(self.rules.window_s * 1000) // _BUCKETS)

    def _count(self, bad: bool, now_ms: int) -> None:
        start = now_ms - now_ms % self._bucket_ms()
        if self._buckets and self._buckets[-1][0] >= start:
            bucket = self._buckets[-1]  # an observation that ended a little earlier lands here too
        else:
            bucket = [start, 0, 0]
            self._buckets.append(bucket)
        bucket[1] += 1
        bucket[2] += int(bad)
        self._expire(now_ms)

    def _expire(self, now_ms: int) -> None:
        oldest = now_ms - int(self.rules.window_s * 1000)
        while self._buckets and self._buckets[0][0] + self._bucket_ms() <= oldest:
            self._buckets.popleft()

    def window(self, now_ms: int) -> tuple[int, int]:
        """(outcomes, bad outcomes) in the window ending at `now_ms`."""
        self._expire(now_ms)
        return sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets)

    def error_rate(self, now_ms: int) -> float:
        total, bad = self.window(now_ms)
        return bad / total if total else 0.0

    # --- the state machine ---------------------------------------------------------------

    def observe(self, outcome: Outcome, now_ms: int, detail: str = "") -> Transition | None:
        """Account one outcome; the transition it caused, if any."""
        bad = outcome is not Outcome.OK
        self._count(bad, now_ms)
        hard = outcome in HARD_FAILURES
        if hard:
            self.hard_streak += 1
        elif outcome is Outcome.OK:
            self.hard_streak = 0  # an error answer is not a connect failure: the streak holds
        if bad:
            self.good_streak = 0
        else:
            if self.good_streak == 0:
                self.good_since_ms = now_ms
            self.good_streak += 1
        why = f"{outcome.value}: {detail}" if detail else outcome.value
        state = self.state
        if state in SERVING:
            # Judged on bad outcomes only: a good answer never fails a cluster.
            total, bad_count = self.window(now_ms) if bad else (0, 0)
            if bad and total >= self.rules.min_samples and bad_count / total >= self.rules.error_rate:
                return self._move(
                    ClusterState.FAILED,
                    f"error rate {bad_count}/{total} over {self.rules.window_s:g}s "
                    f">= {self.rules.error_rate:g} (last {why})",
                    now_ms,
                )
            if self.hard_streak >= self.rules.fail_after:
                return self._move(
                    ClusterState.FAILED, f"{self.hard_streak} failures in a row ({why})", now_ms
                )
            if hard and state is ClusterState.HEALTHY:
                return self._move(ClusterState.SUSPECT, why, now_ms)
            if outcome is Outcome.OK and state is ClusterState.SUSPECT:
                return self._move(ClusterState.HEALTHY, "answered again", now_ms)
            return None
        if state is ClusterState.FAILED:
            if outcome is not Outcome.OK:
                return None
            moved = self._move(ClusterState.RECOVERING, "answered again", now_ms)
            rejoined = self._rejoin(now_ms)  # at once when one good answer is enough
            return (
                moved
                if rejoined is None
                else Transition(self.name, moved.before, rejoined.after, rejoined.reason, now_ms)
            )
        # RECOVERING
        if bad:
            return self._move(ClusterState.FAILED, f"failed again while recovering ({why})", now_ms)
        return self._rejoin(now_ms)

    def _rejoin(self, now_ms: int) -> Transition | None:
        rules = self.rules
        if (
            self.good_streak >= rules.rejoin_probes
            and now_ms - self.good_since_ms >= rules.rejoin_min_s * 1000
        ):
            # A fresh start: the outage's errors must not fail the rejoined cluster at once.
            self._buckets.clear()
            return self._move(ClusterState.HEALTHY, f"{self.good_streak} good answers in a row", now_ms)
        return None

    def _move(self, after: ClusterState, reason: str, now_ms: int) -> Transition:
        before = self.state
        self.state = after
        self.reason = reason
        self.changed_ms = now_ms
        return Transition(self.name, before, after, reason, now_ms)


# --- the active cluster of a project --------------------------------------------------------


class Choice(msgspec.Struct, frozen=True):
    cluster: str
    switched: bool
    reason: str


def choose_active(
    *,
    primary: str,
    backup: str | None,
    current: str | None,
    states: Mapping[str, ClusterState],
    auto_failback: bool = False,
) -> Choice:
    """Where a project writes. Rules, in order:

    - no current cluster yet: the primary, unless it is not serving and the backup is HEALTHY;
    - the current cluster serves (HEALTHY or SUSPECT): stay, except for an automatic
      fail-back to a HEALTHY primary when `auto_failback` is on;
    - the current cluster does not serve (FAILED, RECOVERING, unknown): the other one if it is
      HEALTHY; else stay (nothing better: produces go to the spool).

    A switch only ever goes to a HEALTHY cluster, and a SUSPECT one is never left: a single
    failure moves nothing.
    """
    other_of = {primary: backup, backup: primary} if backup is not None else {primary: None}

    def serving(name: str | None) -> bool:
        return name is not None and states.get(name) in SERVING

    def healthy(name: str | None) -> bool:
        return name is not None and states.get(name) is ClusterState.HEALTHY

    def state_of(name: str) -> str:
        found = states.get(name)
        return found.value if found is not None else "unknown"

    if current is None or current not in other_of:
        # First choice, or the project's clusters were changed by the operator.
        if not serving(primary) and healthy(backup):
            assert backup is not None
            return Choice(backup, True, f"primary {primary} is {state_of(primary)}")
        return Choice(primary, current != primary, "primary" if current is None else "clusters changed")
    if serving(current):
        if auto_failback and current != primary and healthy(primary):
            return Choice(primary, True, f"fail-back: primary {primary} is healthy again")
        return Choice(current, False, f"{current} is {state_of(current)}")
    other = other_of[current]
    if healthy(other):
        assert other is not None
        return Choice(other, True, f"{current} is {state_of(current)}")
    return Choice(current, False, f"{current} is {state_of(current)} and no other cluster is healthy")
