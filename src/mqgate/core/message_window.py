"""The message-level consumption mode's rules for one queue (issue 30: `mode=message`, what SQS
and RocketMQ 5's POP do): each message is received, hidden for its visibility timeout, and
deleted, made visible again or kept hidden by its own receipt, so one slow message holds back
no other.

A queue's window is the run of offsets from the committed offset (every message below it was
deleted) up to `end` (every message from it on was never received). Inside the window each
offset is either in flight (received, not deleted: hidden until `visible_ms`, then received
again) or deleted (waiting for the messages before it). The committed offset moves over the
deleted prefix, so offsets, lag, resets and every reader of committed offsets work as in the
other modes. The window is at most `limit` offsets: the receipt state a queue keeps is bounded,
and a queue whose oldest message is stuck stops handing out new ones only after `limit` more.

Pure: the embedded offset store applies these steps; the Redis store's scripts are their port
(offsets/backends/redis/receive.lua, settle_message.lua).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

# What settling one message by its receipt gives.
DELETED: Final = "deleted"  # it was in flight under this receipt: deleted now
ALREADY: Final = "already_deleted"  # deleted before (a retried delete): nothing to do
STALE: Final = "stale_receipt"  # received again since: this receipt no longer names it
CHANGED: Final = "changed"  # its visibility moved
NOT_IN_FLIGHT: Final = "not_in_flight"  # visible already: a receipt cannot hide it again
MessageOutcome = Literal["deleted", "already_deleted", "stale_receipt", "changed", "not_in_flight"]

DEFAULT_WINDOW: Final = 20_000  # offsets a queue's window spans at most


class InFlight(msgspec.Struct):
    visible_ms: int  # when it may be received again
    receives: int  # times received (the receipt names the receive: with first_ms, its identity)
    first_ms: int  # when it was first received


class Received(msgspec.Struct, frozen=True):
    """One message handed out (or, `dead_letter`, out of receives: for the dead-letter topic)."""

    queue: int
    offset: int
    receives: int
    first_ms: int
    dead_letter: bool = False


@dataclass(slots=True)
class Window:
    committed: int
    end: int
    inflight: dict[int, InFlight] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    # (visible_ms, offset) of every in-flight message, stale entries skipped when popped: the
    # messages visible again are found without a pass over the whole window.
    _due: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.end = max(self.end, self.committed)
        self._due = [(f.visible_ms, o) for o, f in self.inflight.items()]
        heapq.heapify(self._due)

    @property
    def size(self) -> int:
        return self.end - self.committed

    def hide(self, offset: int, f: InFlight) -> None:
        self.inflight[offset] = f
        heapq.heappush(self._due, (f.visible_ms, offset))
        if len(self._due) > 2 * len(self.inflight) + 64:  # mostly stale entries: start afresh
            self._due = [(g.visible_ms, o) for o, g in self.inflight.items()]
            heapq.heapify(self._due)

    def clamp(self, min_offset: int) -> None:
        """Retention removed everything below `min_offset`: so is its state."""
        if self.committed >= min_offset:
            return
        for o in [o for o in self.inflight if o < min_offset]:
            del self.inflight[o]
        self.deleted = {o for o in self.deleted if o >= min_offset}
        self.committed = min_offset
        self.end = max(self.end, min_offset)
        self.advance()

    def advance(self) -> None:
        """Move the committed offset over the deleted messages at its front."""
        while self.committed < self.end and self.committed in self.deleted:
            self.deleted.discard(self.committed)
            self.committed += 1

    def visible_again(self, now_ms: int, limit: int) -> list[int]:
        """Up to `limit` in-flight offsets whose visibility ran out, the longest visible first."""
        out: list[int] = []
        due = self._due
        while due and due[0][0] <= now_ms and len(out) < limit:
            visible, offset = heapq.heappop(due)
            f = self.inflight.get(offset)
            if f is not None and f.visible_ms == visible and offset not in out:
                out.append(offset)
        return out


def receive(
    w: Window,
    queue: int,
    *,
    min_offset: int,
    max_offset: int,
    now_ms: int,
    want: int,
    visibility_ms: int,
    max_attempts: int,
    limit: int = DEFAULT_WINDOW,
) -> list[Received]:
    """Hand out up to `want` messages of this queue: those visible again first (a message
    received `max_attempts` times comes back as a dead letter instead, hidden like the others
    while the caller moves it), then new ones while the window has room."""
    w.clamp(min_offset)
    out = [_again(w, queue, o, now_ms + visibility_ms, max_attempts) for o in w.visible_again(now_ms, want)]
    _take_new(w, queue, out, want, max_offset, now_ms, visibility_ms, limit)
    return out


def _again(w: Window, queue: int, offset: int, visible_ms: int, max_attempts: int) -> Received:
    """Hand out again a message received before (as a dead letter once out of receives)."""
    f = w.inflight[offset]
    dead = f.receives >= max_attempts
    again = InFlight(visible_ms, f.receives if dead else f.receives + 1, f.first_ms)
    w.hide(offset, again)
    return Received(queue, offset, again.receives, again.first_ms, dead)


def _take_new(
    w: Window,
    queue: int,
    out: list[Received],
    want: int,
    max_offset: int,
    now_ms: int,
    visibility_ms: int,
    limit: int,
) -> None:
    """Hand out never-received messages while `out` wants more and the window has room."""
    while len(out) < want and w.end < max_offset and w.size < limit:
        w.hide(w.end, InFlight(now_ms + visibility_ms, 1, now_ms))
        out.append(Received(queue, w.end, 1, now_ms))
        w.end += 1


def receive_ordered(
    w: Window,
    queue: int,
    *,
    min_offset: int,
    max_offset: int,
    now_ms: int,
    want: int,
    visibility_ms: int,
    max_attempts: int,
    limit: int = DEFAULT_WINDOW,
) -> list[Received]:
    """`receive` for a queue whose messages go out in order, one batch at a time (SQS FIFO: a
    message group's messages in order, none of the group while one is in flight): while any of
    its messages is hidden the queue hands out nothing; else its oldest not deleted first, those
    received before (visible again) and then new ones, in offset order."""
    w.clamp(min_offset)
    if any(f.visible_ms > now_ms for f in w.inflight.values()):
        return []
    out = [_again(w, queue, o, now_ms + visibility_ms, max_attempts) for o in sorted(w.inflight)[:want]]
    _take_new(w, queue, out, want, max_offset, now_ms, visibility_ms, limit)
    return out


def delete(w: Window, offset: int, receives: int, first_ms: int) -> MessageOutcome:
    """Delete the message `offset` received for the `receives`-th time at `first_ms`."""
    if offset < w.committed or offset in w.deleted:
        return ALREADY
    f = w.inflight.get(offset)
    if f is None or f.receives != receives or f.first_ms != first_ms:
        return STALE
    del w.inflight[offset]
    w.deleted.add(offset)
    w.advance()
    return DELETED


def change_visibility(
    w: Window, offset: int, receives: int, first_ms: int, now_ms: int, visible_ms: int
) -> MessageOutcome:
    """Hide the message until `visible_ms` (`now_ms`: visible at once), while this receipt
    still names it and it is still hidden."""
    if offset < w.committed or offset in w.deleted:
        return ALREADY
    f = w.inflight.get(offset)
    if f is None or f.receives != receives or f.first_ms != first_ms:
        return STALE
    if f.visible_ms <= now_ms:
        return NOT_IN_FLIGHT
    w.hide(offset, InFlight(visible_ms, f.receives, f.first_ms))
    return CHANGED


def in_flight(w: Window, now_ms: int) -> int:
    """Messages received and still hidden (SQS's ApproximateNumberOfMessagesNotVisible)."""
    return sum(1 for f in w.inflight.values() if f.visible_ms > now_ms)


def window_state(w: Window) -> list[Any]:
    """The window as plain values (journal records, compaction): end, in flight, deleted."""
    flights = [[o, f.visible_ms, f.receives, f.first_ms] for o, f in sorted(w.inflight.items())]
    return [w.end, flights, sorted(w.deleted)]


def window_from(committed: int, state: list[Any] | None) -> Window:
    if not state:
        return Window(committed, committed)
    end, flights, deleted = state
    inflight = {int(o): InFlight(int(v), int(r), int(first)) for o, v, r, first in flights}
    return Window(committed, int(end), inflight, {int(o) for o in deleted})
