"""SPEC G4: which queue a cluster-mode pull takes."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec


class QueueView(msgspec.Struct, frozen=True):
    queue: int
    min_offset: int
    max_offset: int
    committed: int
    lock_ts: int
    lock_deadline_ms: int
    last_access_ms: int
    lane: int = 0

    @property
    def backlog(self) -> int:
        return self.max_offset - max(self.committed, self.min_offset)


def lock_is_held(lock_ts: int, lock_deadline_ms: int, now_ms: int) -> bool:
    """A lock is held while set and not past its deadline; an expired lock may be reclaimed."""
    return lock_ts != 0 and lock_deadline_ms > now_ms


def choose_queue(queues: Iterable[QueueView], now_ms: int) -> QueueView | None:
    """Among unlocked queues with unconsumed messages, those of the highest priority lane;
    of these the one with the most unconsumed messages; ties go to the one consumed longest
    ago, then to the lowest queue id. None when nothing is available."""
    best: QueueView | None = None
    best_key: tuple[int, int, int, int] | None = None
    for q in queues:
        if q.backlog <= 0 or lock_is_held(q.lock_ts, q.lock_deadline_ms, now_ms):
            continue
        key = (-q.lane, -q.backlog, q.last_access_ms, q.queue)
        if best_key is None or key < best_key:
            best, best_key = q, key
    return best


def next_lock_ts(previous_lock_ts: int, now_ms: int) -> int:
    """Lock timestamps identify a lock, so a new one must differ from the one it replaces."""
    return now_ms if now_ms > previous_lock_ts else previous_lock_ts + 1
