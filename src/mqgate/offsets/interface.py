"""The consumer-group table (SPEC G7) and its contract.

One table per consumer group in cluster mode, and per group + clientId in broadcast mode
(`client_id` is "" in cluster mode). It holds one entry per queue of the group's topic; the
queue's min and max come from the message store and are passed in where needed.
Every method is atomic with respect to every other caller, in any number of gateways.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from mqgate.core.acks import AckRefusal
from mqgate.core.layout import Layout
from mqgate.core.message_window import MessageOutcome, Received, Window
from mqgate.core.tokens import AckToken
from mqgate.model import QueueBounds

# Told the group whose tables moved (None: any group's may have): see `OffsetStore.watch`.
GroupListener = Callable[[str | None], None]


class OffsetEntry(msgspec.Struct):
    committed: int
    lock_ts: int = 0
    lock_deadline_ms: int = 0
    lock_owner: str = ""
    last_access_ms: int = 0
    attempts: int = 0  # deliveries of the batch that starts at `committed`
    delivered_end: int = 0  # next offset of the last delivery from `committed`
    dead_lettered: int = 0  # messages moved to the dead-letter topic, in total
    # The lock ts of the last commit, so a retried ack is answered `already_acked`. Embedded:
    # in memory only (after a restart such a retry answers `offset_moved`, as before).
    acked_lock_ts: int = 0
    # The lock ts of the first delivery of the batch at `committed`: kept by its redeliveries,
    # so it names that batch's round of deliveries (`Lease.first_lock_ts`). In memory only in
    # the embedded store, as `attempts`.
    first_lock_ts: int = 0
    # A message-level consumer's receipts on this queue (core/message_window.py); None until
    # its first receive, and after a reset.
    window: Window | None = None


class Lease(msgspec.Struct, frozen=True):
    """A queue locked for one pull: deliver `[offset, next_offset)`."""

    queue: int
    offset: int
    next_offset: int
    lock_ts: int
    attempts: int
    # True when the batch at `offset` has used up its attempts: the caller moves
    # `[offset, next_offset)` to the dead-letter topic and then commits with `ack`.
    dead_letter: bool = False
    # The batch's stored records (`MessageStore.read_raw` of its queue from `offset`), when the
    # backend read them with the lease (`read_from`); None: the caller reads them.
    records: list[tuple[int, bytes]] | None = None
    # The lock ts of the batch's first delivery: the same on every redelivery of the batch, and
    # on no other batch (lock ts only grow), so it names one batch's round of deliveries; what
    # a redelivery writes elsewhere is keyed by it (the retry holds: services/redelivery.py).
    first_lock_ts: int = 0


class AckedLease(msgspec.Struct, frozen=True):
    """`OffsetStore.ack_and_lease`'s answer: the ack's refusal (None: acked) and the lease (None:
    no queue free), or what kept the lease from being taken after the ack was done."""

    refusal: AckRefusal | None
    lease: Lease | None
    lease_error: Exception | None = None


async def ack_then_lease(
    offsets: OffsetStore,
    token: AckToken,
    group: str,
    client_id: str,
    bounds: list[QueueBounds] | None,
    **lease: Any,
) -> AckedLease:
    """`ack_and_lease` as two calls: the ack, then the lease (`lease`: its keyword arguments)."""
    refusal = await offsets.ack(token, lease["now_ms"])
    try:
        got = await offsets.lease(group, client_id, bounds, **lease)
    except Exception as exc:  # the ack is done: it is answered, with what kept the lease
        return AckedLease(refusal, None, exc)
    return AckedLease(refusal, got)


def given_bounds(bounds: list[QueueBounds] | None) -> list[QueueBounds]:
    """`lease`'s bounds in a backend that takes them from its caller (`reads_bounds` False)."""
    if bounds is None:
        raise ValueError("this offset store takes the queues' bounds from its caller (reads_bounds is False)")
    return bounds


