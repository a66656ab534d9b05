"""Alert rules (SPEC G9, issue 13): which conditions hold for a consumer, and what a check
changes in the set of active alerts. Pure: no clock, no I/O (alerts/service.py reads the
figures, keeps the active alerts every gateway shares, and sends the notifications).

Two rules, each at most one alert per consumer (its key is `<kind>:<consumer>`):

- `lag`: the consumer's lag (max − committed over its queues) is over its alert threshold
  (`alert_backlog`, 0 = no alert), as `GET /admin/alerts` has always said;
- `dead_letters`: at least N messages were moved to the consumer's dead letters within the
  last window (a sliding window over counts sampled by the checks). It clears once a whole
  window has passed with fewer: a gateway that has watched for less than a window is unsure,
  and an unsure rule never resolves an alert another gateway raised.

A rule's verdict changes only when its figures move (the lag; the dead-letter count) or, for
the window, when time passes one of the counts sampled (`DeadLetterWatch.next_change`): a check
may evaluate only the consumers for which one of these happened (`decide(..., present=...)`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable, Mapping
from typing import Any, Final

import msgspec

LAG: Final = "lag"
DEAD_LETTERS: Final = "dead_letters"
KINDS: Final = (LAG, DEAD_LETTERS)
FIRING: Final = "firing"
RESOLVED: Final = "resolved"

# Why an alert resolved (the notification's `reason`).
BELOW_THRESHOLD: Final = "below_threshold"
NO_NEW_DEAD_LETTERS: Final = "no_new_dead_letters"
ALERT_OFF: Final = "alert_turned_off"
CONSUMER_GONE: Final = "consumer_deleted"


def alert_key(kind: str, consumer: str) -> str:
    return f"{kind}:{consumer}"


def consumer_of(key: str) -> str:
    """The consumer an alert key names (a kind has no colon)."""
    return key.split(":", 1)[1]


class Condition(msgspec.Struct, frozen=True):
    """A rule that holds now for one consumer."""

    kind: str
    consumer: str
    topic: str
    project: str
    value: int  # the lag, or the dead letters added within the window
    threshold: int
    window_s: float = 0.0  # dead_letters: the window the value was counted over

    @property
    def key(self) -> str:
        return alert_key(self.kind, self.consumer)

    @property
    def summary(self) -> str:
        if self.kind == LAG:
            return f"consumer {self.consumer} on topic {self.topic}: lag {self.value} over {self.threshold}"
        return (
            f"consumer {self.consumer} on topic {self.topic}: {self.value} new dead letters "
            f"in the last {self.window_s:g} s (alert at {self.threshold})"
        )


class Clear(msgspec.Struct, frozen=True):
    """The rule was evaluated and does not hold (an active alert of this key resolves)."""

    reason: str
    value: int | None = None  # the figure now (the lag, the dead letters in the window), if read


UNSURE: Final = None  # the rule could not be evaluated this time: leave its alert as it is
Verdict = Condition | Clear | None


def lag_verdict(consumer: str, topic: str, project: str, lag: int, threshold: int) -> Verdict:
    if threshold <= 0:
        return Clear(ALERT_OFF)
    if lag > threshold:
        return Condition(LAG, consumer, topic, project, lag, threshold)
    return Clear(BELOW_THRESHOLD, lag)


def growth(points: Iterable[tuple[int, int]], now_ms: int, window_ms: int) -> tuple[int, bool]:
    """From counts (time, monotonic count) oldest first: how much the count grew within the
    window ending now, and whether the points cover the whole window (one at or before its
    start). A count that fell (its topic was recreated) counts from the fall."""
    start = now_ms - window_ms
    base: int | None = None
    covered = False
    last = 0
    grown = 0
    for at, count in points:
        if at <= start:
            base, covered, last = count, True, count
            grown = 0
            continue
        if base is None:
            base = last = count
            continue
        grown += count - last if count >= last else count
        last = count
    return grown, covered


class DeadLetterWatch(msgspec.Struct):
    """Dead-letter counts per consumer over a sliding window, and the rule on them."""

    threshold: int  # new dead letters within the window that raise the alert; 0 = off
    window_ms: int
    _points: dict[str, deque[tuple[int, int]]] = msgspec.field(default_factory=dict)

    def observe(self, consumer: str, count: int, now_ms: int) -> None:
        """The count now. A count equal to the last one kept is not kept: it changes neither
        the growth in any window nor whether the points cover it (the earlier point of the
        same count does), so points are kept only as counts move (`next_change`)."""
        points = self._points.setdefault(consumer, deque())
        if points and points[-1][0] > now_ms:  # the clock stepped back: start again
            points.clear()
        if not points or points[-1][1] != count:
            points.append((now_ms, count))
        start = now_ms - self.window_ms
        while len(points) > 1 and points[1][0] <= start:  # keep one point at or before the start
            points.popleft()

    def verdict(self, consumer: str, topic: str, project: str, now_ms: int) -> Verdict:
        if self.threshold <= 0:
            return Clear(ALERT_OFF)
        points = self._points.get(consumer)
        if not points:
            return UNSURE
        grown, covered = growth(points, now_ms, self.window_ms)
        if grown >= self.threshold:
            window_s = self.window_ms / 1000
            return Condition(DEAD_LETTERS, consumer, topic, project, grown, self.threshold, window_s)
        return Clear(NO_NEW_DEAD_LETTERS, grown) if covered else UNSURE

    def next_change(self, consumer: str, now_ms: int) -> int | None:
        """The first time after `now_ms` at which the verdict may change with no new count:
        when the window's start passes a count sampled (that count becomes the window's base,
        or covers the window at last). None: never, without a new count."""
        if self.threshold <= 0:
            return None
        for at, _ in self._points.get(consumer, ()):
            if at + self.window_ms > now_ms:
                return at + self.window_ms
        return None

    def forget(self, consumer: str) -> None:
        self._points.pop(consumer, None)

    def keep_only(self, consumers: Iterable[str]) -> None:
        """Forget consumers that are gone."""
        keep = set(consumers)
        for name in [n for n in self._points if n not in keep]:
            del self._points[name]


class Decision(msgspec.Struct, frozen=True):
    fire: list[Condition]  # hold and were not active: notify "firing"
    keep: list[Condition]  # hold and are active: their figures are updated, nobody is told
    resolve: list[tuple[str, Clear]]  # active and no longer hold: notify "resolved"


def decide(
    active: Iterable[str], verdicts: Mapping[str, Verdict], present: Container[str] | None = None
) -> Decision:
    """What a check changes: `active` are the keys of the alerts firing now (every gateway's),
    `verdicts` what this check found per key. An active key with no verdict at all belongs to
    a consumer that is gone; when the check evaluated only some consumers, `present` are those
    that exist, and an active key without a verdict resolves only if its consumer is not one."""
    active = set(active)
    fire: list[Condition] = []
    keep: list[Condition] = []
    resolve: list[tuple[str, Clear]] = []
    for key, verdict in sorted(verdicts.items()):
        if isinstance(verdict, Condition):
            (keep if key in active else fire).append(verdict)
        elif isinstance(verdict, Clear) and key in active:
            resolve.append((key, verdict))
    gone = active - set(verdicts)
    if present is not None:
        gone = {key for key in gone if consumer_of(key) not in present}
    resolve += [(key, Clear(CONSUMER_GONE)) for key in sorted(gone)]
    return Decision(fire, keep, resolve)


def notification(
    status: str, alert: Mapping[str, Any], *, gateway: str, at_ms: int, reason: str | None = None
) -> dict[str, Any]:
    """The JSON a webhook receives: one alert that fired or resolved. `alert` is an active
    alert's row (key, kind, consumer, topic, project, value, peak, threshold, since_ms,
    window_s, summary): `value` is the figure now (when resolved: the one that cleared it), `peak`
    the highest while active. A lag alert also names its `lag`, a dead-letter alert `deadLetters`."""
    body: dict[str, Any] = {
        "status": status,
        "key": alert["key"],
        "kind": alert["kind"],
        "consumer": alert["consumer"],
        "topic": alert["topic"],
        "project": alert["project"],
        "value": alert["value"],
        "peak": alert["peak"],
        "threshold": alert["threshold"],
        "since": alert["since_ms"],
        "summary": alert["summary"],
        "gateway": gateway,
        "at": at_ms,
    }
    if alert["kind"] == LAG:
        body["lag"] = alert["value"]
    else:
        body["deadLetters"] = alert["value"]
        body["windowS"] = alert["window_s"]
    if status == RESOLVED:
        body["resolvedAt"] = at_ms
        body["reason"] = reason or BELOW_THRESHOLD
    return body
