"""The trace records of a plain produce written in its own group commit
(`MessageStore.append_many_with`): built once the messages' offsets are known, joined to the
project's open round group (tracing/rounds.py) and counted, or buffered for a retry when the
store refused them. A traced single-message produce joins its queue's run in the round
(tracing.produce_batches.SingleRun) instead of building a batch of its own."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from mqgate.core.trace_policy import MatchedTrace
from mqgate.errors import MqgateError
from mqgate.model import StoredMessage
from mqgate.registry.records import TopicRecord
from mqgate.store.interface import Companions
from mqgate.tracing.batch import BatchShape, TraceBatch, batch_shape
from mqgate.tracing.produce_batches import PRODUCE_HOPS, queue_batch

if TYPE_CHECKING:
    from mqgate.services.tracing import Tracing

log = logging.getLogger(__name__)


class SingleProduce(NamedTuple):
    """A traced single-message produce that joined its round's run (RoundGroup.add_single):
    what `ProduceCompanions.written` counts, or builds a batch of for a retry when the store refused
    the round's records."""

    topic: TopicRecord
    queue: int
    batch: Sequence[StoredMessage]
    offset: int
    accepted_ms: int
    context: str | None
    shape: BatchShape

    @property
    def event_count(self) -> int:
        return len(PRODUCE_HOPS)


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
        matches: Mapping[int, MatchedTrace],
    ) -> tuple[Callable[[dict[int, int]], Companions], list[TraceBatch | SingleProduce]]:
        """For `MessageStore.append_many_with`: the produce's trace records, made once its
        offsets are known, and the list they are kept in for `written`.
        `traceparents`: per queue, the context all its messages carry where known (None: none
        stored, each message's is derived from its id);
        `matches`: the trace of each traced queue (the others are not traced)."""
        made: list[TraceBatch | SingleProduce] = []
        if len(matches) == 1:  # the common case, on every traced produce: one queue traced
            ((q, matched),) = matches.items()
            batch, context = by_queue[q], traceparents.get(q)
            shape = batch_shape(matched.modes, matched.level)
            tracing = self.tracing
            recorder = tracing.recorder
            if len(batch) == 1:  # a single message joins its queue's run in the round
                message, resource = batch[0], tracing.resource
                body_max_bytes = tracing.ctx.settings.trace_body_max_bytes

                def single(firsts: dict[int, int]) -> Companions:
                    offset = firsts[q]
                    made.append(SingleProduce(topic, q, batch, offset, accepted_ms, context, shape))
                    group = recorder.open_group(topic.project, message.msg_id)
                    group.add_single(
                        topic.project,
                        topic.name,
                        q,
                        shape,
                        message,
                        offset,
                        accepted_ms,
                        context,
                        resource,
                        body_max_bytes,
                    )
                    return group.records

                return single, made

            def one(firsts: dict[int, int]) -> Companions:
                found = queue_batch(tracing.origin(topic, accepted_ms), shape, q, batch, firsts[q], context)
                made.append(found)
                return recorder.join(found)

            return one, made

        def companions(firsts: dict[int, int]) -> Companions:
            whole = self.tracing.request_batch(topic, by_queue, firsts, accepted_ms, traceparents, matches)
            batches: list[TraceBatch] = []
            if whole is not None:
                batches.append(whole)
            else:
                for q, matched in matches.items():
                    found = self.tracing.produce_batch(
                        topic, q, by_queue[q], firsts[q], accepted_ms, traceparents.get(q), matched
                    )
                    if found is not None:
                        batches.append(found)
            made.extend(batches)
            return self.tracing.recorder.companions(batches)

        return companions, made

    def written(self, made: list[TraceBatch | SingleProduce], failed: MqgateError | None) -> None:
        """After `append_many_with`: the trace records went with the messages, or (the store
        refused them) they are buffered and retried like any trace event, never failing the
        produce."""
        if not made:
            return
        if failed is None:
            self.tracing.recorder.written(
                made[0].event_count if len(made) == 1 else sum(b.event_count for b in made)
            )
            return
        log.warning("trace records not stored with their produce (%s): buffered for a retry", failed.message)
        self.tracing.recorder.record_nowait(
            [
                b
                if isinstance(b, TraceBatch)
                else queue_batch(
                    self.tracing.origin(b.topic, b.accepted_ms),
                    b.shape,
                    b.queue,
                    b.batch,
                    b.offset,
                    b.context,
                )
                for b in made
            ]
        )
