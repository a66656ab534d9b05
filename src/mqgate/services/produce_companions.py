"""The trace records of a plain produce written in its own group commit
(`MessageStore.append_many_with`): built once the messages' offsets are known and joined to the
project's open round group (tracing/rounds.py), which counts them once stored or buffers them
for a retry if the store refused them. A traced single-message produce joins its queue's run in
the round through its `QueueTracer` (tracing/rounds.py) instead of building a batch of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from mqgate.core.trace_policy import MatchedTrace
from mqgate.model import StoredMessage
from mqgate.registry.records import TopicRecord
from mqgate.store.interface import Companions
from mqgate.tracing.batch import BatchShape, TraceBatch
from mqgate.tracing.produce_batches import queue_batch
from mqgate.tracing.rounds import QueueTracer

if TYPE_CHECKING:
    from mqgate.services.tracing import Tracing


class ProduceCompanions:
    """`Tracing.companions`: the plain produce path's trace records (services/produce.py)."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def make(
        self,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        accepted_ms: int,
        traceparents: Mapping[int, str | None],
        tracers: Mapping[int, QueueTracer],
    ) -> Callable[[dict[int, int]], Companions]:
        """For `MessageStore.append_many_with`: the produce's trace records, made once its
        offsets are known.
        `traceparents`: per queue, the context all its messages carry where known (None: none
        stored, each message's is derived from its id);
        `tracers`: the trace of each traced queue (the others are not traced)."""
        if len(tracers) != 1:
            matches = {q: tracer.matched for q, tracer in tracers.items()}
            return self._request(topic, by_queue, accepted_ms, traceparents, matches)
        ((q, tracer),) = tracers.items()  # the common case, on every traced produce: one queue
        batch = by_queue[q]
        if len(batch) == 1:  # a single message joins its queue's run in the round
            return partial(tracer.join, batch[0])
        return self._queue(topic, q, batch, accepted_ms, traceparents.get(q), tracer.shape)

    def _queue(
        self,
        topic: TopicRecord,
        q: int,
        batch: list[StoredMessage],
        accepted_ms: int,
        context: str | None,
        shape: BatchShape,
    ) -> Callable[[dict[int, int]], Companions]:
        """One queue's messages: one batch."""
        tracing = self.tracing

        def one(firsts: dict[int, int]) -> Companions:
            found = queue_batch(tracing.origin(topic, accepted_ms), shape, q, batch, firsts[q], context)
            return tracing.recorder.join(found)

        return one

    def _request(
        self,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        accepted_ms: int,
        traceparents: Mapping[int, str | None],
        matches: Mapping[int, MatchedTrace],
    ) -> Callable[[dict[int, int]], Companions]:
        """Messages of several traced queues: one batch for the request where their ids allow
        it, else one per queue."""
        tracing = self.tracing

        def companions(firsts: dict[int, int]) -> Companions:
            whole = tracing.request_batch(topic, by_queue, firsts, accepted_ms, traceparents, matches)
            batches: list[TraceBatch] = []
            if whole is not None:
                batches.append(whole)
            else:
                for q, matched in matches.items():
                    found = tracing.produce_batch(
                        topic, q, by_queue[q], firsts[q], accepted_ms, traceparents.get(q), matched
                    )
                    if found is not None:
                        batches.append(found)
            return tracing.recorder.companions(batches)

        return companions
