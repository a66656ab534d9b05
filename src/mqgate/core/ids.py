"""Unique, time-sortable message ids: 48-bit ms timestamp, 32-bit process tag, 48-bit counter."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Final

_PROCESS_TAG: Final = secrets.randbits(32)
_next_counter = secrets.randbits(24)
_counter_lock: Final = threading.Lock()  # a batch's counters are taken as one block
ID_PREFIX_CHARS: Final = 20  # time and process tag; the counter follows
_ID_CHARS: Final = 32
_COUNTER_MAX: Final = 0xFFFFFFFFFFFF


def _take_counters(count: int) -> int:
    """The first of `count` consecutive counters no other call of this process gets."""
    global _next_counter
    with _counter_lock:
        first = _next_counter
        _next_counter = first + count
    return first & _COUNTER_MAX


def new_message_id(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{ms:012x}{_PROCESS_TAG:08x}{_take_counters(1):012x}"


def message_id_time_ms(msg_id: str) -> int:
    return int(msg_id[:12], 16)


def new_message_ids(now_ms: int, count: int) -> list[str]:
    """`count` ids for one batch: the time prefix is formatted once."""
    first = _take_counters(count)
    template = f"{now_ms:012x}{_PROCESS_TAG:08x}%012x"  # one formatting per id, from a range
    if first + count <= _COUNTER_MAX + 1:
        return [template % n for n in range(first, first + count)]
    return [template % (n & _COUNTER_MAX) for n in range(first, first + count)]  # the counter wraps


def lowest_id_like(msg_id: str) -> str:
    """The lowest id of the same millisecond and process as `msg_id` (its counter at zero): the
    start of a range holding every id one request of that process took in that millisecond."""
    return msg_id[:ID_PREFIX_CHARS].ljust(len(msg_id), "0")


def ids_by_queue(now_ms: int, queues: list[int]) -> list[str]:
    """One id per message (`queues`: each message's queue), each queue's ids consecutive in
    message order, so a trace record can name a queue's messages by its first id and their
    count (`id_run`) instead of listing them."""
    ids = new_message_ids(now_ms, len(queues))
    first = queues[0] if queues else 0
    if all(q == first for q in queues):
        return ids
    # Hand the consecutive ids out a block per queue, in the order queues first appear.
    counts: dict[int, int] = {}
    for q in queues:
        counts[q] = counts.get(q, 0) + 1
    at: dict[int, int] = {}
    n = 0
    for q, c in counts.items():
        at[q] = n
        n += c
    out = []
    for q in queues:
        i = at[q]
        out.append(ids[i])
        at[q] = i + 1
    return out


def is_id_run(first: str, last: str, count: int) -> bool:
    """Whether `count` ids from `first` to `last` can be a run of consecutive ids: the same
    millisecond and process, and counters `count - 1` apart without wrapping."""
    if len(first) != _ID_CHARS or len(last) != _ID_CHARS or first[:ID_PREFIX_CHARS] != last[:ID_PREFIX_CHARS]:
        return False
    try:
        return int(last[ID_PREFIX_CHARS:], 16) - int(first[ID_PREFIX_CHARS:], 16) == count - 1
    except ValueError:
        return False


def id_run(first: str, count: int) -> list[str]:
    """The `count` consecutive ids from `first` (as `new_message_ids` gave them)."""
    prefix, start = first[:ID_PREFIX_CHARS], int(first[ID_PREFIX_CHARS:], 16)
    return [f"{prefix}{n:012x}" for n in range(start, start + count)]


def id_from(prefix: str, counter: int) -> str:
    """The id of `counter` under `prefix` (an id's first `ID_PREFIX_CHARS`)."""
    return f"{prefix}{counter:012x}"


def id_at(first: str, i: int) -> str:
    """The id `i` after `first` in a run."""
    return id_from(first[:ID_PREFIX_CHARS], int(first[ID_PREFIX_CHARS:], 16) + i)


def in_id_run(msg_id: str, first: str, count: int) -> bool:
    if len(msg_id) != _ID_CHARS or msg_id[:ID_PREFIX_CHARS] != first[:ID_PREFIX_CHARS]:
        return False
    try:
        return 0 <= int(msg_id[ID_PREFIX_CHARS:], 16) - int(first[ID_PREFIX_CHARS:], 16) < count
    except ValueError:
        return False


def is_valid_run(first: str, count: int) -> bool:
    """Whether `first` is an id and `count` ids from it stay within its counter."""
    if count < 1 or len(first) != _ID_CHARS:
        return False
    try:
        int(first[:ID_PREFIX_CHARS], 16)
        return int(first[ID_PREFIX_CHARS:], 16) + count - 1 <= _COUNTER_MAX
    except ValueError:
        return False
