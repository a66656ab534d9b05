"""The produce hops of many traced messages in one trace record. Pure: no IO.

A traced produce used to store two events per message (accepted, stored), each a record in
the trace topic, each indexed on its own: seven times the work of the produce itself. The
messages of one request that land in one queue share everything but their id, keys, trace
context and body, so one `TraceBatch` holds them: one record to encode, append and index
per request and queue. `expand` gives back exactly the events the per-message form held, so
a path query, the analytics job and any reader of the trace topic see the same hops.

A batch's JSON starts with `{"kind":"batch"` (msgspec encodes fields in order, and `kind` has
no default), which tells it from an event without decoding it.

The batches of every produce that one group-commit round makes durable go further, into one
`TraceRound` record (`{"kind":"round","batches":[…]}`): one record to frame, write, read and
index per round and trace topic, however many requests the round carried (a traced single
message produce otherwise pays for a whole record of its own). Within a round, the
single-message produces to one queue at consecutive offsets are one batch listing their ids
and each one's accepted time (`times_ms`), not a batch each: ~50 bytes a message instead of
~350.
"""

from __future__ import annotations

import functools
import operator
from typing import Final, Literal, NamedTuple

import msgspec

from mqgate.core.ids import id_run, in_id_run, is_valid_run
from mqgate.tracing.events import Hop, LevelName, Resource, TraceEvent, decode_event
from mqgate.tracing.policy import CONTENT_REF, Level, Mode, cut_body, kept_fields

BATCH_PREFIX: Final = b'{"kind":"batch"'
ROUND_PREFIX: Final = b'{"kind":"round"'


