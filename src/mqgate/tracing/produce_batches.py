"""A produce's trace record (tracing.batch.TraceBatch) built from its stored messages. Pure:
no IO. One queue's messages as one batch (`queue_batch`), or a request over several queues as
one batch of per-queue runs of ids (`request_batch`): one record to build, encode, write, read
and index per request instead of one per queue. Single-message produces of one round to one
queue join one batch (`SingleRun`): a traced single produce appends its message to a list
instead of building a record."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Final, NamedTuple, Protocol

from mqgate.core.ids import is_id_run
from mqgate.core.trace_context import TRACEPARENT
from mqgate.model import StoredMessage
from mqgate.tracing.batch import BatchShape, QueueRun, TraceBatch, cut_bodies, shared_or_each
from mqgate.tracing.events import Hop, Resource

PRODUCE_HOPS: Final[tuple[Hop, ...]] = ("accepted", "stored")
_HOP_LIST: Final[list[Hop]] = list(PRODUCE_HOPS)  # one list the batches share (none changes it)
# Messages a `SingleRun` lists at most: its batch then weighs at most half a round record
# (tracing.rounds.ROUND_ITEMS).
SINGLE_RUN_MAX: Final = 100


class Origin(NamedTuple):
    """What every batch of one produce shares (a tuple: one is made per traced request)."""

    project: str
    topic: str
    resource: Resource
    accepted_ms: int
    stored_ms: int
    body_max_bytes: int


def queue_batch(
    origin: Origin,
    shape: BatchShape,
    queue: int,
    batch: Sequence[StoredMessage],
    first_offset: int,
    traceparent: str | None,
    times_ms: list[int] | None = None,
) -> TraceBatch:
    """`batch`: one queue's messages in the order of their ids (core.ids.ids_by_queue), so ids
    whose first and last span exactly `len(batch)` counters are that run. `traceparent`: the
    context every message carries, when known; else each message's is read (none when no
    message has properties: each one's is then derived from its id). `times_ms`: each
    message's accepted time where they differ (`SingleRun`)."""
    head, n = batch[0], len(batch)
    traceparents: list[str | None] = []
    if traceparent is None and any(map(_properties, batch)):
        traceparent, traceparents = shared_or_each([m.properties.get(TRACEPARENT) for m in batch])
    if n == 1:
        keys = [head.keys] if head.keys else []
        ids, first_id = [head.msg_id], None  # a single id is listed
    else:
        keys = list(map(_keys, batch))
        if not any(keys):
            keys = []
        run = is_id_run(head.msg_id, batch[-1].msg_id, n)
        ids, first_id = ([], head.msg_id) if run else (list(map(_msg_id, batch)), None)
    # Positional, in TraceBatch's field order: every traced produce builds one.
    return TraceBatch(
        "batch",
        _HOP_LIST,
        origin.accepted_ms,
        origin.stored_ms,
        origin.project,
        origin.topic,
        origin.resource,
        ids,
        first_id,
        n if first_id is not None else 0,
        shape.level,
        queue if shape.queue else None,
        first_offset if shape.offset else None,
        head.producer if shape.producer else None,
        keys,
        traceparents,
        traceparent,
        cut_bodies(list(map(_body, batch)), origin.body_max_bytes) if shape.body else [],
        shape.content_ref,
        [],
        times_ms or [],
    )


def request_batch(
    origin: Origin,
    shape: BatchShape,
    queues: Sequence[tuple[int, Sequence[StoredMessage], int]],
    traceparent: str | None,
) -> TraceBatch | None:
    """The messages of `queues` (queue, its messages, its first offset), all carrying
    `traceparent` (None: none, each message's is derived from its id), as one batch; None when
    a queue's ids are not a run."""
    parts: list[QueueRun] = []
    messages: list[StoredMessage] = []
    for q, batch, first_offset in queues:
        head, n = batch[0], len(batch)
        if not is_id_run(head.msg_id, batch[-1].msg_id, n):
            return None
        parts.append(
            QueueRun(head.msg_id, n, q if shape.queue else None, first_offset if shape.offset else None)
        )
        messages += batch
    keys = list(map(_keys, messages))
    bodies = list(map(_body, messages)) if shape.body else []
    return _batch(
        origin,
        shape,
        producer=queues[0][1][0].producer if shape.producer else None,
        keys=keys if any(keys) else [],
        traceparent=traceparent,
        bodies=cut_bodies(bodies, origin.body_max_bytes) if bodies else [],
        parts=parts,
    )


def _batch(origin: Origin, shape: BatchShape, **fields: Any) -> TraceBatch:
    return TraceBatch(
        kind="batch",
        hops=_HOP_LIST,
        time_ms=origin.accepted_ms,
        last_ms=origin.stored_ms,
        project=origin.project,
        topic=origin.topic,
        resource=origin.resource,
        level=shape.level,
        content_ref=shape.content_ref,
        **fields,
    )


class RunOrigin(Protocol):
    """What the runs of one producer's single produces to one queue share
    (tracing.rounds.QueueTracer)."""

    project: str
    topic: str
    queue: int
    producer: str
    shape: BatchShape
    resource: Resource
    body_max_bytes: int


class SingleRun:
    """Single-message produces of one group-commit round to one queue of a topic, at
    consecutive offsets, of one producer and one kept shape (one `RunOrigin`): one `TraceBatch`
    listing their ids with each one's accepted time, built when the round is sealed. The
    produce hops' second time (`last_ms`, stored) is then the round's: when the write that makes
    them durable began. A produce only appends its message (tracing.rounds.QueueTracer.join):
    what the batch lists is read from the messages at seal time (id, keys, body; the accepted
    time is the message's timestamp, the trace context its `traceparent` property, if any:
    none, it is derived from its id)."""

    __slots__ = ("messages", "next_offset", "offset", "origin")

    def __init__(self, origin: RunOrigin, offset: int) -> None:
        self.origin = origin
        self.offset = offset
        self.next_offset = offset
        self.messages: list[StoredMessage] = []  # in offset order

    def batch(self, stored_ms: int) -> TraceBatch:
        """The run as one queue's batch, each message's accepted time its timestamp. The
        messages are let go: the run's tracer may keep the run until its next produce."""
        run, messages = self.origin, self.messages
        self.messages, self.next_offset = [], -1  # sealed: a produce opens another run
        times = list(map(_timestamp, messages))  # C-level per message: a round holds hundreds
        first, last = min(times), max(times)
        origin = Origin(run.project, run.topic, run.resource, first, max(stored_ms, last), run.body_max_bytes)
        return queue_batch(
            origin, run.shape, run.queue, messages, self.offset, None, times if first != last else None
        )


_msg_id: Final = attrgetter("msg_id")
_timestamp: Final = attrgetter("timestamp_ms")
_keys: Final = attrgetter("keys")
_body: Final = attrgetter("body")
_properties: Final = attrgetter("properties")
