"""FIFO queues (issue 30): message groups kept in order, deduplication for five minutes, and the
sequence numbers SQS answers.

A FIFO queue's messages are produced with their MessageGroupId as the order key, so a group
lives in one store queue, in order; its consumer receives `ordered` (core/message_window.py's
`receive_ordered`): a store queue with a message in flight hands out nothing more, so a group
never has two batches in flight and comes back in order after a visibility timeout. Groups that
share a store queue wait for each other: a FIFO queue runs up to `QUEUES` groups at once.

Deduplication remembers, per queue, each deduplication id (or body hash) of the last five
minutes with what its first send was answered (message id, sequence number), and answers a
repeat with that instead of storing it again. The log is the record: each message carries its
id (`sqs.dedup`), and a gateway reads the last five minutes of a queue's log the first time it
sends to it (after a restart: nothing acknowledged is forgotten) and, before each send, what
other gateways appended since. Sends of one queue take turns on a gateway; two gateways taking
the same id at the same instant both store it (the window between a read and an append).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from typing import Final, Protocol

import msgspec

from mqgate.model import QueueBounds, StoredMessage

DEDUP_WINDOW_MS: Final = 5 * 60 * 1000
PROPERTY_GROUP: Final = "sqs.group"
PROPERTY_DEDUP: Final = "sqs.dedup"
SCOPE_QUEUE: Final = "queue"
SCOPE_GROUP: Final = "messageGroup"
READ_CHUNK: Final = 500
_SEQUENCE_QUEUES: Final = 256  # a sequence number is offset × this + store queue


class LogReader(Protocol):
    """What deduplication reads of a queue's log (the store's reads)."""

    async def bounds(self, topic: str) -> list[QueueBounds]: ...

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]: ...

    async def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int: ...


def sequence_number(queue: int | None, offset: int | None) -> str:
    """Increasing within a message group (its store queue's offsets increase), unique in the
    queue."""
    if queue is None or offset is None:
        return "0"  # not stored yet (spooled while the clusters are away)
    return str(offset * _SEQUENCE_QUEUES + queue)


def content_id(body: str) -> str:
    """ContentBasedDeduplication's id: the body's SHA-256, as SQS computes it."""
    return hashlib.sha256(body.encode()).hexdigest()


def dedup_key(scope: str, group: str, dedup_id: str) -> str:
    return f"{group}\n{dedup_id}" if scope == SCOPE_GROUP else dedup_id


class Sent(msgspec.Struct, frozen=True):
    msg_id: str
    sequence: str
    at_ms: int


class _QueueState(msgspec.Struct):
    seen: OrderedDict[str, Sent] = msgspec.field(default_factory=OrderedDict)  # oldest first
    scanned: dict[int, int] = msgspec.field(default_factory=dict)  # store queue → next offset to read
    turn: asyncio.Lock = msgspec.field(default_factory=asyncio.Lock)


class Deduplication:
    """The ids of the last five minutes of each FIFO queue (by topic) this gateway sends to."""

    def __init__(self, store: LogReader) -> None:
        self.store = store
        self._queues: dict[str, _QueueState] = {}

    def turn(self, topic: str) -> asyncio.Lock:
        """Held around a check, its send and `record`: one send of a queue at a time here."""
        return self._state(topic).turn

    def _state(self, topic: str) -> _QueueState:
        state = self._queues.get(topic)
        if state is None:
            state = self._queues[topic] = _QueueState()
        return state

    def forget(self, topic: str) -> None:
        self._queues.pop(topic, None)

    async def catch_up(self, topic: str, scope: str, now_ms: int) -> None:
        """Read what was appended to the queue since this gateway last looked (the last five
        minutes the first time), and drop what is older than five minutes."""
        state = self._state(topic)
        since = now_ms - DEDUP_WINDOW_MS
        for b in await self.store.bounds(topic):
            start = state.scanned.get(b.queue)
            if start is None:
                start = await self.store.offset_for_time(topic, b.queue, since)
            start = max(start, b.min)
            while start < b.max:
                msgs = await self.store.read(topic, b.queue, start, min(READ_CHUNK, b.max - start))
                if not msgs:
                    break
                for offset, m in msgs:
                    dedup_id = m.properties.get(PROPERTY_DEDUP)
                    if dedup_id is not None and m.timestamp_ms >= since:
                        key = dedup_key(scope, m.properties.get(PROPERTY_GROUP, ""), dedup_id)
                        if key not in state.seen:
                            state.seen[key] = Sent(m.msg_id, sequence_number(b.queue, offset), m.timestamp_ms)
                start = msgs[-1][0] + 1
            state.scanned[b.queue] = start
        while state.seen:
            oldest = next(iter(state.seen.values()))
            if oldest.at_ms >= since:
                break
            state.seen.popitem(last=False)

    def seen(self, topic: str, key: str, now_ms: int) -> Sent | None:
        sent = self._state(topic).seen.get(key)
        if sent is None or sent.at_ms < now_ms - DEDUP_WINDOW_MS:
            return None
        return sent

    def record(self, topic: str, key: str, sent: Sent, queue: int | None, offset: int | None) -> None:
        """A send stored: its id is taken, and its own offset need not be read back."""
        state = self._state(topic)
        state.seen[key] = sent
        if queue is not None and offset is not None and state.scanned.get(queue) == offset:
            state.scanned[queue] = offset + 1
