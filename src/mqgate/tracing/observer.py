"""Tracing's side of the data path's seam (services/observers.py): the hops of each traced
message, from its produce to its ack, redelivery or dead letter (SPEC P2-P6).

Attached by `Tracing` while a trace policy exists, so a gateway without one runs none of this.
A plain produce's trace records go in the messages' own group commit
(`MessageStore.append_many_with`): built once the offsets are known and joined to the project's
open round group (tracing/rounds.py), which counts them once stored or keeps them for a retry if
the store refused them. A traced single-message produce joins its queue's run in the round
through its `QueueTracer` instead of building a batch of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from mqgate.core.ids import new_message_ids
from mqgate.core.layout import Slot, inbox_topic
from mqgate.core.tokens import AckToken, encode_token
from mqgate.core.trace_context import derived_traceparent, with_traceparent
from mqgate.errors import MqgateError
from mqgate.model import MessageInput, StoredMessage, decode_stored, encode_stored
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.services.context import now_ms
from mqgate.services.observers import BatchHop, Observer, Placed, RecordsMaker, Settlement
from mqgate.services.qos import TOPIC_TARGET, split_target, stored_message
from mqgate.services.topology import Topology
from mqgate.store.interface import Companions, Encoded
from mqgate.tracing.batch import BatchShape, TraceBatch
from mqgate.tracing.events import TraceEvent
from mqgate.tracing.policy import MatchedTrace
from mqgate.tracing.produce_batches import queue_batch
from mqgate.tracing.rounds import QueueTracer

if TYPE_CHECKING:
    from mqgate.tracing.service import Tracing


class TraceObserver(Observer):
    def __init__(self, tracing: Tracing, topology: Topology) -> None:
        self.tracing = tracing
        self.ctx = tracing.ctx
        self.topology = topology

    # --- produce ------------------------------------------------------------------------

    def _tracers(
        self, producer: ProducerRecord, topic: TopicRecord, by_queue: dict[int, list[StoredMessage]]
    ) -> dict[int, QueueTracer]:
        """The traced queues of a produce (one producer sent them all: one tracer per queue)."""
        return self.tracing.queue_tracers(topic, by_queue, producer.name)

    async def records_with(
        self,
        producer: ProducerRecord,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        accepted_ms: int,
        context: str | None,
        own_context: set[int],
    ) -> RecordsMaker | None:
        tracers = self._tracers(producer, topic, by_queue)
        if not tracers:
            return None
        tracing = self.tracing
        if not (tracing.ready(topic) or await tracing.ready_for(topic)):
            return None  # traced the separate way (`stored`), after the messages
        # Per traced queue, the context all its messages carry (None: each its derived one).
        shared = {q: context for q in tracers if q not in own_context}
        if len(tracers) != 1:
            matches = {q: tracer.matched for q, tracer in tracers.items()}
            return self._request(topic, by_queue, accepted_ms, shared, matches)
        ((q, tracer),) = tracers.items()  # the common case, on every traced produce: one queue
        batch = by_queue[q]
        if len(batch) == 1:  # a single message joins its queue's run in the round
            return partial(tracer.join, batch[0])
        return self._queue(topic, q, batch, accepted_ms, shared.get(q), tracer.shape)

    def _queue(
        self,
        topic: TopicRecord,
        q: int,
        batch: list[StoredMessage],
        accepted_ms: int,
        context: str | None,
        shape: BatchShape,
    ) -> RecordsMaker:
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
    ) -> RecordsMaker:
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

    async def stored(
        self,
        producer: ProducerRecord,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        firsts: dict[int, int],
        accepted_ms: int,
        context: str | None,
        own_context: set[int],
    ) -> None:
        """The produce hops traced the separate way: after the messages, a durable wait of
        their own."""
        tracers = self._tracers(producer, topic, by_queue)
        if not tracers:
            return
        shared = {q: context for q in tracers if q not in own_context}
        tracing = self.tracing
        found = (
            tracing.produce_batch(topic, q, b, firsts[q], accepted_ms, shared.get(q))
            for q, b in by_queue.items()
        )
        await tracing.record([b for b in found if b is not None])

    def produce_failed(
        self, producer: ProducerRecord, topic: TopicRecord, messages: list[MessageInput], exc: MqgateError
    ) -> None:
        """`failed` hops under new ids (the caller got none), found by key."""
        ts = now_ms()
        failed = [
            (None, StoredMessage(i, ts, producer.name, m.body, m.keys, m.tags, m.properties))
            for m, i in zip(messages, new_message_ids(ts, len(messages)), strict=True)
        ]
        tracing = self.tracing
        tracing.record_later(
            tracing.message_events(
                "failed",
                topic,
                None,
                failed,
                (),
                status="error",
                error_type=exc.code,
                error_node=self.ctx.store.broker,
                detail=exc.message,
            )
        )

    def spooled(
        self, topic: TopicRecord, by_queue: dict[int, list[StoredMessage]], ts: int, why: str
    ) -> None:
        events: list[TraceEvent] = []
        for q, msgs in by_queue.items():
            placed = [(None, m, {"detail": why}) for m in msgs]
            events += self.tracing.hops_of(("accepted", "spooled"), topic, q, placed, (), ts)
        self.tracing.record_later(events)

    def resent(self, topic: str, queue: int, msgs: list[StoredMessage], first: int, cluster: str) -> None:
        """Spooled messages were stored at last (SPEC P8): their stored hop."""
        if not self.tracing.active:
            return
        placed = [(first + i, m) for i, m in enumerate(msgs)]
        detail = f"resent from the spool to cluster {cluster}"
        events = self.tracing.message_events(
            "stored", self.ctx.registry.topic(topic), queue, placed, (), detail=detail
        )
        self.tracing.record_later(events)

    async def held(
        self, producer: ProducerRecord, held: list[tuple[StoredMessage, list[str]]], accepted_ms: int
    ) -> None:
        tracing = self.tracing
        home = self.ctx.registry.topic(producer.topic)
        events: list[TraceEvent] = []
        for message, wheres in held:
            placed = [(None, message)]
            events += tracing.message_events("accepted", home, None, placed, (), time_ms=accepted_ms)
            for where in wheres:
                events += tracing.message_events("scheduled", home, None, placed, (), detail=where)
        await tracing.record(events)

    async def stored_qos(
        self,
        by_topic: Mapping[str, dict[int, list[StoredMessage]]],
        firsts: Mapping[str, dict[int, int]],
        ts: int,
    ) -> None:
        """accepted and stored hops of the destinations stored at once."""
        for name, by_queue in by_topic.items():
            topic = self.ctx.registry.topic(name)
            if topic is None:
                continue
            events: list[TraceEvent] = []
            for q, batch in by_queue.items():
                placed: list[tuple[int | None, StoredMessage, dict[str, Any]]] = [
                    (firsts[name][q] + i, m, {}) for i, m in enumerate(batch)
                ]
                events += self.tracing.hops_of(("accepted", "stored"), topic, q, placed, (), ts)
            await self.tracing.record(events)

    def came_due(
        self,
        target: str,
        topic: str,
        by_queue: dict[int, list[Encoded]],
        firsts: dict[int, int],
        appended_ms: int,
    ) -> None:
        """due and stored hops of held messages delivered (a retry or inbox target is traced
        under its consumer's topic), at the time their append began: before any delivery of
        them, which a pull woken by the append may record first."""
        kind, name = split_target(target)
        registry = self.ctx.registry
        consumer = registry.consumer(name) if kind != TOPIC_TARGET else None
        home = registry.topic(consumer.topic if consumer is not None else topic)
        services = (consumer.name,) if consumer is not None else ()
        tracing = self.tracing
        events: list[TraceEvent] = []
        # A retry queue or inbox is named as the hop's source: it has no queue of the topic.
        where: dict[str, Any] = {"time_ms": appended_ms}
        if consumer is not None:
            where["source"] = topic
        for q, items in by_queue.items():
            msgs = [stored_message(e) for e in items]
            queue = q if consumer is None else None
            events += tracing.message_events("due", home, queue, [(None, m) for m in msgs], services, **where)
            placed = [(firsts[q] + i, m) for i, m in enumerate(msgs)]
            events += tracing.message_events("stored", home, queue, placed, services, detail=topic, **where)
        tracing.record_later(events)

    # --- consume ------------------------------------------------------------------------

    def delivered(
        self,
        c: ConsumerRecord,
        slot: Slot,
        raw: list[tuple[int, bytes]],
        request_id: str,
        client: str,
        owner: str,
        attempt: int,
    ) -> list[tuple[int, bytes]]:
        """The delivered hops; a traced message without a trace context of its own is given
        its derived one (core/trace_context.py), so the consumer's spans join its trace."""
        msgs = [(o, decode_stored(r)) for o, r in raw]
        events = self.tracing.batch_events(
            "delivered",
            c,
            slot,
            msgs,
            client_id=client or None,
            client_addr=owner.split("/", 1)[0],
            request_id=request_id,
            attempt=attempt,
        )
        self.tracing.record_later(events)
        if not events:
            return raw
        traced = {e.msg_id for e in events}
        return [
            (o, r if m.msg_id not in traced else with_context(m, r))
            for (o, r), (_, m) in zip(raw, msgs, strict=True)
        ]

    async def settled(
        self, c: ConsumerRecord, token: AckToken, how: Settlement, durable: bool, refusal: str | None
    ) -> None:
        """acked or released hops of a batch: its messages are read back (only while a policy
        exists), so any gateway can trace an ack of a pull another one served."""
        slot = (await self.topology.layout(c)).slot(token.queue)
        count = token.next_offset - token.offset
        msgs = await self.ctx.store.read(slot.topic, slot.queue, token.offset, count)
        events = self.tracing.batch_events(
            how,
            c,
            slot,
            msgs,
            client_id=token.client_id or None,
            request_id=encode_token(token, self.ctx.secret),
            **({"status": "error", "error_type": refusal, "error_node": c.name} if refusal else {}),
        )
        if durable:
            await self.tracing.record(events)
        else:
            self.tracing.record_later(events)

    def batch_hop(
        self, c: ConsumerRecord, slot: Slot, msgs: Placed, hop: BatchHop, attempt: int, **fields: Any
    ) -> None:
        """A hop nobody waits for: buffered (see Tracing.record_later)."""
        self.tracing.record_later(self.tracing.batch_events(hop, c, slot, msgs, attempt=attempt, **fields))

    async def redriven(self, c: ConsumerRecord, copies: Placed) -> None:
        """Traced under the consumer's topic, as its inbox's other hops are (`came_due`)."""
        home = self.ctx.registry.topic(c.topic)
        events = self.tracing.message_events(
            "redriven", home, None, copies, (c.name,), consumer=c.name, source=inbox_topic(c.name)
        )
        await self.tracing.record(events)

    def read(self, topic: str, queue: int, raw: list[tuple[int, bytes]], reader: str | None) -> None:
        msgs = [(o, decode_stored(r)) for o, r in raw]
        readers = (reader,) if reader else ()
        tracing = self.tracing
        tracing.record_later(
            tracing.message_events("read", tracing.topic_of(topic), queue, msgs, readers, consumer=reader)
        )


def with_context(message: StoredMessage, raw: bytes) -> bytes:
    """`raw` (the stored `message`) as delivered to a consumer whose delivery is traced: with
    the message's trace context among its properties (its own when valid, else derived)."""
    properties = with_traceparent(message.properties, derived_traceparent(message.msg_id))
    if properties is message.properties:
        return raw
    return encode_stored(msgspec.structs.replace(message, properties=properties))
