"""The scheduler (SPEC S1–S6): messages held until their destinations are due, and its contract.

A held message is a payload plus one or more destinations, each with its own window and
priority. The gateway's delivery loop claims due destinations, appends each to the queue its
`target` names (the target is opaque here) and settles it; a destination that could not be
delivered is left to its claim's expiry and claimed again then.
Every method is atomic with respect to every other caller, in any number of gateways sharing
a backend that is shared (Redis).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from mqgate.core.scheduling import MAX_DESTINATIONS, validate_priority, validate_window
from mqgate.errors import BadRequest


# gc=False: the embedded index holds millions of these and they cannot form cycles.
class Destination(msgspec.Struct, array_like=True, frozen=True, gc=False):
    target: str  # opaque to the scheduler (the gateway encodes topic / inbox / retry targets)
    deliver_at_ms: int
    deadline_ms: int  # 0 = no deadline
    priority: int  # 0..9, higher first


class Due(msgspec.Struct, frozen=True):
    """One destination handed to the delivery loop."""

    seq: int
    index: int  # the destination's position in the message's list, stable for its lifetime
    payload: bytes
    destination: Destination
    expired: bool  # past its deadline: settle it without delivering (SPEC S3)
    attempt: int = 1  # how many times it has been claimed, this one included


class SchedulerStats(msgspec.Struct, frozen=True):
    held_messages: int
    held_destinations: int
    claimed: int
    log_records: int = 0  # 0 for a backend without a log (Redis)
    log_bytes: int = 0


class Scheduler(Protocol):
    async def open(self) -> None:
        """Be ready to serve: the embedded backend's crash recovery (SPEC S6) completes first."""

    async def close(self) -> None: ...

    async def hold(
        self, items: list[tuple[bytes, list[Destination]]], keys: list[str] | None = None
    ) -> list[int]:
        """Hold each (payload, destinations); return their sequence numbers (unique, increasing,
        never reused). Durable when it returns (per the group commit's fsync mode).

        `keys`, one per item ("" = none), make a hold that is tried again idempotent: an item
        whose key is kept is not held again, and gets the seq it got the first time. A key is
        kept until `forget` (or a day). Only the Redis backend keeps them: there a hold that
        answered an error may have been written (a replica wait that timed out) and a failover
        can bring one back; the embedded backends ignore them."""

    async def forget(self, keys: list[str]) -> None:
        """The holds under these keys will not be tried again: drop the keys."""

    async def claim_due(self, now_ms: int, limit: int, claim_ms: int) -> list[Due]:
        """Up to `limit` destinations whose start is at or before `now_ms`, expired ones
        included, highest priority first (then earliest start, lowest seq, lowest index).

        A claimed destination is not returned again until `now_ms + claim_ms` (the claimer may
        have died; then it is returned with `attempt` one higher) unless settled.
        """

    async def settle(self, done: list[tuple[int, int]]) -> None:
        """Remove these (seq, index) destinations: delivered or expired. A message with
        destinations left is rewritten with the rest, one with none left is deleted (SPEC S5).
        Unknown or already settled pairs are ignored. Durable when it returns."""

    async def next_due_ms(self) -> int | None:
        """When `claim_due` will next have something: the earliest start among unclaimed
        destinations (in the past when some are due already) or the earliest claim expiry,
        whichever comes first; None when nothing is held."""

    async def wait(self, timeout_s: float) -> None:
        """Sleep up to `timeout_s`; return early when a hold makes a destination
        due before what `next_due_ms` last said (in any gateway, for a shared backend)."""

    async def held_for(self, target: str) -> int:
        """Destinations held for `target` and not delivered yet (SQS's
        ApproximateNumberOfMessagesDelayed)."""

    async def stats(self) -> SchedulerStats: ...


def check_destinations(dests: list[Destination]) -> None:
    """Refuse what the scheduler cannot order (the gateway validates requests before this)."""
    if not 1 <= len(dests) <= MAX_DESTINATIONS:
        raise BadRequest(f"a message needs 1..{MAX_DESTINATIONS} destinations", field="destinations")
    for d in dests:
        if not isinstance(d, Destination) or not isinstance(d.target, str):
            raise TypeError(f"not a Destination with a str target: {d!r}")
        validate_priority(d.priority)
        validate_window(d.deliver_at_ms, d.deadline_ms, 0)
