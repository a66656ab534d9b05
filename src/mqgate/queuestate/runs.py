"""Steady runs (issue 27): closed interval rows folded so that an idle key costs no new row.

A queue whose length did not move over an interval, or a consumer whose backlog and counts did
not, closes an interval row equal to its previous one but for the time. Written one by one,
those rows made the history grow by one row per queue per interval however idle the gateway
(12 MB/min at thousands of queues). Here such a row extends its key's run instead: the run's
first row was written when it began, and the rows that continue it are written as one row of
the same key and start (`intervals` and `interval_ms` the run's so far, the sums of the rows
added since the last such write), which the history merges into it. So the history grows by
what changed; a run is written on, in place, when it ends (a change, `MAX_RUN_MS` reached, its
key no longer sampled), when a reader asks (`take(everything=True)`), and at least every
`persist_every_ms`, which bounds what a kill -9 loses of a run that goes on.

"Equal" is every figure of the interval but the number of samples (a sampler's period does not
divide an interval exactly: 11, 12 or 13 samples of the same length): maximum, area and covered
time, length limit and drops; for a consumer its backlog's, and its pulls, deliveries and acks.
Pure: no IO; the recorder calls it on the event loop.
"""

from __future__ import annotations

from typing import Any, Final, Generic, TypeVar

from msgspec.structs import replace

from mqgate.queuestate.rows import MAX_RUN_MS, ConsumerInterval, QueueInterval, Rollup

DEFAULT_PERSIST_EVERY_MS: Final = 600_000

_R = TypeVar("_R", QueueInterval, ConsumerInterval)
_K = TypeVar("_K")

_QUEUE_SAME: Final = ("interval_ms", "max_length", "length_area", "covered_ms", "length_limit", "dropped")
_QUEUE_SUMS: Final = ("length_area", "covered_ms", "samples", "dropped")
_CONSUMER_SAME: Final = (
    "interval_ms", "max_backlog", "backlog_area", "covered_ms", "pulls", "delivered", "acks", "acked",
)  # fmt: skip
_CONSUMER_SUMS: Final = ("backlog_area", "covered_ms", "samples", "pulls", "delivered", "acks", "acked")


class _Run(Generic[_R]):
    __slots__ = ("count", "first", "last_pull_ms", "persisted_ms", "since_write", "sums")

    def __init__(self, first: _R, now_ms: int) -> None:
        self.first: _R = first
        self.count = 1  # intervals in the run
        self.since_write = 0  # of them, added since the run was last written
        self.sums: dict[str, int] = {}
        self.last_pull_ms: int | None = None
        self.persisted_ms = now_ms

    @property
    def next_start(self) -> int:
        return self.first.start_ms + self.count * self.first.interval_ms

    def continued_by(self, row: _R, same: tuple[str, ...]) -> bool:
        first = self.first
        return (
            row.intervals == 1
            and row.start_ms == self.next_start
            and (self.count + 1) * first.interval_ms <= MAX_RUN_MS
            and all(getattr(row, n) == getattr(first, n) for n in same)
            and (getattr(row, "last_pull_ms", None) is None) == (getattr(first, "last_pull_ms", None) is None)
        )

    def add(self, row: _R, sums: tuple[str, ...]) -> None:
        self.count += 1
        self.since_write += 1
        for name in sums:
            self.sums[name] = self.sums.get(name, 0) + getattr(row, name)
        last = getattr(row, "last_pull_ms", None)
        if last is not None and (self.last_pull_ms is None or last > self.last_pull_ms):
            self.last_pull_ms = last

    def take(self, now_ms: int) -> _R | None:
        """The row that brings the written run up to date (None: it is)."""
        if not self.since_write:
            return None
        first = self.first
        fields: dict[str, Any] = dict(self.sums)
        if isinstance(first, ConsumerInterval):
            fields["last_pull_ms"] = self.last_pull_ms
        row = replace(first, interval_ms=self.count * first.interval_ms, intervals=self.count, **fields)
        self.since_write, self.sums, self.last_pull_ms = 0, {}, None
        self.persisted_ms = now_ms
        return row


