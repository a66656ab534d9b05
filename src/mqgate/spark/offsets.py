"""Offset planning for the Spark source: pure functions, no I/O.

A Spark offset is a JSON object `{"<queue>": next_offset, ...}`. Spark compares offsets as
JSON strings, so every offset this module returns has its keys inserted in ascending numeric
order ("2" before "10"), whatever order it was given in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from mqgate.errors import BadRequest

EARLIEST: Final = "earliest"
LATEST: Final = "latest"
# In a JSON offsets option, as in Kafka's: -2 means the queue's oldest, -1 its newest offset.
EARLIEST_MARK: Final = -2
LATEST_MARK: Final = -1

Offsets = dict[int, int]  # store queue -> next offset to read


class OptionError(BadRequest):
    """A reader or writer option is missing or malformed; `field` names the option."""


class Bounds(msgspec.Struct, frozen=True):
    """One store queue: `min` the oldest stored offset, `max` the next offset to be written."""

    queue: int
    min: int
    max: int


class QueueRange(msgspec.Struct, frozen=True):
    """Offsets `start` (inclusive) to `end` (exclusive) of one store queue."""

    queue: int
    start: int
    end: int


def to_json(offsets: Mapping[int, int]) -> dict[str, int]:
    """The Spark form: string keys, inserted in ascending numeric order."""
    return {str(q): int(offsets[q]) for q in sorted(offsets)}


def from_json(value: Mapping[str, Any], option: str = "offset") -> Offsets:
    """Parse a Spark offset (or a JSON offsets option); errors name `option`."""
    if not isinstance(value, Mapping):
        raise OptionError(f"{option} must be a JSON object of queue -> offset", field=option)
    out: Offsets = {}
    for key, raw in value.items():
        try:
            queue = int(key)
        except (TypeError, ValueError):
            raise OptionError(f"{option}: queue {key!r} is not a number", field=option) from None
        if queue < 0 or str(queue) != str(key).strip():
            raise OptionError(f"{option}: queue {key!r} is not a queue number", field=option)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise OptionError(f"{option}: offset of queue {queue} must be an integer", field=option)
        if raw < EARLIEST_MARK:
            raise OptionError(
                f"{option}: offset of queue {queue} must be >= 0 (or -2 earliest, -1 latest)", field=option
            )
        out[queue] = raw
    return out


def parse_spec(text: str | None, option: str, default: str, allowed: tuple[str, ...]) -> str | Offsets:
    """`earliest` / `latest` (those in `allowed`) or a JSON object of queue -> offset."""
    spec = (text if text is not None else default).strip()
    if spec.lower() in allowed:
        return spec.lower()
    if spec.startswith("{"):
        try:
            parsed = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise OptionError(f"{option} is not valid JSON: {exc}", field=option) from None
        return from_json(parsed, option)
    words = " or ".join(repr(a) for a in allowed)
    raise OptionError(f"{option} must be {words} or a JSON object of queue -> offset", field=option)


def resolve(spec: str | Offsets, bounds: list[Bounds], option: str, missing: str) -> Offsets:
    """Concrete offsets for every queue in `bounds`. Queues a JSON spec does not name take
    `missing` (earliest or latest). A named queue must exist and lie within [0, max]; an
    offset below `min` (retention removed it) means `min`."""
    by_queue = {b.queue: b for b in bounds}
    if isinstance(spec, str):
        return {b.queue: b.min if spec == EARLIEST else b.max for b in bounds}
    for queue, offset in spec.items():
        b = by_queue.get(queue)
        if b is None:
            raise OptionError(
                f"{option}: queue {queue} does not exist (the topic has {len(bounds)} queues)", field=option
            )
        if offset > b.max:
            raise OptionError(
                f"{option}: offset {offset} of queue {queue} is beyond its end {b.max}", field=option
            )
    out: Offsets = {}
    for b in bounds:
        offset = spec.get(b.queue, EARLIEST_MARK if missing == EARLIEST else LATEST_MARK)
        if offset == EARLIEST_MARK:
            offset = b.min
        elif offset == LATEST_MARK:
            offset = b.max
        out[b.queue] = max(offset, b.min)
    return out


def ranges(start: Mapping[int, int], end: Mapping[int, int]) -> list[QueueRange]:
    """The non-empty per-queue ranges between two offsets, by queue. A queue missing from
    `start` (the topic grew) starts at 0: reads begin at the queue's oldest stored offset."""
    return [QueueRange(q, start.get(q, 0), end[q]) for q in sorted(end) if end[q] > start.get(q, 0)]


def check_ordered(start: Mapping[int, int], end: Mapping[int, int], option: str) -> None:
    for q, e in end.items():
        s = start.get(q, 0)
        if e < s:
            raise OptionError(
                f"{option}: offset {e} of queue {q} is before the starting offset {s}", field=option
            )


def advance(
    start: Mapping[int, int], bounds: list[Bounds], limit: int | None, cap: Mapping[int, int] | None = None
) -> Offsets:
    """The end offset of the next micro-batch from `start`: everything up to each queue's
    max (or `cap`, the Trigger.AvailableNow target), at most `limit` messages in all.

    The limit is shared in proportion to each queue's backlog (largest remainders get the
    leftover units, ties to the lower queue), so a batch holds exactly min(limit, backlog)
    messages and no queue with backlog is starved for ever. A queue never goes backwards.
    """
    first: Offsets = {}
    last: Offsets = {}
    for b in bounds:
        begin = start.get(b.queue, 0)
        effective = max(begin, b.min)  # below min the records are gone: nothing to count
        top = b.max if cap is None else min(b.max, cap.get(b.queue, b.max))
        first[b.queue] = effective
        last[b.queue] = max(effective, top)
    for q, offset in start.items():  # a queue we no longer see (cannot happen: topics only grow)
        first.setdefault(q, offset)
        last.setdefault(q, offset)
    backlog = {q: last[q] - first[q] for q in first}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return {q: max(last[q], start.get(q, 0)) for q in sorted(last)}
    shares = {q: limit * n // total for q, n in backlog.items()}
    leftover = limit - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda q: (-(limit * backlog[q] % total), q))
    for q in by_remainder:
        if leftover == 0:
            break
        if shares[q] < backlog[q]:
            shares[q] += 1
            leftover -= 1
    return {q: max(first[q] + shares[q], start.get(q, 0)) for q in sorted(first)}


def end_offsets(pairs: list[tuple[int, int]]) -> Offsets:
    """{queue: max(offset) + 1} of (queue, offset) pairs: what a consumer commits."""
    out: Offsets = {}
    for queue, offset in pairs:
        if offset + 1 > out.get(queue, -1):
            out[queue] = offset + 1
    return out
