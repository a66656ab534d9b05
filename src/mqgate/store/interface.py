"""The message-store contract every backend implements."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from mqgate.errors import MqgateError
from mqgate.model import QueueBounds, StoredMessage
from mqgate.store.waiters import ANY_READER, Reader

log = logging.getLogger(__name__)

# A message already encoded as its stored JSON object (see `StoredMessage`), with its timestamp.
Encoded = tuple[int, bytes]


class CompanionGroup(Protocol):
    """Companion records that several appends share until the store writes them: the caller
    adds to the group until `seal` is called, which gives its records, once (later calls give
    none); once the store tried to write them, `written` tells the group how that went, once.
    A backend that writes companions at once seals the group at once."""

    def seal(self) -> list[Encoded]: ...

    def written(self, error: MqgateError | None) -> None:
        """The sealed records are stored (None), or the store refused them (its error): the
        group, not each append that joined it, answers for them (counts, retries)."""


# Records that go with an append, by topic and queue (e.g. its trace record).
Companions = dict[str, dict[int, list[Encoded | CompanionGroup]]]
# Told the topic whose bounds may have moved (None: any topic may have): see `MessageStore.watch`.
TopicListener = Callable[[str | None], None]


def sealed(
    queues: dict[int, list[Encoded | CompanionGroup]],
) -> tuple[dict[int, list[Encoded]], list[CompanionGroup]]:
    """One topic's companions as records to write by queue (each group sealed; a group listed
    twice gives its records once), and the groups, each once, to tell `written`."""
    ready: dict[int, list[Encoded]] = {}
    groups: dict[int, CompanionGroup] = {}
    for queue, items in queues.items():
        out: list[Encoded] = []
        for item in items:
            if isinstance(item, tuple):
                out.append(item)
            else:
                out += item.seal()
                groups[id(item)] = item
        if out:
            ready[queue] = out
    return ready, list(groups.values())


async def write_companions(
    records: Companions, append: Callable[[str, dict[int, list[Encoded]]], Awaitable[object]]
) -> MqgateError | None:
    """For a backend that writes an append's companions at once, after its messages: one
    `append` per topic, each topic's groups told its outcome; the first error is returned."""
    failed: MqgateError | None = None
    for topic, queues in records.items():
        ready, groups = sealed(queues)
        error: MqgateError | None = None
        if ready:
            try:
                await append(topic, ready)
            except MqgateError as exc:
                error = exc
                failed = failed or exc
        tell(groups, error)
    return failed


def tell(groups: list[CompanionGroup], error: MqgateError | None) -> None:
    """Each group's outcome; a group that fails to take it is logged, and neither the write
    (the group commit's round, or the append whose messages are stored) nor the other groups
    fail with it."""
    for group in groups:
        try:
            group.written(error)
        except Exception:
            log.exception("a companion group failed to take the outcome of its write")


class TopicConfig(msgspec.Struct, frozen=True):
    name: str
    queues: int
    retention_ms: int
    retention_bytes: int | None = None  # per queue; None = unlimited


