"""Unique, time-sortable message ids: 48-bit ms timestamp, 32-bit process tag, 48-bit counter."""

from __future__ import annotations

import itertools
import secrets
import time
from typing import Final

_PROCESS_TAG: Final = secrets.randbits(32)
_counter = itertools.count(secrets.randbits(24))


def new_message_id(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{ms:012x}{_PROCESS_TAG:08x}{next(_counter) & 0xFFFFFFFFFFFF:012x}"


def message_id_time_ms(msg_id: str) -> int:
    return int(msg_id[:12], 16)


def new_message_ids(now_ms: int, count: int) -> list[str]:
    """`count` ids for one batch: the time prefix is formatted once."""
    prefix = f"{now_ms:012x}{_PROCESS_TAG:08x}"
    return [f"{prefix}{next(_counter) & 0xFFFFFFFFFFFF:012x}" for _ in range(count)]


def lowest_id_like(msg_id: str) -> str:
    """The lowest id of the same millisecond and process as `msg_id` (its counter at zero): the
    start of a range holding every id one request of that process took in that millisecond."""
    return msg_id[:20].ljust(len(msg_id), "0")