class OffsetStore(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def ensure_table(self, group: str, client_id: str, starts: list[int], now_ms: int) -> bool:
        """Create the table with these committed offsets if absent; True if it was created.

        A table with fewer entries than `starts` grows: the missing queues get their start
        offsets (a topic's queue layout only ever grows, by new priority lanes or sources).
        """

    async def table(self, group: str, client_id: str) -> list[OffsetEntry] | None: ...

    async def clients(self, group: str) -> list[str]:
        """The clientIds with a table in this group ("" for the cluster table)."""

    async def lease(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        *,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
        read_from: Layout | None = None,
    ) -> Lease | None:
        """Choose a queue (SPEC G4), lock it and record the delivery; None if none is free.

        A batch that was delivered and not acked (lock expired or released) is delivered again
        as the same range, cut to `max_count`; `Lease.attempts` counts its deliveries.
        `read_from` (the table's layout): a backend that has the message store at hand (the
        store process's, `serve --workers N`) may read a first delivery's records with the
        lease, into `Lease.records`, saving the caller a round trip; others ignore it.
        `bounds` None (only where `reads_bounds`, with `read_from`): the backend takes the
        layout's queue bounds from that store itself, in the same call.
        """

    async def ack_and_lease(
        self,
        token: AckToken,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        *,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
        read_from: Layout | None = None,
    ) -> AckedLease:
        """`ack(token, now_ms)`, then `lease(...)` whatever the ack answered: a pull that carries
        its previous batch's ack. One round trip where the backend can (Redis, the store
        process: the token's table is the lease's). An error of the ack is raised (nothing was
        done); one of the lease, after the ack, comes in `AckedLease.lease_error`."""

    async def ack(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        """Commit `token.next_offset` and unlock, if the token still holds the lock."""

    async def release(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        """Unlock without commit, so the batch is delivered again at once."""

    async def extend(self, token: AckToken, now_ms: int, seconds: float) -> AckRefusal | None:
        """Move the lock's deadline to now + seconds."""

    async def record_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        """Like `ack`, and count `count` messages as dead-lettered."""

    async def add_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        """Count `count` messages as dead-lettered while the token's lock is held, without
        committing (part of a batch that is delivered otherwise)."""

    async def receive(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds],
        *,
        now_ms: int,
        max_count: int,
        visibility_ms: int,
        max_attempts: int,
        window: int,
        first_queue: int,
        ordered: bool = False,
    ) -> list[Received]:
        """Message-level mode: up to `max_count` messages from the queues, from `first_queue`
        on (the caller rotates it), each hidden for `visibility_ms` (core/message_window.py);
        journaled before it returns. A message received `max_attempts` times comes back with
        `dead_letter`: the caller moves it to the dead-letter topic and deletes it. `ordered`:
        each queue in order, one batch at a time (`receive_ordered`)."""

    async def delete_message(
        self,
        group: str,
        client_id: str,
        queue: int,
        offset: int,
        receives: int,
        first_ms: int,
        now_ms: int,
        *,
        dead_letter: bool = False,
    ) -> MessageOutcome:
        """Delete one received message by its receipt (counted as a dead letter if so)."""

    async def change_visibility(
        self,
        group: str,
        client_id: str,
        queue: int,
        offset: int,
        receives: int,
        first_ms: int,
        now_ms: int,
        visible_ms: int,
    ) -> MessageOutcome:
        """Hide a received message until `visible_ms` (`now_ms`: visible at once)."""

    async def receipt_counts(self, group: str, client_id: str, now_ms: int) -> dict[int, tuple[int, int]]:
        """A message-level consumer's receipts, by queue that has any: (messages received and
        still hidden at `now_ms`, messages deleted past the committed offset). SQS's
        ApproximateNumberOfMessagesNotVisible, and what its visible count leaves out."""

    async def reset(self, group: str, client_id: str, queue: int, offset: int) -> None:
        """Set the committed offset, drop any lock, the attempt count and the queue's message
        receipts (message mode)."""

    async def advance(
        self, group: str, client_id: str, offsets: dict[int, int], now_ms: int
    ) -> dict[int, int]:
        """Raise each named queue's committed offset to at least the given one (never lower it)
        and return the committed offsets after the step; idempotent, so a replayed commit is
        harmless. A raised queue loses its attempt count; a lock it holds stays (its ack is then
        refused as stale). For readers that track their own position, e.g. a Spark job."""

    async def expire_clients(self, group: str, idle_before_ms: int) -> list[str]:
        """Remove broadcast clientIds not seen since `idle_before_ms`; return them."""

    async def drop_group(self, group: str) -> None:
        """Delete every table of the group (cluster and broadcast clients) and its rate bucket
        (the consumer was deleted)."""

    async def take_tokens(self, group: str, rate_per_s: float, wanted: int, now_ms: int) -> tuple[int, float]:
        """Take up to `wanted` from the group's token bucket, shared by every gateway.

        The bucket holds at most max(rate_per_s, 1) tokens and refills at `rate_per_s`.
        Returns (granted, retry_after_s); retry_after_s > 0 only when nothing was granted.
        """

    async def return_tokens(self, group: str, rate_per_s: float, count: int) -> None:
        """Give back tokens a pull took but did not use (capped at the bucket size)."""

    def watch(self, listener: GroupListener) -> None:
        """From now on call `listener(group)` whenever this gateway moved a committed offset of
        `group` or made, grew or removed one of its tables (what a consumer's lag reads), at
        once, within the call that moved it; `listener(None)`: any group's may have moved. A
        listener must be quick and must not raise. Whether that is every move:
        `hears_every_change`."""

    @property
    def reads_bounds(self) -> bool:
        """Whether `lease(bounds=None, read_from=layout)` takes the layout's queue bounds from
        the message store itself: a backend beside the store in another process (the store
        process's) does, saving a pull the round trip for them; the others do not."""

    @property
    def hears_every_change(self) -> bool:
        """Whether `watch` listeners hear every such move now: a table one process owns
        (embedded) does; one other gateways change (Redis) does not."""
