"""Queue state observed on the gateway's hot path, rolled up into interval rows.

The observation calls are a dict lookup and a few integer updates: no IO, no lock. They are
meant to be called from one thread (the gateway's event loop); `roll_up` (or `sweep` in steps,
as the recorder does) runs on that same thread and only hands back the finished rows, which the
recorder writes elsewhere. An observation timed before its key's current interval (a clock that
stepped back) counts in the current interval.

Intervals are aligned to the epoch (start = t - t % interval), so the rows of every gateway and
of every restart of one gateway fall on the same boundaries and merge in the history.

Occupancy is time-weighted: a sampled length holds until the next sample of that queue, but
for at most `hold` (default 2 × sample_every_s), so a sampler that stopped, or a queue no longer
sampled, does not stretch its last value over time nobody saw. The average is over the time
covered by held samples, not over the whole interval: a queue first seen 10 s before an
interval's end is averaged over those 10 s. A sample's value carries across an interval
boundary for the rest of its hold, so the next interval starts from a known length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from mqgate.queuestate.rows import NO_QUEUE, ConsumerInterval, ProduceInterval, QueueInterval, Rollup

__all__ = ["NO_QUEUE", "QueueStateSampler"]

DEFAULT_INTERVAL_S: Final = 60.0
DEFAULT_SAMPLE_EVERY_S: Final = 1.0
# A sample holds this many sample periods at most (one missed sample is tolerated).
HOLD_SAMPLE_PERIODS: Final = 2.0


class _Slot:
    """One key's current interval: a time-weighted gauge plus counters."""

    __slots__ = ("area", "covered", "cursor", "end", "epoch", "last", "last_ms", "peak", "samples", "start")

    def __init__(self, start: int, interval_ms: int) -> None:
        self.epoch = 0  # the sampler's full round this key was last sampled in (`confirm`)
        self.start = start
        self.end = start + interval_ms
        self.cursor = start  # the time up to which the held value has been accounted
        self.last: int | None = None  # the latest sampled value, while it still holds
        self.last_ms = 0
        self.area = 0
        self.covered = 0
        self.peak: int | None = None
        self.samples = 0

    def accrue(self, to_ms: int, hold_ms: int) -> None:
        """Account the held value from the cursor up to `to_ms` (no further than its hold)."""
        if to_ms <= self.cursor:
            return
        if self.last is not None:
            seg_end = min(to_ms, self.last_ms + hold_ms)
            if seg_end > self.cursor:
                span = seg_end - self.cursor
                self.area += self.last * span
                self.covered += span
        self.cursor = to_ms

    def sample(self, value: int, now_ms: int, hold_ms: int) -> None:
        # A clock that stepped back counts the sample at the cursor: time never runs backwards.
        now_ms = max(now_ms, self.cursor)
        self.accrue(now_ms, hold_ms)
        self.last = value
        self.last_ms = now_ms
        if self.peak is None or value > self.peak:
            self.peak = value
        self.samples += 1

    def has_gauge(self) -> bool:
        return self.samples > 0 or self.covered > 0

    def has_content(self) -> bool:
        return self.has_gauge()

    def restart(self, start: int, interval_ms: int, hold_ms: int) -> None:
        """Begin the interval at `start` (the held value carries in if its hold reaches it)."""
        self.start = start
        self.end = start + interval_ms
        self.cursor = start
        self.area = self.covered = self.samples = 0
        if self.last is not None and self.last_ms + hold_ms > start:
            self.peak = self.last
        else:
            self.last, self.peak = None, None

    def clear_partial(self, now_ms: int, hold_ms: int) -> None:
        """After a partial row was taken at `now_ms`: keep the interval, count afresh from now
        (the history adds the next row of this interval to the partial one)."""
        self.cursor = max(self.cursor, now_ms)
        self.area = self.covered = self.samples = 0
        if self.last is not None and self.last_ms + hold_ms <= self.cursor:
            self.last = None
        self.peak = self.last


def _resample(slot: _Slot, now_ms: int, hold_ms: int) -> None:
    """The held value sampled again at `now_ms`, not counted as a sample."""
    if slot.last is not None:
        samples = slot.samples
        slot.sample(slot.last, now_ms, hold_ms)
        slot.samples = samples


