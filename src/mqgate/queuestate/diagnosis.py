"""A project's health from its recent queue state intervals: is a fault on the queue side (the
store, a full queue) or on the consumer side (too slow, down, not acking)?

Pure: it reads the interval rows of a `ProjectWindow` (query at least
`Thresholds.lookback_ms(interval_ms)` back) and `now_ms`, and returns findings. Backlog is a
consumer group's newest offset minus its committed offset, per queue; "the last N intervals"
are consecutive closed intervals ending with the latest one, which must have ended no more than
two intervals before now (older data says nothing about now). Paused consumers (passed in) are
left out of the consumer rules: not pulling is what pausing means.

Rules (defaults in `Thresholds`):

- `consumer_down` (consumer side, per consumer and topic): the group's latest average backlog
  over its queues is at least `min_backlog` (1) and it has not pulled from the topic for
  `silent_after_ms` (300 000 ms). A consumer whose rows do not yet reach back that far, with no
  pull in them, is not judged. Since: its last pull, or its first row ("at least since").
- `consumers_too_slow` (consumer side, per consumer, topic and queue): over the last
  `growth_intervals` (3) intervals the queue's average backlog never falls and rises by at
  least `min_growth` (10) messages in total, while the group pulled and acked (at least one
  pull and one acked message on the topic) in every one of them. Since: the first interval of
  the longest run of non-falling backlog that ends now.
- `consumer_not_acking` (consumer side, per consumer and topic): over the last
  `growth_intervals` intervals the group has backlog, was delivered messages in each interval,
  and acked none: it receives but does not settle (crashing handlers, a lost ack path).
- `store_fault` (queue side, per topic): at least `min_errors` (1) produce errors of a type in
  `store_error_types` (storage, disk_full, unavailable, corrupt_record, internal) in intervals
  overlapping the last `error_window_ms` (300 000 ms). Client errors (bad_request, too_large,
  unauthorized, ...) are not store faults; they are shown in the evidence only.
- `queue_full` (queue side, per topic and queue): in intervals overlapping the last
  `full_window_ms` (300 000 ms) the queue's maximum length reached `full_ratio` (0.95) of its
  length limit, or retention removed messages no consumer group had read (dropped > 0).

`consumer_down` excludes the other two consumer rules for the same consumer and topic.
Verdict: `healthy` with no finding, else `consumer_fault`, `queue_fault` or
`queue_and_consumer_fault`; `no_data` when the window holds no row at all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import pairwise
from typing import Final, TypeVar

import msgspec

from mqgate.queuestate.rows import NO_QUEUE, ConsumerInterval, ProduceInterval, ProjectWindow, QueueInterval

CONSUMER_SIDE: Final = "consumer"
QUEUE_SIDE: Final = "queue"

_K = TypeVar("_K")
_R = TypeVar("_R")
EvidenceValue = int | float | str | None | list[float] | list[int] | dict[str, int] | dict[str, float]


class Thresholds(msgspec.Struct, frozen=True):
    growth_intervals: int = 3
    min_growth: int = 10
    silent_after_ms: int = 300_000
    min_backlog: int = 1
    error_window_ms: int = 300_000
    min_errors: int = 1
    store_error_types: frozenset[str] = frozenset(
        {"storage", "disk_full", "unavailable", "corrupt_record", "internal"}
    )
    full_ratio: float = 0.95
    full_window_ms: int = 300_000

    def lookback_ms(self, interval_ms: int) -> int:
        """How far back the window must reach for every rule to see what it needs."""
        return max(
            self.silent_after_ms + interval_ms,
            self.error_window_ms + interval_ms,
            self.full_window_ms + interval_ms,
            (self.growth_intervals + 2) * interval_ms,
        )


class Finding(msgspec.Struct, frozen=True):
    rule: str
    side: str  # CONSUMER_SIDE or QUEUE_SIDE
    project: str
    topic: str
    queue: int | None
    consumer: str | None
    since_ms: int
    summary: str
    evidence: dict[str, EvidenceValue] = msgspec.field(default_factory=dict)


class ProjectHealth(msgspec.Struct, frozen=True):
    project: str
    verdict: str
    checked_ms: int
    window_since_ms: int
    findings: tuple[Finding, ...]

    @property
    def healthy(self) -> bool:
        return self.verdict == "healthy"


def diagnose(
    window: ProjectWindow,
    now_ms: int,
    thresholds: Thresholds | None = None,
    paused: Collection[str] = frozenset(),
) -> ProjectHealth:
    t = thresholds or Thresholds()
    project = window.project
    findings = [
        *_store_faults(project, window.produce, now_ms, t),
        *_full_queues(project, window.queues, now_ms, t),
        *_consumer_faults(project, window.consumers, now_ms, t, paused),
    ]
    findings.sort(key=lambda f: (f.side, f.rule, f.topic, f.queue or 0, f.consumer or ""))
    sides = {f.side for f in findings}
    if not (window.queues or window.consumers or window.produce):
        verdict = "no_data"
    elif not sides:
        verdict = "healthy"
    elif sides == {CONSUMER_SIDE}:
        verdict = "consumer_fault"
    elif sides == {QUEUE_SIDE}:
        verdict = "queue_fault"
    else:
        verdict = "queue_and_consumer_fault"
    return ProjectHealth(project, verdict, now_ms, window.since_ms, tuple(findings))


def _store_faults(project: str, rows: Sequence[ProduceInterval], now_ms: int, t: Thresholds) -> list[Finding]:
    cutoff = now_ms - t.error_window_ms
    by_topic: dict[str, list[ProduceInterval]] = defaultdict(list)
    for r in rows:
        if r.start_ms + max(r.interval_ms, 1) > cutoff:
            by_topic[r.topic].append(r)
    out = []
    for topic, recent in sorted(by_topic.items()):
        store: dict[str, int] = defaultdict(int)
        client: dict[str, int] = defaultdict(int)
        first = None
        for r in sorted(recent, key=lambda r: r.start_ms):
            for kind, n in r.errors.items():
                if kind in t.store_error_types:
                    store[kind] += n
                    first = r.start_ms if first is None else first
                else:
                    client[kind] += n
        failed = sum(store.values())
        if first is None or failed < t.min_errors:
            continue
        produced = sum(r.produced for r in recent)
        out.append(
            Finding(
                "store_fault",
                QUEUE_SIDE,
                project,
                topic,
                None,
                None,
                first,
                f"{failed} produce calls to {topic} failed in the store ({', '.join(sorted(store))})",
                {
                    "store_errors": dict(store),
                    "client_errors": dict(client),
                    "produced": produced,
                    "error_ratio": round(failed / (failed + produced), 4),
                },
            )
        )
    return out


def _full_queues(project: str, rows: Sequence[QueueInterval], now_ms: int, t: Thresholds) -> list[Finding]:
    cutoff = now_ms - t.full_window_ms
    out = []
    for (topic, queue), series in sorted(_group(rows, lambda r: (r.topic, r.queue)).items()):
        recent = [r for r in series if r.end_ms > cutoff]
        full = [
            r
            for r in recent
            if r.dropped > 0
            or (r.length_limit and r.max_length is not None and r.max_length >= t.full_ratio * r.length_limit)
        ]
        if not full:
            continue
        dropped = sum(r.dropped for r in recent)
        limit = next((r.length_limit for r in reversed(recent) if r.length_limit), None)
        peak = max((r.max_length for r in recent if r.max_length is not None), default=None)
        why = f"retention removed {dropped} unread messages" if dropped else f"length {peak} of limit {limit}"
        out.append(
            Finding(
                "queue_full",
                QUEUE_SIDE,
                project,
                topic,
                queue,
                None,
                full[0].start_ms,
                f"queue {queue} of {topic} is full: {why}",
                {"max_length": peak, "length_limit": limit, "dropped": dropped, "full_intervals": len(full)},
            )
        )
    return out


def _consumer_faults(
    project: str, rows: Sequence[ConsumerInterval], now_ms: int, t: Thresholds, paused: Collection[str]
) -> list[Finding]:
    # Activity is per consumer and topic (a pull that found nothing has no queue); backlog is per queue.
    activity: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(
        lambda: defaultdict(lambda: [0, 0, 0])
    )
    last_pull: dict[tuple[str, str], int] = {}
    first_seen: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r.consumer, r.topic)
        counts = activity[key][r.start_ms]
        counts[0] += r.pulls
        counts[1] += r.delivered
        counts[2] += r.acked
        if r.last_pull_ms is not None and r.last_pull_ms > last_pull.get(key, -1):
            last_pull[key] = r.last_pull_ms
        first_seen[key] = min(first_seen.get(key, r.start_ms), r.start_ms)
    queues = _group(
        (r for r in rows if r.queue != NO_QUEUE and r.consumer not in paused), lambda r: (r.consumer, r.topic)
    )
    out: list[Finding] = []
    for (consumer, topic), series in sorted(queues.items()):
        per_queue = _group(series, lambda r: r.queue)
        latest = {q: _recent_series(rs, now_ms) for q, rs in per_queue.items()}
        backlog = {
            q: s[-1].avg_backlog or 0.0 for q, s in latest.items() if s and s[-1].avg_backlog is not None
        }
        key = (consumer, topic)
        down = _consumer_down(project, key, backlog, last_pull.get(key), first_seen[key], now_ms, t)
        if down is not None:
            out.append(down)
            continue
        for queue, recent in sorted(latest.items()):
            slow = _too_slow(project, key, queue, recent, activity[key], t)
            if slow is not None:
                out.append(slow)
        not_acking = _not_acking(project, key, latest, activity[key], t)
        if not_acking is not None:
            out.append(not_acking)
    return out


def _consumer_down(
    project: str,
    key: tuple[str, str],
    backlog: dict[int, float],
    last_pull_ms: int | None,
    first_seen_ms: int,
    now_ms: int,
    t: Thresholds,
) -> Finding | None:
    total = sum(backlog.values())
    if total < t.min_backlog:
        return None
    since = last_pull_ms if last_pull_ms is not None else first_seen_ms
    silent = now_ms - since
    if silent < t.silent_after_ms:
        return None
    consumer, topic = key
    pulled = "never pulled in the window" if last_pull_ms is None else f"no pull for {silent // 1000} s"
    return Finding(
        "consumer_down",
        CONSUMER_SIDE,
        project,
        topic,
        None,
        consumer,
        since,
        f"consumer {consumer} on {topic}: {pulled} with a backlog of {round(total)}",
        {
            "backlog": round(total, 1),
            "backlog_by_queue": {str(q): round(b, 1) for q, b in sorted(backlog.items())},
            "last_pull_ms": last_pull_ms,
            "silent_ms": silent,
        },
    )


def _too_slow(
    project: str,
    key: tuple[str, str],
    queue: int,
    recent: list[ConsumerInterval],
    activity: dict[int, list[int]],
    t: Thresholds,
) -> Finding | None:
    n = t.growth_intervals
    backlog = [r.avg_backlog for r in recent]
    last = [b for b in backlog[-n:] if b is not None]
    if len(last) < n:
        return None
    if any(b < a for a, b in pairwise(last)) or last[-1] - last[0] < t.min_growth:
        return None
    starts = [r.start_ms for r in recent[-n:]]
    if not all(activity[s][0] > 0 and activity[s][2] > 0 for s in starts):
        return None
    run_start = len(backlog) - n
    while run_start > 0:
        before, after = backlog[run_start - 1], backlog[run_start]
        if before is None or after is None or before > after:
            break
        run_start -= 1
    seconds = sum(r.interval_ms for r in recent[-n:]) / 1000
    consumer, topic = key
    acked = sum(activity[s][2] for s in starts)
    return Finding(
        "consumers_too_slow",
        CONSUMER_SIDE,
        project,
        topic,
        queue,
        consumer,
        recent[run_start].start_ms,
        f"backlog of {consumer} on {topic} queue {queue} grew {last[0]:.0f} → {last[-1]:.0f} "
        f"while it pulled and acked",
        {
            "backlog": [round(b, 1) for b in last],
            "growth_per_s": round((last[-1] - last[0]) / seconds, 3),
            "acked_per_s": round(acked / seconds, 3),
            "pulls": [activity[s][0] for s in starts],
            "acked": [activity[s][2] for s in starts],
        },
    )


def _not_acking(
    project: str,
    key: tuple[str, str],
    latest: dict[int, list[ConsumerInterval]],
    activity: dict[int, list[int]],
    t: Thresholds,
) -> Finding | None:
    n = t.growth_intervals
    recent = [s for s in latest.values() if s]
    if not recent:
        return None
    interval_ms = recent[0][-1].interval_ms
    newest = max(s[-1].start_ms for s in recent)
    starts = [newest - i * interval_ms for i in range(n - 1, -1, -1)]
    last_backlog = sum(s[-1].avg_backlog or 0.0 for s in recent)
    delivered = [activity[s][1] if s in activity else 0 for s in starts]
    acked = sum(activity[s][2] for s in starts if s in activity)
    if last_backlog < t.min_backlog or acked > 0 or not all(d > 0 for d in delivered):
        return None
    consumer, topic = key
    return Finding(
        "consumer_not_acking",
        CONSUMER_SIDE,
        project,
        topic,
        None,
        consumer,
        starts[0],
        f"consumer {consumer} on {topic} was delivered {sum(delivered)} messages and acked none",
        {"delivered": delivered, "acked": acked, "backlog": round(last_backlog, 1)},
    )


def _recent_series(rows: list[ConsumerInterval], now_ms: int) -> list[ConsumerInterval]:
    """The run of consecutive intervals ending with the latest one, if that one is recent."""
    rows = sorted(rows, key=lambda r: r.start_ms)
    if not rows or rows[-1].end_ms < now_ms - 2 * rows[-1].interval_ms:
        return []
    start = len(rows) - 1
    while start > 0 and rows[start - 1].end_ms == rows[start].start_ms:
        start -= 1
    return rows[start:]


def _group(rows: Iterable[_R], key: Callable[[_R], _K]) -> dict[_K, list[_R]]:
    out: dict[_K, list[_R]] = defaultdict(list)
    for r in rows:
        out[key(r)].append(r)
    return out
