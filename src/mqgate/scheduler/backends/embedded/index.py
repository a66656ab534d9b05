"""The in-memory due index: which held destinations wait, which are due, which are claimed.

Three heaps of packed ints (an int compares faster and weighs less than a tuple):
- waiting: (start << 79 | member), every destination until its start has come;
- ready: `delivery_rank` (priority, start, seq, index), the due and unclaimed ones;
- claim expiries: (claim deadline << 79 | member).
`member` is (seq << 16 | index). Entries are never removed in place: a settled or
claimed destination leaves stale entries that are checked against the held messages and the
claims when they reach the top, and dropped there (or by `prune` once they pile up).
"""

from __future__ import annotations

import heapq
from typing import Final

from mqgate.core.scheduling import INDEX_BITS, MAX_TIME_MS, SEQ_BITS, delivery_rank
from mqgate.scheduler.backends.embedded.log import Add
from mqgate.scheduler.interface import Destination

MEMBER_BITS: Final = SEQ_BITS + INDEX_BITS
_MEMBER_MASK: Final = (1 << MEMBER_BITS) - 1
_INDEX_MASK: Final = (1 << INDEX_BITS) - 1
# Rebuild a heap when it holds this many more entries than there are live destinations.
_PRUNE_SLACK: Final = 10_000


class DueIndex:
    def __init__(self, held: dict[int, Add]) -> None:
        self._held = held  # shared with the scheduler, which owns it
        self._waiting: list[int] = []
        self._ready: list[int] = []
        self._expiries: list[int] = []
        self.claims: dict[int, int] = {}  # member -> claim deadline
        self._attempts: dict[int, int] = {}  # member -> claims so far (memory only)

    def load(self) -> int:
        """Index every destination of the held messages (after recovery); return how many."""
        keys: list[int] = []
        append = keys.append
        for seq, rec in self._held.items():
            base = seq << INDEX_BITS
            for i, d in enumerate(rec.dests):
                if d is not None:
                    append(d.deliver_at_ms << MEMBER_BITS | base | i)
        heapq.heapify(keys)
        self._waiting = keys
        self._ready = []
        self._expiries = []
        self.claims.clear()
        self._attempts.clear()
        return len(keys)

    def add(self, seq: int, dests: tuple[Destination | None, ...]) -> None:
        for i, d in enumerate(dests):
            if d is not None:
                heapq.heappush(self._waiting, d.deliver_at_ms << MEMBER_BITS | seq << INDEX_BITS | i)

    def forget(self, seq: int, index: int) -> None:
        member = seq << INDEX_BITS | index
        self.claims.pop(member, None)
        self._attempts.pop(member, None)

    def _live(self, member: int, deliver_at_ms: int) -> Destination | None:
        """The destination if it is still held, unclaimed and starts at `deliver_at_ms`."""
        if member in self.claims:
            return None
        rec = self._held.get(member >> INDEX_BITS)
        if rec is None:
            return None
        index = member & _INDEX_MASK
        d = rec.dests[index] if index < len(rec.dests) else None
        return d if d is not None and d.deliver_at_ms == deliver_at_ms else None

    def promote(self, now_ms: int, budget: int) -> bool:
        """Move what has come due, and whatever claims expired, to the ready heap: at most
        `budget` entries of each heap. True if that left some behind (call again)."""
        waiting, ready, push, pop = self._waiting, self._ready, heapq.heappush, heapq.heappop
        horizon = (now_ms + 1) << MEMBER_BITS
        moved = 0
        while waiting and waiting[0] < horizon and moved < budget:
            key = pop(waiting)
            moved += 1
            member = key & _MEMBER_MASK
            at = key >> MEMBER_BITS
            d = self._live(member, at)
            if d is not None:
                push(ready, delivery_rank(d.priority, at, member >> INDEX_BITS, member & _INDEX_MASK))
        more = moved == budget
        expiries = self._expiries
        moved = 0
        while expiries and expiries[0] < horizon and moved < budget:
            key = pop(expiries)
            moved += 1
            member = key & _MEMBER_MASK
            if self.claims.get(member) != key >> MEMBER_BITS:
                continue  # settled or claimed again since
            del self.claims[member]
            rec = self._held.get(member >> INDEX_BITS)
            d = rec.dests[member & _INDEX_MASK] if rec is not None else None
            if d is not None:
                push(
                    ready,
                    delivery_rank(d.priority, d.deliver_at_ms, member >> INDEX_BITS, member & _INDEX_MASK),
                )
        return more or moved == budget

    def take(self, limit: int, claim_until_ms: int) -> list[tuple[Add, int, Destination, int]]:
        """Claim up to `limit` ready destinations, best first: (message, index, dest, attempt)."""
        ready, pop = self._ready, heapq.heappop
        taken: list[tuple[Add, int, Destination, int]] = []
        while ready and len(taken) < limit:
            rank = pop(ready)
            member = rank & _MEMBER_MASK
            d = self._live(member, (rank >> MEMBER_BITS) & MAX_TIME_MS)
            if d is None:
                continue
            self.claims[member] = claim_until_ms
            heapq.heappush(self._expiries, claim_until_ms << MEMBER_BITS | member)
            attempt = self._attempts.get(member, 0) + 1
            self._attempts[member] = attempt
            taken.append((self._held[member >> INDEX_BITS], member & _INDEX_MASK, d, attempt))
        return taken

    def next_due_ms(self) -> int | None:
        ready, waiting, expiries, pop = self._ready, self._waiting, self._expiries, heapq.heappop
        while ready and self._live(ready[0] & _MEMBER_MASK, (ready[0] >> MEMBER_BITS) & MAX_TIME_MS) is None:
            pop(ready)
        if ready:
            return (ready[0] >> MEMBER_BITS) & MAX_TIME_MS  # due already: nothing is sooner
        while waiting and self._live(waiting[0] & _MEMBER_MASK, waiting[0] >> MEMBER_BITS) is None:
            pop(waiting)
        while expiries and self.claims.get(expiries[0] & _MEMBER_MASK) != expiries[0] >> MEMBER_BITS:
            pop(expiries)
        times = [heap[0] >> MEMBER_BITS for heap in (waiting, expiries) if heap]
        return min(times) if times else None

    def prune(self, live_destinations: int) -> None:
        """Drop stale entries once they outnumber the live destinations (settled long before
        their start, say), so memory follows the live set."""
        limit = 2 * live_destinations + _PRUNE_SLACK
        if len(self._waiting) > limit:
            self._waiting = [k for k in self._waiting if self._live(k & _MEMBER_MASK, k >> MEMBER_BITS)]
            heapq.heapify(self._waiting)
        if len(self._ready) > limit:
            self._ready = [
                k for k in self._ready if self._live(k & _MEMBER_MASK, (k >> MEMBER_BITS) & MAX_TIME_MS)
            ]
            heapq.heapify(self._ready)
        if len(self._expiries) > limit:
            claims = self.claims
            self._expiries = [k for k in self._expiries if claims.get(k & _MEMBER_MASK) == k >> MEMBER_BITS]
            heapq.heapify(self._expiries)
