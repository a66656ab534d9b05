"""Where each queue a consumer reads sits in its offset table (SPEC G7 table, S1/S3 priority).

A consumer reads three store topics: its topic, whose queues come in priority lanes of
`queues` queues each (lane p holds priority p, for p up to the topic's max priority), its
retry topic (messages redelivered with backoff, SPEC S5) and its inbox (point-to-point
messages, SPEC S1). Its table lists them in an order that only ever grows at the end, so a
table written before a topic grew stays valid:

    [topic lane 0: queues] [retry: 1] [inbox: 1] [topic lane 1: queues] [lane 2] ... [grown] ...

A topic's (lane, queue) cells are numbered as store queues by its `QueueGrid`: lane by lane at
creation, and when the topic grows (more queues per lane, or more lanes) the new cells take the
next numbers, lane by lane. No stored message ever changes its queue number, and a consumer's
table only grows at the end.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec

from mqgate.model import QueueBounds
from mqgate.names import INTERNAL_PREFIXES

RETRY_PREFIX: Final = INTERNAL_PREFIXES[1]
INBOX_PREFIX: Final = INTERNAL_PREFIXES[2]
SIDE_QUEUES: Final = 2  # retry, inbox


def retry_topic(consumer: str) -> str:
    return f"{RETRY_PREFIX}{consumer}"


def inbox_topic(consumer: str) -> str:
    return f"{INBOX_PREFIX}{consumer}"


class Slot(msgspec.Struct, frozen=True):
    topic: str
    queue: int  # the store queue within `topic`
    lane: int


# A topic's shape at one time: (queues per lane, lanes). Shapes only grow, in both.
Shape = tuple[int, int]


class QueueGrid:
    """The store queue numbers of a topic's (lane, queue) cells, over the shapes it has had."""

    __slots__ = ("_cells", "_lanes", "_numbers", "_shapes", "first_queues", "lanes", "queues")

    def __init__(self, shapes: tuple[Shape, ...]) -> None:
        if not shapes:
            raise ValueError("a topic has at least one shape")
        self._shapes = shapes
        self._cells: list[tuple[int, int]] = []  # store queue -> (lane, queue)
        self._numbers: dict[tuple[int, int], int] = {}
        self._lanes: dict[int, list[int]] = {}  # lane -> its store queues, by queue (lane_queues)
        for queues, lanes in shapes:
            for lane in range(lanes):
                for queue in range(queues):
                    if (lane, queue) not in self._numbers:
                        self._numbers[lane, queue] = len(self._cells)
                        self._cells.append((lane, queue))
        self.queues, self.lanes = shapes[-1]
        # The queues that sit before the side queues in every consumer table.
        self.first_queues = shapes[0][0]

    def __reduce__(self) -> tuple[Any, tuple[tuple[Shape, ...]]]:
        # Pickled as its shapes (a pull's layout goes to the store process with each lease).
        return grid_for, (self._shapes,)

    @property
    def size(self) -> int:
        return len(self._cells)

    def store_queue(self, lane: int, queue: int) -> int:
        """The store queue of `queue` (0..queues-1) in priority lane `lane`."""
        return self._numbers[lane, queue]

    def lane_queues(self, lane: int) -> list[int]:
        """The store queues of lane `lane`, by queue (0..queues-1)."""
        found = self._lanes.get(lane)
        if found is None:
            found = self._lanes[lane] = [self._numbers[lane, q] for q in range(self.queues)]
        return found

    def lane_of(self, store_queue: int) -> int:
        return self._cells[store_queue][0]

    def table_index(self, store_queue: int) -> int:
        """Where a topic's store queue sits in a consumer's table. Internal only: every answer
        and parameter names queues by store queue (docs/PROTOCOL.md, "Queue numbers")."""
        return store_queue if store_queue < self.first_queues else store_queue + SIDE_QUEUES


@functools.lru_cache(maxsize=4096)
def grid_for(shapes: tuple[Shape, ...]) -> QueueGrid:
    return QueueGrid(shapes)


def grown(shapes: tuple[Shape, ...], queues: int, lanes: int) -> tuple[Shape, ...]:
    """The shapes after growing to `queues` per lane and `lanes` lanes; ValueError when that
    would take a queue or a lane away."""
    now_queues, now_lanes = shapes[-1]
    if queues < now_queues or lanes < now_lanes:
        raise ValueError(f"a topic only grows: it has {now_queues} queues in {now_lanes} lanes")
    if (queues, lanes) == shapes[-1]:
        return shapes
    return (*shapes, (queues, lanes))


class Layout(msgspec.Struct, frozen=True):
    consumer: str
    topic: str
    grid: QueueGrid

    @property
    def topic_queues(self) -> int:
        return self.grid.size

    @property
    def size(self) -> int:
        return self.grid.size + SIDE_QUEUES

    def slot(self, index: int) -> Slot:
        q = self.grid.first_queues
        if not 0 <= index < self.size:
            raise IndexError(index)
        if index < q:
            return Slot(self.topic, index, 0)
        if index == q:
            return Slot(retry_topic(self.consumer), 0, 0)
        if index == q + 1:
            return Slot(inbox_topic(self.consumer), 0, 0)
        store_queue = index - SIDE_QUEUES
        return Slot(self.topic, store_queue, self.grid.lane_of(store_queue))

    @property
    def store_topics(self) -> list[str]:
        """The three store topics the table reads, in the order `queue_bounds` takes their bounds."""
        return [self.topic, retry_topic(self.consumer), inbox_topic(self.consumer)]

    def queue_bounds(self, per_topic: list[list[QueueBounds]]) -> list[QueueBounds]:
        """The table's queues' bounds, in table order with their lanes, from the store's bounds
        of `store_topics` (one list per topic, in that order)."""
        topic, retry, inbox = per_topic
        q = self.grid.first_queues
        ordered = [*topic[:q], retry[0], inbox[0], *topic[q : self.topic_queues]]
        return [QueueBounds(i, b.min, b.max, self.slot(i).lane) for i, b in enumerate(ordered)]
