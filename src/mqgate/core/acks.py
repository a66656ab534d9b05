"""SPEC G5: when an ack, release or extend is valid."""

from __future__ import annotations

from typing import Final, Literal

from mqgate.core.queue_choice import lock_is_held

LOCK_EXPIRED: Final = "lock_expired"
LOCK_TAKEN: Final = "lock_taken"
OFFSET_MOVED: Final = "offset_moved"
ALREADY_ACKED: Final = "already_acked"

AckRefusal = Literal["lock_expired", "lock_taken", "offset_moved", "already_acked"]


def ack_refusal(
    *,
    stored_committed: int,
    stored_lock_ts: int,
    stored_lock_deadline_ms: int,
    token_offset: int,
    token_lock_ts: int,
    now_ms: int,
    stored_acked_lock_ts: int = 0,
) -> AckRefusal | None:
    """None if the batch named by the token may be committed now, else why not.

    Valid only while the stored lock is the token's lock, still held, and the committed offset
    is still where the batch started. A token whose lock is the one the queue's last commit
    held was committed already (a retried ack): that is its own answer, not a lost lock.
    """
    if token_lock_ts != 0 and token_lock_ts == stored_acked_lock_ts:
        return ALREADY_ACKED
    if stored_committed != token_offset:
        return OFFSET_MOVED
    if stored_lock_ts == token_lock_ts:
        if lock_is_held(stored_lock_ts, stored_lock_deadline_ms, now_ms):
            return None
        return LOCK_EXPIRED
    if stored_lock_ts == 0 or not lock_is_held(stored_lock_ts, stored_lock_deadline_ms, now_ms):
        return LOCK_EXPIRED
    return LOCK_TAKEN