class QueueRun(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """`count` consecutive ids from `first_id`, stored in `queue` from `first_offset` (either
    None where the policy keeps neither): one queue's part of a produce request."""

    first_id: str
    count: int
    queue: int | None = None
    first_offset: int | None = None


_RUN_COUNT: Final = operator.attrgetter("count")  # a QueueRun's, read in C


class TraceBatch(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """`hops` of the messages `msg_ids` (or the run of `count` ids from `first_id`), in offset
    order from `first_offset`, of one queue.
    The first hop happened at `time_ms`, the others at `last_ms`; the first of several hops
    has no offset yet (a produce is accepted before it is stored). Lists a policy does not
    keep are empty: `bodies` too when the content is kept by reference (`content_ref`). A
    trace context the messages share (one request's) is `traceparent`, once; `traceparents`
    holds one per message only when they differ."""

    kind: Literal["batch"]
    hops: list[Hop]
    time_ms: int
    last_ms: int
    project: str
    topic: str
    resource: Resource
    msg_ids: list[str] = msgspec.field(default_factory=list)
    # Or, for consecutive ids (one request's in one queue, core.ids.ids_by_queue), the first
    # and how many: a record of 100 messages then names them in 50 bytes instead of 3,000.
    first_id: str | None = None
    count: int = 0
    level: LevelName = "info"
    queue: int | None = None
    first_offset: int | None = None
    producer: str | None = None
    keys: list[list[str]] = msgspec.field(default_factory=list)
    traceparents: list[str | None] = msgspec.field(default_factory=list)
    traceparent: str | None = None
    bodies: list[str | None] = msgspec.field(default_factory=list)
    # The content kept by reference: the stored messages from `first_offset` in `queue`.
    content_ref: bool = False
    # Or, for a request over several queues, each queue's run (then no msgIds, firstId, queue
    # or firstOffset): one record for the request instead of one per queue. Per-message lists
    # follow the parts' order.
    parts: list[QueueRun] = msgspec.field(default_factory=list)
    # The first hop's time of each message where they differ: the single-message produces of
    # one round to one queue, listed in one batch (tracing.produce_batches.SingleRun); then
    # `time_ms` is the earliest.
    times_ms: list[int] = msgspec.field(default_factory=list)

    @property
    def message_count(self) -> int:
        if self.parts:
            return sum(map(_RUN_COUNT, self.parts))
        return len(self.msg_ids) or self.count

    @property
    def event_count(self) -> int:
        return self.message_count * len(self.hops)

    def segments(self) -> list[tuple[int | None, int | None, list[str]]]:
        """(queue, first offset, ids) of each queue the batch holds messages of."""
        if self.parts:
            return [(p.queue, p.first_offset, id_run(p.first_id, p.count)) for p in self.parts]
        return [(self.queue, self.first_offset, self.ids)]

    def runs(self) -> list[tuple[str, int]]:
        """(first id, count) of each run, or [] when the ids are listed."""
        if self.parts:
            return [(p.first_id, p.count) for p in self.parts]
        return [] if self.first_id is None else [(self.first_id, self.count)]

    @property
    def ids(self) -> list[str]:
        """The messages' ids, in offset order, however the record names them."""
        if self.parts:
            return [m for _, _, ids in self.segments() for m in ids]
        if self.first_id is None:
            return self.msg_ids
        return id_run(self.first_id, self.count)

    @property
    def first_msg_id(self) -> str:
        if self.parts:
            return self.parts[0].first_id
        return self.first_id if self.first_id is not None else self.msg_ids[0]

    def holds(self, msg_id: str) -> bool:
        runs = self.runs()
        if not runs:
            return msg_id in self.msg_ids
        return any(in_id_run(msg_id, first, count) for first, count in runs)


class BatchShape(NamedTuple):
    """What a produce batch of one matched trace keeps, looked up once per match (the services
    build it from the kept fields of core.trace_policy) instead of field by field per batch."""

    level: LevelName
    queue: bool
    offset: bool
    producer: bool
    body: bool
    content_ref: bool

    @classmethod
    def of(cls, kept: frozenset[str], level: LevelName) -> BatchShape:
        return cls(
            level, "queue" in kept, "offset" in kept, "producer" in kept, "body" in kept, CONTENT_REF in kept
        )


@functools.cache  # per traced produce; modes x levels is a few dozen entries
def batch_shape(modes: frozenset[Mode], level: Level) -> BatchShape:
    """The `BatchShape` of a trace of `modes` at `level` (core.trace_policy.kept_fields)."""
    label: LevelName = level.label  # type: ignore[assignment]
    return BatchShape.of(kept_fields(modes, level), label)


class TraceRound(msgspec.Struct, frozen=True):
    """The batches of the produces one group-commit round wrote (see the module's doc)."""

    kind: Literal["round"]
    batches: list[TraceBatch]

    @property
    def event_count(self) -> int:
        return sum(b.event_count for b in self.batches)


_encoder: Final = msgspec.json.Encoder()
_batch_decoder: Final = msgspec.json.Decoder(TraceBatch)
_round_decoder: Final = msgspec.json.Decoder(TraceRound)


def encode_batch(batch: TraceBatch | TraceRound) -> bytes:
    return _encoder.encode(batch)


def _starts(raw: bytes | str, prefix: bytes) -> bool:
    head = raw[: len(prefix)]
    return (head if isinstance(head, bytes) else head.encode()) == prefix


def is_batch(raw: bytes | str) -> bool:
    return _starts(raw, BATCH_PREFIX)


def is_round(raw: bytes | str) -> bool:
    return _starts(raw, ROUND_PREFIX)


def decode_batch(raw: bytes | str) -> TraceBatch:
    """Raises msgspec.ValidationError or msgspec.DecodeError on a malformed batch (also one
    whose per-message lists do not match its ids)."""
    return _checked(_batch_decoder.decode(raw))


def decode_round(raw: bytes | str) -> TraceRound:
    """Raises as `decode_batch` does, also for a round without batches."""
    found = _round_decoder.decode(raw)
    if not found.batches:
        raise msgspec.ValidationError("a trace round needs batches")
    for batch in found.batches:
        _checked(batch)
    return found


def _checked(batch: TraceBatch) -> TraceBatch:
    # One pass, no generators: the trace index writer checks every batch it decodes.
    parts = batch.parts
    if parts:
        named = batch.msg_ids or batch.first_id is not None or batch.count
        if named or batch.queue is not None or batch.first_offset is not None:
            raise msgspec.ValidationError(
                "a trace batch's parts stand for msgIds, firstId, queue, firstOffset"
            )
        n = 0
        for part in parts:
            if not is_valid_run(part.first_id, part.count):
                raise msgspec.ValidationError(
                    "a trace batch's part needs a count of ids its firstId can hold"
                )
            n += part.count
    elif batch.first_id is not None:
        if batch.msg_ids or not is_valid_run(batch.first_id, batch.count):
            raise msgspec.ValidationError(
                "a trace batch's firstId needs a count of ids it can hold, no msgIds"
            )
        n = batch.count
    elif batch.count:
        raise msgspec.ValidationError("a trace batch's count goes with a firstId")
    else:
        n = len(batch.msg_ids)
    if n == 0 or not batch.hops:
        raise msgspec.ValidationError("a trace batch needs msgIds (or firstId and count) and hops")
    for name, items in (
        ("keys", batch.keys),
        ("traceparents", batch.traceparents),
        ("bodies", batch.bodies),
        ("timesMs", batch.times_ms),
    ):
        if items and len(items) != n:
            raise msgspec.ValidationError(f"a trace batch's {name} must have one item per message id")
    return batch


def decode_record(raw: bytes | str) -> TraceEvent | TraceBatch | TraceRound:
    """A trace topic record's body: one event, a batch or a round of batches."""
    if is_batch(raw):
        return decode_batch(raw)
    return decode_round(raw) if is_round(raw) else decode_event(raw)


def batches_of(record: TraceBatch | TraceRound) -> list[TraceBatch]:
    return record.batches if isinstance(record, TraceRound) else [record]


def shared_or_each(values: list[str | None]) -> tuple[str | None, list[str | None]]:
    """(the value every item has, []) or (None, the items): `traceparent` or `traceparents`."""
    first = values[0] if values else None
    if all(v == first for v in values):
        return first, []
    return None, values


def cut_bodies(bodies: list[str], max_bytes: int) -> list[str | None]:
    if max(map(len, bodies), default=0) * 4 <= max_bytes:
        return list(bodies)  # none can be over: a character is at most 4 bytes
    return [cut_body(b, max_bytes) for b in bodies]


def expand(batch: TraceBatch, only: str | None = None) -> list[TraceEvent]:
    """The events the batch stands for, in message then hop order; `only`: of that message."""
    out: list[TraceEvent] = []
    several = len(batch.hops) > 1
    for i, (msg_id, queue, offset) in enumerate(_placed(batch)):
        if only is not None and msg_id != only:
            continue
        for h, hop in enumerate(batch.hops):
            first = h == 0
            at = None if first and several else offset
            out.append(
                TraceEvent(
                    msg_id=msg_id,
                    hop=hop,
                    time_ms=(batch.times_ms[i] if batch.times_ms else batch.time_ms)
                    if first
                    else batch.last_ms,
                    project=batch.project,
                    topic=batch.topic,
                    resource=batch.resource,
                    level=batch.level,
                    keys=batch.keys[i] if batch.keys else [],
                    queue=queue,
                    offset=at,
                    producer=batch.producer,
                    body=batch.bodies[i] if batch.bodies else None,
                    content_ref=batch.content_ref and at is not None and queue is not None,
                    traceparent=batch.traceparents[i] if batch.traceparents else batch.traceparent,
                )
            )
    return out


def _placed(batch: TraceBatch) -> list[tuple[str, int | None, int | None]]:
    """(id, queue, offset) of each message, in the order of the batch's per-message lists."""
    out: list[tuple[str, int | None, int | None]] = []
    for queue, first_offset, ids in batch.segments():
        for j, msg_id in enumerate(ids):
            out.append((msg_id, queue, None if first_offset is None else first_offset + j))
    return out
