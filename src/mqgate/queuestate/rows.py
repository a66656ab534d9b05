"""The interval rows of queue state: what the sampler rolls up, the history stores and the
diagnosis reads. Frozen msgspec Structs, no SQL, so `mqgate.queuestate.diagnosis` stays pure.

Occupancy is kept as an area (length × milliseconds) and the time it covers rather than as an
average, so two rows of the same key and interval (a partial one flushed on stop and the rest
written after a restart, or two gateways sampling the same queue) merge exactly: sum the areas,
sum the covered times, take the larger maximum.

A row may stand for a steady run (issue 27): `intervals` consecutive intervals whose state did
not change (an idle queue, a consumer with a constant backlog). Its `interval_ms` is then the
run's whole span and its sums cover all of them; `split_run` gives the single intervals back.
So an idle gateway's history grows by what changed, not by one row per queue per interval.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec
from msgspec.structs import replace

# The queue of a pull that delivered nothing: the gateway chose no queue, but the pull still
# shows the consumer is alive, so it is counted on this pseudo-queue of the topic.
NO_QUEUE: Final = -1
# The longest steady run one row stands for (the recorder starts a new row after it); the
# history's queries look back this far before their window for a run reaching into it.
MAX_RUN_MS: Final = 3_600_000


def _average(area: int, covered_ms: int) -> float | None:
    return area / covered_ms if covered_ms > 0 else None


class QueueInterval(msgspec.Struct, frozen=True):
    """One queue of a topic over one interval [start_ms, start_ms + interval_ms)."""

    project: str
    topic: str
    queue: int
    start_ms: int
    interval_ms: int
    max_length: int | None  # None: no length known in this interval (only drops counted)
    length_area: int  # sum of length × ms over the covered time
    covered_ms: int  # the time some sample's length held for (samples hold a bounded time)
    samples: int
    length_limit: int | None  # the queue's length limit when the caller knows one
    dropped: int  # messages removed by retention before any consumer group read them
    intervals: int = 1  # >1: a steady run of that many intervals (`split_run`)

    @property
    def avg_length(self) -> float | None:
        """Time-weighted average length over the covered part of the interval."""
        return _average(self.length_area, self.covered_ms)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.interval_ms


class ConsumerInterval(msgspec.Struct, frozen=True):
    """One consumer group on one queue of a topic over one interval. Backlog is the queue's
    newest offset minus the group's committed offset. Rows with queue NO_QUEUE carry only the
    pulls that delivered nothing."""

    project: str
    consumer: str
    topic: str
    queue: int
    start_ms: int
    interval_ms: int
    max_backlog: int | None  # None: no backlog sampled in this interval
    backlog_area: int
    covered_ms: int
    samples: int
    pulls: int  # pull calls (including ones that delivered nothing)
    delivered: int  # messages handed out
    acks: int  # ack calls
    acked: int  # messages settled by those acks
    last_pull_ms: int | None
    intervals: int = 1  # >1: a steady run of that many intervals (`split_run`)

    @property
    def avg_backlog(self) -> float | None:
        return _average(self.backlog_area, self.covered_ms)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.interval_ms


class ProduceInterval(msgspec.Struct, frozen=True):
    """Produce calls to one topic over one interval, and the failed ones by error type (the
    error's code: "storage", "disk_full", "bad_request", ...)."""

    project: str
    topic: str
    start_ms: int
    interval_ms: int
    produced: int  # messages accepted
    errors: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.interval_ms


class Rollup(msgspec.Struct):
    """Rows closed by the sampler and not yet written."""

    queues: list[QueueInterval] = msgspec.field(default_factory=list)
    consumers: list[ConsumerInterval] = msgspec.field(default_factory=list)
    produce: list[ProduceInterval] = msgspec.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.queues) + len(self.consumers) + len(self.produce)

    def extend(self, other: Rollup) -> None:
        self.queues.extend(other.queues)
        self.consumers.extend(other.consumers)
        self.produce.extend(other.produce)


class ProjectWindow(msgspec.Struct, frozen=True):
    """A project's rows over a time window: what the diagnosis reads."""

    project: str
    since_ms: int
    until_ms: int
    queues: list[QueueInterval]
    consumers: list[ConsumerInterval]
    produce: list[ProduceInterval]


_Run = TypeVar("_Run", QueueInterval, ConsumerInterval)

# The sums of a row, spread over the intervals of a run.
_QUEUE_SUMS: Final = ("length_area", "covered_ms", "samples", "dropped")
_CONSUMER_SUMS: Final = ("backlog_area", "covered_ms", "samples", "pulls", "delivered", "acks", "acked")


def split_run(row: _Run) -> list[_Run]:
    """The single intervals of a steady run (the row itself when it is one interval): each
    the run's maximum, and an equal share of its sums (the last takes what does not divide),
    so that every interval has the run's average; a last pull is moved back by whole
    intervals (the run pulled alike in each)."""
    k = row.intervals
    if k <= 1:
        return [row]
    step = row.interval_ms // k
    names = _QUEUE_SUMS if isinstance(row, QueueInterval) else _CONSUMER_SUMS
    out: list[_Run] = []
    for i in range(k):
        shares = {n: getattr(row, n) // k + (getattr(row, n) % k if i == k - 1 else 0) for n in names}
        piece = replace(row, start_ms=row.start_ms + i * step, interval_ms=step, intervals=1, **shares)
        if isinstance(piece, ConsumerInterval) and piece.last_pull_ms is not None:
            piece = replace(piece, last_pull_ms=piece.last_pull_ms - (k - 1 - i) * step)
        out.append(piece)
    return out