class MessageStore(Protocol):
    """A set of topics, each with a fixed number of append-only queues.

    Offsets are integers from 0 per queue. `max` is the next offset to be written and only
    messages below it are visible; `min` is the oldest offset still retained.
    """

    @property
    def broker(self) -> str:
        """The broker name in ack tokens and receipts."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create_topic(self, config: TopicConfig) -> None:
        """Create the topic, or update its retention if it exists with the same queue count,
        or grow it to more queues (new queues start empty at offset 0). Asking for fewer
        queues than it has raises BadRequest(field="queues"). Safe to call from several
        gateways at once."""

    async def delete_topic(self, topic: str) -> None:
        """Remove the topic and every message in it, for good; long polls on it are woken. A
        topic that does not exist is not an error (a retried delete)."""

    def forget_topic(self, topic: str) -> None:
        """Another gateway deleted `topic`: drop what this one knows of it (caches, waiters)."""

    def has_topic(self, topic: str) -> bool:
        """Whether this store knows the topic; False may only mean "not seen here yet" (a
        shared store), and the caller then calls `create_topic`."""

    async def append(self, topic: str, queue: int, messages: list[StoredMessage]) -> int:
        """Append and return the first offset once the messages are durable per fsync mode."""

    async def append_many(self, topic: str, batches: dict[int, list[StoredMessage]]) -> dict[int, int]:
        """Append to several queues of one topic, sharing one durability wait."""

    async def append_encoded(self, topic: str, batches: dict[int, list[Encoded]]) -> dict[int, int]:
        """`append_many` for messages that are already encoded (e.g. held by the scheduler)."""

    async def append_many_with(
        self,
        topic: str,
        batches: dict[int, list[StoredMessage]],
        companions: Callable[[dict[int, int]], Companions],
    ) -> tuple[dict[int, int], MqgateError | None]:
        """`append_many`, then the records `companions(first offsets)` names, durable together
        in one wait where the backend can share it (the embedded store's group commit). The
        messages come first and decide the outcome: a companion that cannot be written fails
        nothing; its error is returned with the offsets. The companions' topics must exist."""

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]:
        """Visible messages from `offset` (raised to `min` if below it), at most `max_count`."""

    async def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        """Like `read`, but each message as its stored JSON object (see `StoredMessage`)."""

    async def bounds(self, topic: str) -> list[QueueBounds]: ...

    async def bounds_many(self, topics: list[str]) -> list[list[QueueBounds]]:
        """`bounds` of each topic, in order: a pull reads its topic's, retry queue's and inbox's.
        The embedded store answers from memory, the store process's adapter in one round trip,
        Redis concurrently; the first topic's error is raised."""

    async def queue_bytes(self, topic: str) -> list[int]:
        """The bytes each of `topic`'s queues holds, in queue order (as `bounds`): the measure
        its `retention_bytes` limits. The embedded store counts its queue's log segments (each
        record with its framing), from what it keeps in memory: no I/O. Redis counts the stored
        JSON of each message still in the queue's stream (the `bytes:<q>` counters of the
        topic's meta hash: one round trip for every queue), not Redis's own memory for the
        stream. For pages and reports only, never on the data path: unknown topic, NotFound."""

    async def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        """The first offset whose message is at or after `timestamp_ms` (or `max`)."""

    async def wait_for_data(
        self, topic: str, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        """Return when a write to `topic` becomes visible, or after `timeout_s`, or when woken.

        Waiters queue per `reader` (consumer, client id), longest waiting first. A write to
        `n` queues wakes at most `n` waiters of each reader (one pull of a reader leases one
        queue), not every waiter; waiters that name no reader are woken by every write. With
        `recheck_s`, the longest waiting waiter of `reader` is also woken every `recheck_s`
        (one per reader, not each waiter), to notice what announces itself to no one."""

    def wake(self, topic: str, *, consumer: str | None = None, count: int | None = None) -> None:
        """Wake long polls on `topic` now: every one, or only `consumer`'s, and of each reader
        at most `count` (a freed lock has work for one pull); here and, for a shared store,
        on the other gateways."""

    def wake_all(self) -> None:
        """Wake every long poll of this gateway on every topic (shutdown)."""

    def watch(self, listener: TopicListener) -> None:
        """From now on call `listener(topic)` whenever this gateway moved `topic`'s bounds
        through this store (a write became visible or was taken back, retention dropped
        messages, the topic was made, grown or deleted), at once, within the call that moved
        them; `listener(None)`: any topic may have moved. A listener must be quick and must not
        raise. Whether that is every move: `hears_every_change`."""

    @property
    def hears_every_change(self) -> bool:
        """Whether `watch` listeners hear every move of every topic now: a store one process
        owns (embedded) does; one other gateways write to (Redis) does not, and its readers
        must look for themselves."""

    async def enforce_retention(self, now_ms: int) -> int:
        """Drop messages past their topic's retention; return how much went, for the log
        (segments for the embedded store, messages for Redis)."""