class _Runs(Generic[_K, _R]):
    """The open runs of one kind of row, and which of them have unwritten intervals."""

    __slots__ = ("open", "same", "sums", "unwritten")

    def __init__(self, same: tuple[str, ...], sums: tuple[str, ...]) -> None:
        self.open: dict[_K, _Run[_R]] = {}
        self.unwritten: set[_K] = set()
        self.same = same
        self.sums = sums

    def fold(self, key: _K, row: _R, now_ms: int, out: list[_R]) -> bool:
        """True: `row` extended its key's run (nothing to write now)."""
        run = self.open.get(key)
        if run is not None and run.continued_by(row, self.same):
            run.add(row, self.sums)
            self.unwritten.add(key)
            return True
        if run is not None and (ended := run.take(now_ms)) is not None:
            out.append(ended)
        self.unwritten.discard(key)
        self.open[key] = _Run(row, now_ms)
        out.append(row)
        return False

    def take(self, now_ms: int, out: list[_R], everything: bool, persist_every_ms: int) -> None:
        if everything:
            for key in self.unwritten:
                row = self.open[key].take(now_ms)
                if row is not None:
                    out.append(row)
            self.unwritten.clear()
            return
        gone = []
        for key, run in self.open.items():
            ended = run.next_start + run.first.interval_ms <= now_ms
            if ended or now_ms - run.persisted_ms >= persist_every_ms:
                row = run.take(now_ms)
                if row is not None:
                    out.append(row)
                self.unwritten.discard(key)
            if ended:
                gone.append(key)
        for key in gone:
            del self.open[key]


class SteadyRuns:
    """The open runs of one recorder: of queues, and of consumers on queues."""

    def __init__(self, persist_every_ms: int = DEFAULT_PERSIST_EVERY_MS) -> None:
        self.persist_every_ms = persist_every_ms
        self._queues: _Runs[tuple[str, str, int], QueueInterval] = _Runs(_QUEUE_SAME, _QUEUE_SUMS)
        self._consumers: _Runs[tuple[str, str, str, int], ConsumerInterval] = _Runs(
            _CONSUMER_SAME, _CONSUMER_SUMS
        )
        self._checked_ms = 0  # when the runs were last looked over (`take`)
        self.extended = 0  # rows that extended a run instead of being written

    def __len__(self) -> int:
        return len(self._queues.open) + len(self._consumers.open)

    def fold(self, closed: Rollup, now_ms: int) -> Rollup:
        """The rows of `closed` to write now: those that begin a run, and the rows that bring
        the runs they end up to date. Rows that continue a run are held in it."""
        out = Rollup(produce=closed.produce)
        for q in closed.queues:
            self.extended += self._queues.fold((q.project, q.topic, q.queue), q, now_ms, out.queues)
        for c in closed.consumers:
            key = (c.project, c.consumer, c.topic, c.queue)
            self.extended += self._consumers.fold(key, c, now_ms, out.consumers)
        return out

    def take(self, now_ms: int, *, everything: bool) -> Rollup:
        """The rows that bring the written runs up to date: of every run with unwritten
        intervals (`everything`: a reader is about to look, or the recorder stops), else of
        the runs that ended (their key's next interval closed without a row: no longer
        sampled; they are forgotten) or were last written `persist_every_ms` ago. Without
        `everything` the runs are looked over at most once a minute: rows come at interval
        boundaries, so looking more often finds nothing."""
        out = Rollup()
        if not everything:
            if now_ms - self._checked_ms < 60_000:
                return out
            self._checked_ms = now_ms
        self._queues.take(now_ms, out.queues, everything, self.persist_every_ms)
        self._consumers.take(now_ms, out.consumers, everything, self.persist_every_ms)
        return out
