"""A group-commit round's trace records (tracing.recorder): the produce batches every traced
produce of one round adds to its project's open `RoundGroup`, written by the store as one
`TraceRound` record (or a few, past `ROUND_ITEMS`) when it writes the round, and how any trace
record is wrapped as a stored message of the trace topic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from mqgate.core.ids import new_message_id
from mqgate.errors import MqgateError
from mqgate.model import StoredMessage
from mqgate.store.interface import Companions, Encoded
from mqgate.tracing.batch import TraceBatch, TraceRound, batch_shape, encode_batch
from mqgate.tracing.events import Resource, TraceEvent, encode_event
from mqgate.tracing.policy import MatchedTrace
from mqgate.tracing.produce_batches import SINGLE_RUN_MAX, RunOrigin, SingleRun

TRACE_PRODUCER: Final = "%trace"  # the producer name of trace messages in the store
# Items per round record, a batch weighing one plus its listed ids and bodies:
# a record stays well under a megabyte with bodies kept at 4 KiB, while batches that name their
# ids as a run and keep content by reference (a few hundred bytes each) share one record.
ROUND_ITEMS: Final = 200
_encode_message = msgspec.json.Encoder().encode


def encode_for_store(event: TraceEvent | TraceBatch | TraceRound, now_ms: int) -> bytes:
    """The stored message carrying `event`: its JSON as the body, the traced message's id as
    the key (a Spark job can filter on it), the hop as the tag; a batch is tagged `batch`, a
    round `round`."""
    if isinstance(event, (TraceBatch, TraceRound)):
        body, keys, tags = encode_batch(event).decode(), [], [str(event.kind)]
    else:
        body, keys, tags = encode_event(event).decode(), [event.msg_id], [str(event.hop)]
    message = StoredMessage(new_message_id(now_ms), now_ms, TRACE_PRODUCER, body, keys, tags, {})
    return _encode_message(message)


# How a round group's records fared (`RoundGroup.written`): its batches and the store's error
# (None: stored). The recorder counts them, or buffers them for a retry.
OnWritten = Callable[[list[TraceBatch], MqgateError | None], None]


class RoundGroup:
    """The produce batches of one group-commit round for one trace topic and queue, written as
    `TraceRound` records of at most `ROUND_ITEMS` items each (a `CompanionGroup`). Traced
    single-message produces join a `SingleRun` instead (`open_run`, `QueueTracer`). The
    group answers for its batches once the store tried to write them (`written`): not each
    produce that joined it."""

    __slots__ = (
        "_batches",
        "_clock_ms",
        "_on_written",
        "_sealed",
        "is_sealed",
        "queue",
        "records",
        "topic",
    )

    def __init__(
        self,
        clock_ms: Callable[[], int],
        topic: str = "",
        queue: int = 0,
        on_written: OnWritten | None = None,
    ) -> None:
        self._batches: list[TraceBatch | SingleRun] = []
        self._sealed: list[TraceBatch] | None = None  # sealed, until `written`
        self._clock_ms = clock_ms
        self._on_written = on_written
        self.is_sealed = False
        self.topic = topic
        self.queue = queue
        self.records: Companions = {topic: {queue: [self]}}  # the companions naming this group

    def add(self, batch: TraceBatch) -> None:
        if self.is_sealed:
            raise RuntimeError("a sealed round takes no more batches")
        self._batches.append(batch)

    def open_run(self, origin: RunOrigin, offset: int) -> SingleRun:
        """A new run of single produces from `offset` (tracing.rounds.QueueTracer.join)."""
        if self.is_sealed:
            raise RuntimeError("a sealed round takes no more batches")
        run = SingleRun(origin, offset)
        self._batches.append(run)
        return run

    def seal(self) -> list[Encoded]:
        if self.is_sealed:
            return []
        self.is_sealed = True
        items, self._batches = self._batches, []  # the recorder keeps the sealed group a while
        now = self._clock_ms()
        batches = self._sealed = [b.batch(now) if isinstance(b, SingleRun) else b for b in items]
        out: list[Encoded] = []
        chunk: list[TraceBatch] = []
        held = 0
        for batch in batches:
            weight = 1 + len(batch.msg_ids) + len(batch.bodies)  # see ROUND_ITEMS
            if chunk and held + weight > ROUND_ITEMS:
                out.append((now, encode_for_store(_round_of(chunk), now)))
                chunk, held = [], 0
            chunk.append(batch)
            held += weight
        if chunk:
            out.append((now, encode_for_store(_round_of(chunk), now)))
        return out

    def written(self, error: MqgateError | None) -> None:
        batches, self._sealed = self._sealed, None
        if batches and self._on_written is not None:
            self._on_written(batches, error)


# The open round group of a project's trace topic for a message id (TraceRecorder.open_group).
OpenGroup = Callable[[str, str], RoundGroup]


class QueueTracer:
    """The traced single-message produces of one producer to one queue of a topic, under the
    policies in force (tracing/service.py keeps one per producer and queue until they change):
    what their trace records share (a `RunOrigin`), and the run a produce joins (`join`). A
    produce continues the open run when its offset follows it in the same round; else it opens
    another in its project's open round group."""

    __slots__ = (
        "_open_group",
        "_records",
        "_run",
        "body_max_bytes",
        "matched",
        "producer",
        "project",
        "queue",
        "resource",
        "shape",
        "topic",
    )

    def __init__(
        self,
        project: str,
        topic: str,
        queue: int,
        producer: str,
        matched: MatchedTrace,
        resource: Resource,
        body_max_bytes: int,
        open_group: OpenGroup,
    ) -> None:
        self.project = project
        self.topic = topic
        self.queue = queue
        self.producer = producer
        self.matched = matched
        self.shape = batch_shape(matched.modes, matched.level)
        self.resource = resource
        self.body_max_bytes = body_max_bytes
        self._open_group = open_group
        self._run: SingleRun | None = None
        self._records: Companions = {}  # those of the open run's round group

    def join(self, message: StoredMessage, firsts: dict[int, int]) -> Companions:
        """For `MessageStore.append_many_with` (bound to the message with functools.partial):
        the produce of `message`, stored at `firsts[queue]`, joins its run; the companions
        naming the run's round group. A run sealed or full takes no offset (`next_offset` -1)."""
        offset = firsts[self.queue]
        run = self._run
        if run is None or offset != run.next_offset:
            group = self._open_group(self.project, message.msg_id)
            run = self._run = group.open_run(self, offset)
            self._records = group.records
        messages = run.messages
        messages.append(message)
        run.next_offset = offset + 1 if len(messages) < SINGLE_RUN_MAX else -1
        return self._records


def _round_of(batches: list[TraceBatch]) -> TraceBatch | TraceRound:
    return batches[0] if len(batches) == 1 else TraceRound(kind="round", batches=batches)
