"""Hot-key detection (SPEC E3): which keys of a batch leave the key-hash path.

With key-hash dispatch a key's events all land on one worker. A key that alone carries more
than one worker's fair share of the batch (1/N of it), or that took a large share of the
processing time in earlier batches, makes its worker the batch's critical path; its events
are moved to the hot topic, whose query spreads them over all workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

REASON_COUNT: Final = "count"
REASON_TIME: Final = "time"
# Times below this (seconds) are forgotten, so the table holds only keys that still matter.
_FORGET_S: Final = 1e-4


@dataclass(slots=True, frozen=True)
class HotKey:
    key: str
    events: int
    reason: str


@dataclass(slots=True, frozen=True)
class HotKeyRule:
    min_count: int
    # Share of the batch's events at which a key is hot (e.g. 1/N).
    min_share: float
    max_keys: int
    # Share of the measured processing time at which a key is hot; 0 turns the rule off.
    time_share: float


@dataclass(slots=True)
class KeyTimes:
    """Per-key processing time reported by the workers, decayed each batch so it follows
    the current load rather than all history."""

    decay: float = 0.5
    seconds: dict[str, float] = field(default_factory=dict)

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
    counts: Mapping[str, int], total: int, time_shares: Mapping[str, float], rule: HotKeyRule
) -> list[HotKey]:
    """The hot keys of one batch, most events first, at most `rule.max_keys`.

    `counts` are the batch's events per key (keys below `min_count` may be left out),
    `total` all events of the batch, `time_shares` each key's share of earlier processing
    time (KeyTimes.shares()).
    """
    if total <= 0 or rule.max_keys <= 0:
        return []
    found: list[HotKey] = []
    for key, n in counts.items():
        if n < rule.min_count:
            continue
        if n / total >= rule.min_share:
            found.append(HotKey(key, n, REASON_COUNT))
        elif rule.time_share > 0 and time_shares.get(key, 0.0) >= rule.time_share:
            found.append(HotKey(key, n, REASON_TIME))
    found.sort(key=lambda h: (-h.events, h.key))
    return found[: rule.max_keys]