class _QueueSlot(_Slot):
    __slots__ = ("dropped", "limit")

    def __init__(self, start: int, interval_ms: int) -> None:
        super().__init__(start, interval_ms)
        self.limit: int | None = None
        self.dropped = 0

    def has_content(self) -> bool:
        return self.samples > 0 or self.covered > 0 or self.dropped > 0

    def zero_counters(self) -> None:
        self.dropped = 0


class _ConsumerSlot(_Slot):
    __slots__ = ("acked", "acks", "delivered", "last_pull_ms", "pulls")

    def __init__(self, start: int, interval_ms: int) -> None:
        super().__init__(start, interval_ms)
        self.pulls = self.delivered = self.acks = self.acked = 0
        self.last_pull_ms: int | None = None

    def has_content(self) -> bool:
        return self.samples > 0 or self.covered > 0 or self.pulls > 0 or self.acks > 0

    def zero_counters(self) -> None:
        self.pulls = self.delivered = self.acks = self.acked = 0
        self.last_pull_ms = None


class _ProduceSlot:
    __slots__ = ("end", "errors", "produced", "start")

    def __init__(self, start: int, interval_ms: int) -> None:
        self.start = start
        self.end = start + interval_ms
        self.produced = 0
        self.errors: dict[str, int] = {}


QueueKey = tuple[str, str, int]  # project, topic, queue
ConsumerKey = tuple[str, str, str, int]  # project, consumer, topic, queue
ProduceKey = tuple[str, str]  # project, topic


