"""Queue fault vs consumer fault over time, from a project's queue state history
(docs/QUEUE_STATE.md), judged with the gateway's own health rules.

Each interval of the report window is judged by `mqgate.queuestate.diagnosis.diagnose`, run as if
at the interval's end over the rows the health answer would have read then (the rules are
not copied here: only how their findings are placed in time):

- the queue-side rules (`store_fault`, `queue_full`) look back over a window (5 minutes by
  default) and the health answer keeps reporting a fault for that long after it ended. To
  place a fault in the intervals it happened in, they are run with their windows set to one
  interval: each interval is judged on its own rows;
- the consumer-side rules (`consumer_down`, `consumers_too_slow`, `consumer_not_acking`)
  need a run of intervals (5 silent minutes, 3 intervals of growth), so they are run with the
  thresholds as given, and a finding marks the intervals from its `since` (the first interval
  starting at or after it: a consumer found down after 5 silent minutes is down from the
  interval after its last pull; one not acking from the first of the intervals it was
  delivered messages in and acked none) to the interval judged. `consumers_too_slow` marks the
  interval judged only: its `since` is the start of the run of non-falling backlog, which
  reaches back over any flat stretch (a backlog of 0, 0, 16 "grew" from the first 0).

An interval's `state` is `healthy`, `queue_fault`, `consumer_fault`, `queue_and_consumer_fault`
(the diagnosis's verdict words, from the sides of the findings marking it) or `no_data` (no
row of the project starts in it); `health` is what the health answer would have said at its
end (windows as given). Paused groups are not known to the history, so a paused group with a
backlog shows as down.

Pure: rows in, JSON-ready dictionaries out; no Spark (the history holds one row per queue,
consumer and topic per interval: small next to the trace events).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, Final, Generic, TypeVar

import msgspec

from mqgate.analytics.reports import iso
from mqgate.queuestate.diagnosis import CONSUMER_SIDE, QUEUE_SIDE, Finding, Thresholds, diagnose
from mqgate.queuestate.rows import ConsumerInterval, ProduceInterval, ProjectWindow, QueueInterval

HEALTHY: Final = "healthy"
NO_DATA: Final = "no_data"
QUEUE_FAULT: Final = "queue_fault"
CONSUMER_FAULT: Final = "consumer_fault"
BOTH: Final = "queue_and_consumer_fault"
STATES: Final = (HEALTHY, QUEUE_FAULT, CONSUMER_FAULT, BOTH, NO_DATA)
TOTAL_NAMES: Final = {
    HEALTHY: "healthy",
    QUEUE_FAULT: "queueFault",
    CONSUMER_FAULT: "consumerFault",
    BOTH: "queueAndConsumerFault",
    NO_DATA: "noData",
}

_R = TypeVar("_R", QueueInterval, ConsumerInterval, ProduceInterval)
# A finding's place: rule, side, topic, queue, consumer.
FindingKey = tuple[str, str, str, int | None, str | None]
# Consumer rules whose `since` says little about when the fault began: too slow's run of
# non-falling backlog reaches back over a flat one (0, 0, 16 is growth from the first 0).
JUDGED_ONLY: Final = frozenset({"consumers_too_slow"})
_KEY_NAMES: Final = ("rule", "side", "topic", "queue", "consumer")
# A timeline lane: the queue side of a topic (consumer None) or a consumer group on a topic.
Lane = tuple[str, str, str | None]


def state_of(sides: set[str]) -> str:
    if sides == {QUEUE_SIDE}:
        return QUEUE_FAULT
    if sides == {CONSUMER_SIDE}:
        return CONSUMER_FAULT
    return BOTH if sides else HEALTHY


def interval_ms_of(window: ProjectWindow) -> int | None:
    """The interval length of the history's rows (the most common one, should the gateway's
    setting have changed within the window)."""
    lengths: Counter[int] = Counter()
    for rows in (window.queues, window.consumers, window.produce):
        lengths.update(r.interval_ms for r in rows)
    return lengths.most_common(1)[0][0] if lengths else None


def _key(f: Finding) -> FindingKey:
    return (f.rule, f.side, f.topic, f.queue, f.consumer)


def _lane(f: Finding) -> Lane:
    return (f.side, f.topic, f.consumer if f.side == CONSUMER_SIDE else None)


def lane_label(lane: Lane) -> str:
    side, topic, consumer = lane
    return f"queues of {topic}" if side == QUEUE_SIDE else f"{consumer} on {topic}"


class _Rows(Generic[_R]):
    """One kind of row sorted by interval start, sliced by [since, until) with bisect."""

    def __init__(self, rows: Sequence[_R]) -> None:
        self.rows: list[_R] = sorted(rows, key=lambda r: r.start_ms)
        self.starts: list[int] = [r.start_ms for r in self.rows]

    def between(self, since: int, until: int) -> list[_R]:
        lo = bisect.bisect_left(self.starts, since)
        return self.rows[lo : bisect.bisect_left(self.starts, until)]


def _ceil(ms: int, step: int) -> int:
    return -(-ms // step) * step


def timeline(window: ProjectWindow, from_ms: int | None, to_ms: int | None, t: Thresholds) -> dict[str, Any]:
    """Every interval starting in [from_ms, to_ms) judged (open ends: the rows' extent). The
    window's rows must reach `t.lookback_ms(interval)` before from_ms for the first intervals
    to be judged as the health answer would have."""
    step = interval_ms_of(window)
    project = window.project
    if step is None:
        return {"project": project, "intervalMs": None, "totals": _totals([]), "intervals": [], "lanes": [],
                "runs": []}  # fmt: skip
    queues, consumers, produce = _Rows(window.queues), _Rows(window.consumers), _Rows(window.produce)
    every = [*queues.starts, *consumers.starts, *produce.starts]
    first = _ceil(from_ms, step) if from_ms is not None else min(every)
    end = to_ms if to_ms is not None else max(every) + step
    starts = list(range(first, end, step))
    lookback = t.lookback_ms(step)
    per_interval = msgspec.structs.replace(t, error_window_ms=step, full_window_ms=step)

    present: dict[int, set[Lane]] = defaultdict(set)
    for q in queues.rows:
        present[q.start_ms].add((QUEUE_SIDE, q.topic, None))
    for p in produce.rows:
        present[p.start_ms].add((QUEUE_SIDE, p.topic, None))
    for c in consumers.rows:
        present[c.start_ms].add((CONSUMER_SIDE, c.topic, c.consumer))

    marks: dict[int, dict[FindingKey, Finding]] = defaultdict(dict)
    health: dict[int, str] = {}
    for s in starts:
        e = s + step
        since = e - lookback
        seen = ProjectWindow(
            project,
            since,
            e,
            queues.between(since, e),
            consumers.between(since, e),
            produce.between(since, e),
        )
        health[s] = diagnose(seen, e, t).verdict
        for f in diagnose(seen, e, per_interval).findings:
            begin = (
                s if f.side == QUEUE_SIDE or f.rule in JUDGED_ONLY else max(first, _ceil(f.since_ms, step))
            )
            for x in range(begin, e, step):
                marks[x].setdefault(_key(f), f)

    intervals: list[dict[str, Any]] = []
    for s in starts:
        found = marks.get(s, {})
        sides = {f.side for f in found.values()}
        state = state_of(sides) if sides or present.get(s) else NO_DATA
        intervals.append(
            {
                "t": s,
                "time": iso(s),
                "state": state,
                "health": health[s],
                "findings": [
                    {"rule": k[0], "side": k[1], "topic": k[2], "queue": k[3], "consumer": k[4]}
                    for k in sorted(found, key=_sort_key)
                ],
            }
        )
    return {
        "project": project,
        "intervalMs": step,
        "fromMs": first,
        "toMs": end,
        "totals": _totals([i["state"] for i in intervals]),
        "intervals": intervals,
        "lanes": _lanes(starts, step, marks, present),
        "runs": _runs(starts, step, marks),
    }


def _sort_key(k: FindingKey) -> tuple[str, str, str, int, str]:
    return (k[1], k[0], k[2], -1 if k[3] is None else k[3], k[4] or "")


def _totals(states: list[str]) -> dict[str, int]:
    counted = Counter(states)
    return {"intervals": len(states), **{TOTAL_NAMES[s]: counted.get(s, 0) for s in STATES}}


def _lanes(
    starts: list[int], step: int, marks: dict[int, dict[FindingKey, Finding]], present: dict[int, set[Lane]]
) -> list[dict[str, Any]]:
    """Each lane's states as runs of equal consecutive intervals (what the plot draws)."""
    lanes: set[Lane] = set()
    for found in marks.values():
        lanes |= {_lane(f) for f in found.values()}
    for seen in present.values():
        lanes |= seen
    out = []
    for lane in sorted(lanes, key=lambda x: (x[0] != QUEUE_SIDE, x[1], x[2] or "")):
        runs: list[dict[str, Any]] = []
        for s in starts:
            rules = sorted({f.rule for f in marks.get(s, {}).values() if _lane(f) == lane})
            if rules:
                state = QUEUE_FAULT if lane[0] == QUEUE_SIDE else CONSUMER_FAULT
            else:
                state = HEALTHY if lane in present.get(s, ()) else NO_DATA
            if runs and runs[-1]["state"] == state and runs[-1]["rules"] == rules and runs[-1]["toMs"] == s:
                runs[-1]["toMs"] = s + step
            else:
                runs.append({"fromMs": s, "toMs": s + step, "state": state, "rules": rules})
        faults = sum((r["toMs"] - r["fromMs"]) // step for r in runs if r["rules"])
        out.append(
            {"side": lane[0], "topic": lane[1], "consumer": lane[2], "label": lane_label(lane),
             "faultIntervals": faults, "states": runs}
        )  # fmt: skip
    return out


def _runs(starts: list[int], step: int, marks: dict[int, dict[FindingKey, Finding]]) -> list[dict[str, Any]]:
    """Each finding's runs of consecutive intervals: where and when, and the first summary."""
    open_runs: dict[FindingKey, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for s in starts:
        found = marks.get(s, {})
        for key in [k for k in open_runs if k not in found]:
            done.append(open_runs.pop(key))
        for key, f in found.items():
            run = open_runs.get(key)
            if run is None:
                open_runs[key] = {
                    "rule": key[0], "side": key[1], "topic": key[2], "queue": key[3], "consumer": key[4],
                    "fromMs": s, "toMs": s + step, "intervals": 1, "summary": f.summary,
                }  # fmt: skip
            else:
                run["toMs"] = s + step
                run["intervals"] += 1
    done += open_runs.values()
    for run in done:
        run["from"], run["to"] = iso(run["fromMs"]), iso(run["toMs"])
    done.sort(key=lambda r: (r["fromMs"], _sort_key(tuple(r[k] for k in _KEY_NAMES))))
    return done


def thresholds_json(t: Thresholds) -> dict[str, Any]:
    out = msgspec.structs.asdict(t)
    out["store_error_types"] = sorted(t.store_error_types)
    return out


def _fetch(source: Any, project: str, from_ms: int | None, to_ms: int | None, t: Thresholds) -> ProjectWindow:
    """The project's rows from the lookback before from_ms (judging the first intervals needs
    them) to to_ms. The interval length is known once rows are read: read again further back
    when it is longer than the gateway's default the first read assumed."""
    assumed = 60_000
    since = None if from_ms is None else from_ms - t.lookback_ms(assumed)
    window: ProjectWindow = source.window(project, since, to_ms)
    step = interval_ms_of(window)
    if from_ms is not None and step is not None and t.lookback_ms(step) > t.lookback_ms(assumed):
        window = source.window(project, from_ms - t.lookback_ms(step), to_ms)
    return window


def section(
    source: Any, project: str | None, from_ms: int | None, to_ms: int | None, t: Thresholds
) -> dict[str, Any]:
    """The report's queue fault section: each project's timeline (one project, or every
    project the history has rows of) and where it was read from."""
    out: dict[str, Any] = {
        "source": source.describe(),
        "complete": source.complete,
        "thresholds": thresholds_json(t),
        "notes": [],
        "projects": {},
    }
    if not source.complete:
        out["notes"].append(
            "Read through the gateway's API, which gives queue intervals only: consumer faults and "
            "store faults are not judged (no consumer or produce intervals); --queue-state-url reads "
            "the history itself."
        )
    names = [project] if project is not None else source.projects()
    for name in names:
        tl = timeline(_fetch(source, name, from_ms, to_ms, t), from_ms, to_ms, t)
        if tl["intervalMs"] is None:
            if project is not None:
                out["notes"].append(f"No queue state recorded for project {name} in this window.")
            continue
        out["projects"][name] = tl
    return out
