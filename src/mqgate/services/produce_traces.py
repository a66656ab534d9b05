"""The trace hops of produces other than the plain path's own batches (services/produce.py):
the separate way after the messages, spooled and resent produces (SPEC P8), refused ones, the
QoS path's stored hops and scheduled messages coming due."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mqgate.core.ids import new_message_ids
from mqgate.errors import MqgateError
from mqgate.model import MessageInput, StoredMessage
from mqgate.registry.records import ProducerRecord, TopicRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.qos import TOPIC_TARGET, split_target, stored_message
from mqgate.services.tracing import Tracing
from mqgate.store.interface import Encoded
from mqgate.tracing.events import Hop, TraceEvent


class ProduceTraces:
    def __init__(self, ctx: Context, tracing: Tracing) -> None:
        self.ctx = ctx
        self.tracing = tracing

    async def produced(
        self,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        firsts: dict[int, int],
        accepted_ms: int,
        traceparents: Mapping[int, str | None],
    ) -> None:
        """The produce hops traced the separate way: after the messages, a durable wait of
        their own (the embedded store's own path writes them in the messages' group commit)."""
        if not self.tracing.active:
            return
        found = (
            self.tracing.produce_batch(topic, q, b, firsts[q], accepted_ms, traceparents.get(q))
            for q, b in by_queue.items()
        )
        await self.tracing.record([b for b in found if b is not None])

    def spooled(
        self, topic: TopicRecord, by_queue: dict[int, list[StoredMessage]], ts: int, why: str
    ) -> None:
        if self.tracing.active:
            events: list[TraceEvent] = []
            for q, msgs in by_queue.items():
                placed = [(None, m, {"detail": why}) for m in msgs]
                events += self.tracing.hops_of(("accepted", "spooled"), topic, q, placed, (), ts)
            self.tracing.record_later(events)

    def resent(self, topic: str, queue: int, msgs: list[StoredMessage], first: int, cluster: str) -> None:
        """Spooled messages were stored at last (SPEC P8): their stored hop."""
        if self.tracing.active:
            placed = [(first + i, m) for i, m in enumerate(msgs)]
            detail = f"resent from the spool to cluster {cluster}"
            events = self.tracing.message_events(
                "stored", self.ctx.registry.topic(topic), queue, placed, (), detail=detail
            )
            self.tracing.record_later(events)

    def failed(
        self, producer: ProducerRecord, topic: TopicRecord, messages: list[MessageInput], exc: MqgateError
    ) -> None:
        """A produce that was refused: `failed` hops under new ids (the caller got none), found
        by key."""
        ts = now_ms()
        failed = [
            (None, StoredMessage(i, ts, producer.name, m.body, m.keys, m.tags, m.properties))
            for m, i in zip(messages, new_message_ids(ts, len(messages)), strict=True)
        ]
        where = self.ctx.store.broker
        self.tracing.record_later(
            self.tracing.message_events(
                "failed",
                topic,
                None,
                failed,
                (),
                status="error",
                error_type=exc.code,
                error_node=where,
                detail=exc.message,
            )
        )

    def stored_events(
        self,
        topic: TopicRecord | None,
        by_queue: dict[int, list[StoredMessage]],
        firsts: dict[int, int],
        accepted_ms: int | None,
    ) -> list[TraceEvent]:
        """accepted (when `accepted_ms`) and stored hops of the traced messages just appended."""
        if topic is None:
            return []
        events: list[TraceEvent] = []
        hops: tuple[Hop, ...] = ("accepted", "stored") if accepted_ms is not None else ("stored",)
        for q, batch in by_queue.items():
            placed: list[tuple[int | None, StoredMessage, dict[str, Any]]] = [
                (firsts[q] + i, m, {}) for i, m in enumerate(batch)
            ]
            events += self.tracing.hops_of(hops, topic, q, placed, (), accepted_ms)
        return events

    def due(
        self, target: str, topic: str, by_queue: dict[int, list[Encoded]], firsts: dict[int, int]
    ) -> None:
        """due and stored hops of held messages delivered (a retry or inbox target is traced
        under its consumer's topic)."""
        kind, name = split_target(target)
        consumer = self.ctx.registry.consumer(name) if kind != TOPIC_TARGET else None
        home = self.ctx.registry.topic(consumer.topic if consumer is not None else topic)
        services = (consumer.name,) if consumer is not None else ()
        events: list[TraceEvent] = []
        for q, items in by_queue.items():
            msgs = [stored_message(e) for e in items]
            queue = q if consumer is None else None
            events += self.tracing.message_events("due", home, queue, [(None, m) for m in msgs], services)
            placed = [(firsts[q] + i, m) for i, m in enumerate(msgs)]
            events += self.tracing.message_events("stored", home, queue, placed, services, detail=topic)
        self.tracing.record_later(events)
