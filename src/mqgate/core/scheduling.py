"""SPEC S2, S3, S5: delivery windows, redelivery backoff and the delivery order of held messages.

A destination's window is `[deliver_at_ms, deadline_ms]` (closed); deadline 0 means none. Before
the window opens the destination waits, inside it it is due, after it it has expired.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

from mqgate.errors import BadRequest

WindowState = Literal["waiting", "due", "expired"]
WAITING: Final = "waiting"
DUE: Final = "due"
EXPIRED: Final = "expired"

NO_DEADLINE: Final = 0
MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 9
BACKOFF_FIRST_MS: Final = 1_000
BACKOFF_CAP_MS: Final = 5 * 60 * 1_000
# Enough to cover the cap: 1 s * 2**9 > 5 min, so larger exponents are never computed.
_BACKOFF_MAX_SHIFT: Final = 9

# Field widths of the packed delivery order key (bits). Times are epoch milliseconds: 2**47 ms
# is the year 6429; 2**16 destinations per message and 2**63 sequence numbers are never reached.
TIME_BITS: Final = 47
SEQ_BITS: Final = 63
INDEX_BITS: Final = 16
MAX_TIME_MS: Final = (1 << TIME_BITS) - 1
MAX_SEQ: Final = (1 << SEQ_BITS) - 1
MAX_DESTINATIONS: Final = 1 << INDEX_BITS


def deadline_for(start_ms: int, ttl_ms: int | None) -> int:
    """The latest-delivery deadline of a destination that starts at `start_ms` and stays valid
    for `ttl_ms` (SPEC S2); no TTL (None or 0) means no deadline (0)."""
    if ttl_ms is None or ttl_ms == 0:
        return NO_DEADLINE
    if ttl_ms < 0:
        raise BadRequest("ttlMs must not be negative", field="ttlMs")
    return start_ms + ttl_ms


class Window(Protocol):
    @property
    def deliver_at_ms(self) -> int: ...

    @property
    def deadline_ms(self) -> int: ...


def window_state(dest: Window, now_ms: int) -> WindowState:
    return _state(dest.deliver_at_ms, dest.deadline_ms, now_ms)


def is_expired(deadline_ms: int, now_ms: int) -> bool:
    return deadline_ms != NO_DEADLINE and now_ms > deadline_ms


def _state(deliver_at_ms: int, deadline_ms: int, now_ms: int) -> WindowState:
    if is_expired(deadline_ms, now_ms):
        return EXPIRED
    if deliver_at_ms <= now_ms:
        return DUE
    return WAITING


def validate_window(
    deliver_at_ms: int,
    deadline_ms: int,
    now_ms: int,
    *,
    start_field: str = "deliverAt",
    deadline_field: str = "deadline",
) -> WindowState:
    """Check a destination's window at intake and say where `now_ms` falls in it.

    A start in the past is accepted as is (the destination is due at once: the start is not
    moved to now, so the delivery order keeps the requested time). A deadline before the start
    is refused; a deadline already past is accepted and reported as "expired", so the caller
    decides whether to refuse it or to hold it and let delivery expire it.
    """
    if not 0 <= deliver_at_ms <= MAX_TIME_MS:
        raise BadRequest(f"{start_field} is out of range", field=start_field)
    if not 0 <= deadline_ms <= MAX_TIME_MS:
        raise BadRequest(f"{deadline_field} is out of range", field=deadline_field)
    if deadline_ms != NO_DEADLINE and deadline_ms < deliver_at_ms:
        raise BadRequest(f"{deadline_field} is before the delivery start", field=deadline_field)
    return _state(deliver_at_ms, deadline_ms, now_ms)


def validate_priority(priority: int, *, field: str = "priority") -> None:
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise BadRequest(f"{field} must be {MIN_PRIORITY}..{MAX_PRIORITY}", field=field)


def redelivery_backoff_ms(attempt: int) -> int:
    """The wait after failed delivery `attempt` (1-based): 1 s, 2 s, 4 s ... at most 5 min."""
    shift = min(max(attempt, 1) - 1, _BACKOFF_MAX_SHIFT)
    return min(BACKOFF_FIRST_MS << shift, BACKOFF_CAP_MS)


def redelivery_due(now_ms: int, attempts: int, deadline_ms: int, max_attempts: int) -> int | None:
    """When to try again after `attempts` failed deliveries (SPEC S5), or None when the deadline
    passes first or `max_attempts` (0 = unlimited) are used up: the destination is then given up."""
    if max_attempts > 0 and attempts >= max_attempts:
        return None
    due = now_ms + redelivery_backoff_ms(attempts)
    if deadline_ms != NO_DEADLINE and due > deadline_ms:
        return None
    return due


def delivery_order(priority: int, due_ms: int, seq: int, index: int) -> tuple[int, int, int, int]:
    """Sort key among due destinations (SPEC S3): highest priority first, then the earliest
    start, then the oldest message, then the destination's position in it."""
    return (-priority, due_ms, seq, index)


def delivery_rank(priority: int, due_ms: int, seq: int, index: int) -> int:
    """`delivery_order` packed into one int that compares the same way (cheap in a heap).

    Valid for priority 0..9, due_ms 0..MAX_TIME_MS, seq 0..MAX_SEQ, index below MAX_DESTINATIONS.
    """
    return ((((MAX_PRIORITY - priority) << TIME_BITS | due_ms) << SEQ_BITS | seq) << INDEX_BITS) | index
