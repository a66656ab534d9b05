"""Hot-key detection (SPEC E3): which events of a batch leave the key-hash path.

With key-hash dispatch all events of a key land on one worker, and a batch takes as long as
its busiest worker. The Spark task that runs a worker queue holds all of its events, so it
knows each of its workers' load; with the batch's total it knows the fair share (events / N).
Where a worker's load passes `load_limit` times the fair share (events / N), its biggest keys
are hot and just enough of their events move to the hot topic to bring the worker back to
the limit (SPEC E3: "may move only part of the hot events depending on load"); the hot query
spreads them over all N workers. A key that took `time_share` of the processing time measured
in earlier batches is hot as well, with all its events: its events are slow, which the counts
do not show.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from mqgate.pipeline.dispatch import stable_hash
from mqgate.pipeline.parsing import Event

# Which of a hot key's events move is decided by a hash of the event id, in 1/SCALE steps, so
# a replayed batch moves the same events.
SCALE: Final = 1 << 20
REASON_LOAD: Final = "load"
REASON_TIME: Final = "time"
# Times below this (seconds) are forgotten, so the table holds only keys that still matter.
_FORGET_S: Final = 1e-4


class HotKey(msgspec.Struct, frozen=True):
    key: str
    events: int  # the key's events in the batch
    moved: int  # how many of them take the hot path
    reason: str


class HotKeyRule(msgspec.Struct, frozen=True):
    partitions: int
    # A key is a candidate only with at least min_count events and min_share of the batch.
    min_count: int
    min_share: float
    max_keys: int
    # Share of the measured processing time at which a key is hot; 0 turns the rule off.
    time_share: float
    # A worker may carry this many times the fair share (events / N) before events move.
    load_limit: float = 1.1


class KeyTimes(msgspec.Struct):
    """Per-key processing time reported by the workers, decayed each batch so it follows
    the current load rather than all history."""

    decay: float = 0.5
    seconds: dict[str, float] = msgspec.field(default_factory=dict)

    def add(self, measured: Mapping[str, float]) -> None:
        kept = {k: v * self.decay for k, v in self.seconds.items() if v * self.decay >= _FORGET_S}
        for k, v in measured.items():
            kept[k] = kept.get(k, 0.0) + v
        self.seconds = kept

    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values())
        if total <= 0:
            return {}
        return {k: v / total for k, v in self.seconds.items()}


def hot_keys(
    counts: Mapping[str, int],
    total: int,
    time_shares: Mapping[str, float],
    rule: HotKeyRule,
    worker_of: Callable[[str, int], int],
) -> list[HotKey]:
    """The hot keys of one batch, most moved events first, at most `rule.max_keys`.

    `counts` are the batch's events per key, `total` all its events, `time_shares` each
    key's share of earlier processing time (KeyTimes.shares()), `worker_of` the dispatch.
    """
    if total <= 0 or rule.max_keys <= 0:
        return []
    min_events = max(rule.min_count, math.ceil(rule.min_share * total))
    found: list[HotKey] = []
    slow: set[str] = set()
    if rule.time_share > 0:
        for key, n in counts.items():
            if n >= min_events and time_shares.get(key, 0.0) >= rule.time_share:
                found.append(HotKey(key, n, n, REASON_TIME))
                slow.add(key)
    loads: dict[int, int] = defaultdict(int)
    candidates: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for key, n in counts.items():
        if key in slow:
            continue
        w = worker_of(key, rule.partitions)
        loads[w] += n
        if n >= min_events:
            candidates[w].append((n, key))
    limit = rule.load_limit * total / rule.partitions
    for w, load in loads.items():
        for n, key in sorted(candidates[w], key=lambda c: (-c[0], c[1])):
            if load <= limit:
                break
            moved = min(n, math.ceil(load - limit))
            found.append(HotKey(key, n, moved, REASON_LOAD))
            load -= moved
    found.sort(key=lambda h: (-h.moved, h.key))
    return found[: rule.max_keys]


def take_moved(queues: Mapping[int, list[Event]], hot: list[HotKey]) -> list[Event]:
    """Remove from the worker queues (in place) the events of the hot keys that move, about
    `moved` of each key's `events`, and return them."""
    thresholds = {h.key: SCALE if h.moved >= h.events else (h.moved * SCALE) // h.events for h in hot}
    if not thresholds:
        return []
    moved: list[Event] = []
    for queue in queues.values():
        kept: list[Event] = []
        for e in queue:
            threshold = thresholds.get(e.key)
            if threshold is not None and stable_hash(e.event_id) % SCALE < threshold:
                moved.append(e)
            else:
                kept.append(e)
        queue[:] = kept
    return moved