class QueueStateSampler:
    """Collects observations; `roll_up` returns the interval rows that are complete."""

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, sample_every_s: float = DEFAULT_SAMPLE_EVERY_S
    ) -> None:
        if interval_s <= 0 or sample_every_s <= 0:
            raise ValueError("interval_s and sample_every_s must be positive")
        self.interval_ms = max(int(interval_s * 1000), 1)
        self.sample_every_s = sample_every_s
        self.hold_ms = max(int(sample_every_s * 1000 * HOLD_SAMPLE_PERIODS), 1)
        self._queues: dict[QueueKey, _QueueSlot] = {}
        self._consumers: dict[ConsumerKey, _ConsumerSlot] = {}
        self._produce: dict[ProduceKey, _ProduceSlot] = {}
        self._closed = Rollup()
        self._next_boundary = 0  # before it, no slot can have an interval to close
        self._epoch = 0  # full rounds begun (`begin_full_round`)
        self._confirmed_ms: int | None = None  # the latest `confirm` of an unbroken chain

    # -- confirmation (a prober that reads only what changed) ----------------------------------

    def begin_full_round(self) -> None:
        """A round that samples every key begins: keys it does not sample (gone) are no longer
        confirmed; their value holds from their last confirmation, for at most a hold."""
        for slot in self._slots():
            self._fresh(slot)
        self._epoch += 1

    def confirm(self, now_ms: int) -> None:
        """Every key sampled since the latest full round still has its value at `now_ms`."""
        if self._confirmed_ms is not None and now_ms - self._confirmed_ms > self.hold_ms:
            # The prober stalled: the chain of confirmations breaks. What it held stops at its
            # hold; from now on the values hold again, as if sampled (not counted) now.
            for qkey, qslot in list(self._queues.items()):
                if self._stale(qslot, now_ms):
                    if now_ms >= qslot.end:
                        self._advance_queue(qkey, qslot, now_ms)
                    _resample(qslot, now_ms, self.hold_ms)
            for ckey, cslot in list(self._consumers.items()):
                if self._stale(cslot, now_ms):
                    if now_ms >= cslot.end:
                        self._advance_consumer(ckey, cslot, now_ms)
                    _resample(cslot, now_ms, self.hold_ms)
        if self._confirmed_ms is None or now_ms > self._confirmed_ms:
            self._confirmed_ms = now_ms

    def _slots(self) -> Iterator[_Slot]:
        yield from self._queues.values()
        yield from self._consumers.values()

    def _fresh(self, slot: _Slot) -> None:
        """Bring the slot's last sample time up to the latest confirmation that covers it."""
        confirmed = self._confirmed_ms
        if (
            confirmed is not None
            and slot.epoch == self._epoch
            and slot.last is not None
            and confirmed > slot.last_ms
        ):
            slot.last_ms = confirmed

    def _stale(self, slot: _Slot, now_ms: int) -> bool:
        self._fresh(slot)
        return slot.epoch == self._epoch and slot.last is not None and now_ms > slot.last_ms

    def bucket(self, now_ms: int) -> int:
        return now_ms - now_ms % self.interval_ms

    # -- observations (hot path) --------------------------------------------------------------

    def observe_queue(
        self, project: str, topic: str, queue: int, length: int, now_ms: int, limit: int | None = None
    ) -> None:
        """A sample of a queue's length (messages stored and not yet removed by retention);
        `limit` is its length limit when there is one."""
        key = (project, topic, queue)
        slot = self._queues.get(key)
        if slot is None:
            slot = self._queues[key] = _QueueSlot(self.bucket(now_ms), self.interval_ms)
        else:
            self._fresh(slot)
            if now_ms >= slot.end:
                self._advance_queue(key, slot, now_ms)
        slot.sample(length, now_ms, self.hold_ms)
        slot.epoch = self._epoch
        if limit is not None:
            slot.limit = limit

    def count_dropped(self, project: str, topic: str, queue: int, messages: int, now_ms: int) -> None:
        """Messages retention removed before a consumer group read them."""
        key = (project, topic, queue)
        slot = self._queues.get(key)
        if slot is None:
            slot = self._queues[key] = _QueueSlot(self.bucket(now_ms), self.interval_ms)
        else:
            self._fresh(slot)
            if now_ms >= slot.end:
                self._advance_queue(key, slot, now_ms)
        slot.dropped += messages

    def observe_backlog(
        self, project: str, consumer: str, topic: str, queue: int, backlog: int, now_ms: int
    ) -> None:
        """A sample of a group's backlog on a queue (newest offset − committed offset)."""
        slot = self._consumer_slot(project, consumer, topic, queue, now_ms)
        slot.sample(backlog, now_ms, self.hold_ms)
        slot.epoch = self._epoch

    def count_pull(
        self, project: str, consumer: str, topic: str, queue: int, delivered: int, now_ms: int
    ) -> None:
        """One pull by a group; `queue` is the queue it was served from, NO_QUEUE if none."""
        slot = self._consumer_slot(project, consumer, topic, queue, now_ms)
        slot.pulls += 1
        slot.delivered += delivered
        if slot.last_pull_ms is None or now_ms > slot.last_pull_ms:
            slot.last_pull_ms = now_ms

    def count_ack(
        self, project: str, consumer: str, topic: str, queue: int, messages: int, now_ms: int
    ) -> None:
        """One ack call by a group settling `messages` messages of a queue."""
        slot = self._consumer_slot(project, consumer, topic, queue, now_ms)
        slot.acks += 1
        slot.acked += messages

    def count_produce(
        self, project: str, topic: str, ok: bool, error_type: str | None, now_ms: int, messages: int = 1
    ) -> None:
        """A produce call: `messages` accepted if ok, else one failure of `error_type` (the
        error's code)."""
        key = (project, topic)
        slot = self._produce.get(key)
        if slot is None:
            slot = self._produce[key] = _ProduceSlot(self.bucket(now_ms), self.interval_ms)
        elif now_ms >= slot.end:
            self._advance_produce(key, slot, now_ms)
        if ok:
            slot.produced += messages
        else:
            kind = error_type or "unknown"
            slot.errors[kind] = slot.errors.get(kind, 0) + 1

    def _consumer_slot(
        self, project: str, consumer: str, topic: str, queue: int, now_ms: int
    ) -> _ConsumerSlot:
        key = (project, consumer, topic, queue)
        slot = self._consumers.get(key)
        if slot is None:
            slot = self._consumers[key] = _ConsumerSlot(self.bucket(now_ms), self.interval_ms)
        else:
            self._fresh(slot)
            if now_ms >= slot.end:
                self._advance_consumer(key, slot, now_ms)
        return slot

    # -- roll-up ------------------------------------------------------------------------------

    def roll_up(self, now_ms: int, *, final: bool = False) -> Rollup:
        """The rows finished by `now_ms`. With `final`, also the open intervals up to now (on
        stop); observing may go on after it, and what follows adds to those partial rows."""
        for _ in self.sweep(now_ms, final=final, chunk=0):
            pass
        return self.take_closed()

    def sweep(self, now_ms: int, *, final: bool = False, chunk: int = 500) -> Iterator[None]:
        """`roll_up` in steps: close the intervals ended by `now_ms` (all open ones with
        `final`), yielding after every `chunk` keys (0: never) so an event loop can serve
        requests meanwhile (a key costs a few µs: 30 000 keys in one go would stall it for
        ~0.2 s). Observations between steps are fine. Then `take_closed()`."""
        if not final and now_ms < self._next_boundary:
            return
        done = 0
        for qkey, qslot in list(self._queues.items()):
            self._fresh(qslot)
            if now_ms >= qslot.end:
                self._advance_queue(qkey, qslot, now_ms)
            if final:
                qslot.accrue(now_ms, self.hold_ms)
                self._emit_queue(qkey, qslot)
                qslot.clear_partial(now_ms, self.hold_ms)
                qslot.zero_counters()
            if qslot.last is None and not qslot.has_content() and self._queues.get(qkey) is qslot:
                del self._queues[qkey]  # nothing held, nothing counted: forget it until seen again
            done += 1
            if done == chunk:
                done = 0
                yield
        for ckey, cslot in list(self._consumers.items()):
            self._fresh(cslot)
            if now_ms >= cslot.end:
                self._advance_consumer(ckey, cslot, now_ms)
            if final:
                cslot.accrue(now_ms, self.hold_ms)
                self._emit_consumer(ckey, cslot)
                cslot.clear_partial(now_ms, self.hold_ms)
                cslot.zero_counters()
            if cslot.last is None and not cslot.has_content() and self._consumers.get(ckey) is cslot:
                del self._consumers[ckey]
            done += 1
            if done == chunk:
                done = 0
                yield
        for pkey, pslot in list(self._produce.items()):
            if (now_ms >= pslot.end or final) and self._produce.get(pkey) is pslot:
                self._emit_produce(pkey, pslot)
                del self._produce[pkey]
            done += 1
            if done == chunk:
                done = 0
                yield
        self._next_boundary = max(self._next_boundary, self.bucket(now_ms) + self.interval_ms)

    def take_closed(self) -> Rollup:
        """The rows closed so far (by `sweep` or by observations crossing a boundary)."""
        out, self._closed = self._closed, Rollup()
        return out

    def pending_rows(self) -> int:
        return len(self._closed)

    def tracked_keys(self) -> int:
        return len(self._queues) + len(self._consumers) + len(self._produce)

    def _next_start(self, slot: _Slot, now_ms: int) -> int:
        # The next interval in sequence while the held value still reaches into it (so it is
        # accounted there); else straight to now's interval: the ones between saw nothing.
        if slot.last is not None and slot.last_ms + self.hold_ms > slot.end:
            return slot.end
        return self.bucket(now_ms)

    def _advance_queue(self, key: QueueKey, slot: _QueueSlot, now_ms: int) -> None:
        while now_ms >= slot.end:
            slot.accrue(slot.end, self.hold_ms)
            self._emit_queue(key, slot)
            slot.restart(self._next_start(slot, now_ms), self.interval_ms, self.hold_ms)
            slot.zero_counters()

    def _advance_consumer(self, key: ConsumerKey, slot: _ConsumerSlot, now_ms: int) -> None:
        while now_ms >= slot.end:
            slot.accrue(slot.end, self.hold_ms)
            self._emit_consumer(key, slot)
            slot.restart(self._next_start(slot, now_ms), self.interval_ms, self.hold_ms)
            slot.zero_counters()

    def _advance_produce(self, key: ProduceKey, slot: _ProduceSlot, now_ms: int) -> None:
        self._emit_produce(key, slot)
        slot.start = self.bucket(now_ms)
        slot.end = slot.start + self.interval_ms
        slot.produced = 0
        slot.errors = {}

    def _emit_queue(self, key: QueueKey, s: _QueueSlot) -> None:
        if s.has_content():
            self._closed.queues.append(
                QueueInterval(
                    *key,
                    s.start,
                    self.interval_ms,
                    s.peak if s.has_gauge() else None,
                    s.area,
                    s.covered,
                    s.samples,
                    s.limit,
                    s.dropped,
                )
            )

    def _emit_consumer(self, key: ConsumerKey, s: _ConsumerSlot) -> None:
        if s.has_content():
            self._closed.consumers.append(
                ConsumerInterval(
                    *key,
                    s.start,
                    self.interval_ms,
                    s.peak if s.has_gauge() else None,
                    s.area,
                    s.covered,
                    s.samples,
                    s.pulls,
                    s.delivered,
                    s.acks,
                    s.acked,
                    s.last_pull_ms,
                )
            )

    def _emit_produce(self, key: ProduceKey, s: _ProduceSlot) -> None:
        if s.produced or s.errors:
            self._closed.produce.append(
                ProduceInterval(*key, s.start, self.interval_ms, s.produced, s.errors)
            )
