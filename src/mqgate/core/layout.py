"""Where each queue a consumer reads sits in its offset table (SPEC G7 table, S1/S3 priority).

A consumer reads three store topics: its topic, whose queues come in priority lanes of
`queues` queues each (lane p holds priority p, for p up to the topic's max priority), its
retry topic (messages redelivered with backoff, SPEC S5) and its inbox (point-to-point
messages, SPEC S1). Its table lists them in an order that only ever grows at the end, so a
table written before a topic gained lanes stays valid:

    [topic lane 0: queues] [retry: 1] [inbox: 1] [topic lane 1: queues] [lane 2] ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mqgate.names import INTERNAL_PREFIXES

RETRY_PREFIX: Final = INTERNAL_PREFIXES[1]
INBOX_PREFIX: Final = INTERNAL_PREFIXES[2]
SIDE_QUEUES: Final = 2  # retry, inbox


def retry_topic(consumer: str) -> str:
    return f"{RETRY_PREFIX}{consumer}"


def inbox_topic(consumer: str) -> str:
    return f"{INBOX_PREFIX}{consumer}"


@dataclass(slots=True, frozen=True)
class Slot:
    topic: str
    queue: int  # the store queue within `topic`
    lane: int


@dataclass(slots=True, frozen=True)
class Layout:
    consumer: str
    topic: str
    queues: int  # per lane
    lanes: int  # max priority + 1

    @property
    def size(self) -> int:
        return self.queues * self.lanes + SIDE_QUEUES

    def slot(self, index: int) -> Slot:
        q = self.queues
        if not 0 <= index < self.size:
            raise IndexError(index)
        if index < q:
            return Slot(self.topic, index, 0)
        if index == q:
            return Slot(retry_topic(self.consumer), 0, 0)
        if index == q + 1:
            return Slot(inbox_topic(self.consumer), 0, 0)
        store_queue = index - SIDE_QUEUES
        return Slot(self.topic, store_queue, store_queue // q)


def store_queue_for(lane: int, queue: int, queues: int) -> int:
    """The store queue of `queue` (0..queues-1) in priority lane `lane`."""
    return lane * queues + queue


def table_index(store_queue: int, queues: int) -> int:
    """Where a topic's store queue sits in a consumer's table. Internal only: every answer and
    parameter names queues by store queue (docs/PROTOCOL.md, "Queue numbers")."""
    return store_queue if store_queue < queues else store_queue + SIDE_QUEUES
