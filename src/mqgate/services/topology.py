"""Topics, producers and consumers: registration, look-ups, and the store topics behind them.

Store topics are made at registration and when a gateway starts or sees a registry change,
never by a read: a consumer's side topics (retry, inbox, dead letters) exist from its
registration on, so any read path only ever reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, TypeVar

from mqgate.core.layout import Layout, inbox_topic, retry_topic
from mqgate.errors import AlreadyExists, BadRequest, NotFound
from mqgate.model import MODE_BROADCAST, MODE_CLUSTER, QueueBounds
from mqgate.names import dlq_topic, validate_name, validate_topic_name
from mqgate.registry.records import (
    ConsumerRecord,
    ProducerRecord,
    Snapshot,
    TopicRecord,
    hash_token,
    new_token,
)
from mqgate.services.context import Context, now_ms
from mqgate.services.qos import TOPIC_TARGET, split_target, target_topic
from mqgate.store.interface import TopicConfig

log = logging.getLogger(__name__)
# The token hash of a producer or consumer whose token was revoked: no token hashes to it.
REVOKED: Final = "revoked"
R = TypeVar("R", ProducerRecord, ConsumerRecord)


class Topology:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # --- look-ups (read only) -----------------------------------------------------------

    async def topic(self, name: str) -> TopicRecord:
        registry = self.ctx.registry
        rec = registry.topic(name)
        if rec is None and await registry.refresh_on_miss():
            rec = registry.topic(name)
        if rec is None:
            raise NotFound(f"topic {name} does not exist", field="topic")
        return rec

    async def producer(self, name: str) -> ProducerRecord:
        return await self._registered("producer", name, self.ctx.registry.producer)

    async def consumer(self, name: str) -> ConsumerRecord:
        return await self._registered("consumer", name, self.ctx.registry.consumer)

    async def _registered(self, kind: str, name: str, find: Callable[[str], R | None]) -> R:
        """A registered producer or consumer; a name registered through another gateway a
        moment ago is found by a look at the registry."""
        validate_name(name, kind)
        rec = find(name)
        if rec is None and await self.ctx.registry.refresh_on_miss():
            rec = find(name)
        if rec is None:
            raise NotFound(f"{kind} {name} is not registered", field=kind)
        return rec

    async def layout(self, c: ConsumerRecord) -> Layout:
        """The queues `c` reads: its topic's lanes, its retry queue and its inbox."""
        t = await self.topic(c.topic)
        return Layout(c.name, c.topic, t.queues, t.max_priority + 1)

    async def bounds(self, layout: Layout) -> list[QueueBounds]:
        """min/max of every queue of the layout, in table order, with its priority lane."""
        store = self.ctx.store
        topic, retry, inbox = await asyncio.gather(
            store.bounds(layout.topic),
            store.bounds(retry_topic(layout.consumer)),
            store.bounds(inbox_topic(layout.consumer)),
        )
        q = layout.queues
        ordered = [*topic[:q], retry[0], inbox[0], *topic[q : q * layout.lanes]]
        return [QueueBounds(i, b.min, b.max, layout.slot(i).lane) for i, b in enumerate(ordered)]

    async def start_offsets(self, c: ConsumerRecord, layout: Layout) -> list[int]:
        """Where a new table starts: the consumer's start rule on its topic's queues, the
        beginning of its retry queue and inbox."""
        bounds = await self.bounds(layout)
        starts = []
        for i, b in enumerate(bounds):
            slot = layout.slot(i)
            if slot.topic != c.topic or c.start == "earliest":
                starts.append(b.min)
            elif c.start == "latest":
                starts.append(b.max)
            else:
                starts.append(await self.ctx.store.offset_for_time(slot.topic, slot.queue, int(c.start)))
        return starts

    async def target(self, target: str) -> tuple[str, int, int]:
        """(store topic, queues per lane, max priority) of a delivery target (SPEC S1)."""
        kind, name = split_target(target)
        if kind == TOPIC_TARGET:
            t = await self.topic(name)
            return t.name, t.queues, t.max_priority
        await self.consumer(name)
        return target_topic(target), 1, 0

    def wake_reader_of(self, consumer: str) -> None:
        """A consumer's retry queue or inbox got messages: its pulls wait on its topic."""
        rec = self.ctx.registry.consumer(consumer)
        if rec is not None:
            self.ctx.store.wake(rec.topic, consumer=consumer, count=1)

    # --- the store topics behind the registry ------------------------------------------

    async def sync(self, snapshot: Snapshot) -> None:
        """Make the store topics of every registered topic and consumer exist (at start-up and
        after each registry change, so a registration through another gateway is served)."""
        for topic in snapshot.topics.values():
            await self._ensure_store_topic(topic)
        for c in snapshot.consumers.values():
            t = snapshot.topics.get(c.topic)
            if t is not None:
                await self._ensure_side_topics(c, t)

    async def _ensure_store_topic(self, topic: TopicRecord) -> None:
        if not self.ctx.store.has_topic(topic.name):
            queues = topic.queues * (topic.max_priority + 1)  # one set of queues per priority lane
            await self.ctx.store.create_topic(
                TopicConfig(topic.name, queues, topic.retention_ms, topic.retention_bytes)
            )

    async def _ensure_side_topics(self, c: ConsumerRecord, t: TopicRecord) -> None:
        for side in (retry_topic(c.name), inbox_topic(c.name)):
            if not self.ctx.store.has_topic(side):
                await self.ctx.store.create_topic(TopicConfig(side, 1, t.retention_ms, t.retention_bytes))

    # --- registration -------------------------------------------------------------------

    async def create_topic(
        self, name: str, queues: int, retention_ms: int, retention_bytes: int | None, max_priority: int = 0
    ) -> TopicRecord:
        validate_topic_name(name, "name")
        rec = TopicRecord(name, queues, retention_ms, retention_bytes, now_ms(), max_priority)
        if self.ctx.registry.topic(name) is not None:
            raise AlreadyExists(f"topic {name} already exists", field="name")
        # The store topic first, the registry row last: a failure in between leaves a store
        # topic no name points to (a retry reuses it), never a registered topic without queues.
        await self.ctx.store.create_topic(
            TopicConfig(name, queues * (max_priority + 1), retention_ms, retention_bytes)
        )
        await self.ctx.registry.change("add_topic", rec)
        return rec

    async def register_producer(
        self, name: str, topic: str, destinations: list[str] | None = None
    ) -> tuple[ProducerRecord, str]:
        validate_name(name, "name")
        await self.topic(topic)
        for d in destinations or []:
            if not d.startswith("inbox:"):
                await self.topic(d)
        token = new_token("mqp")
        rec = ProducerRecord(name, topic, hash_token(token), now_ms(), ",".join(destinations or []))
        await self.ctx.registry.change("add_producer", rec)
        return rec, token

    async def register_consumer(
        self, name: str, topic: str, mode: str, start: str, lock_timeout_s: float, max_attempts: int
    ) -> tuple[ConsumerRecord, str]:
        validate_name(name, "name")
        if mode not in (MODE_CLUSTER, MODE_BROADCAST):
            raise BadRequest("mode must be 'cluster' or 'broadcast'", field="mode")
        if start not in ("earliest", "latest") and not start.isdigit():
            raise BadRequest("start must be 'earliest', 'latest' or epoch milliseconds", field="start")
        t = await self.topic(topic)
        await self._ensure_store_topic(t)
        token = new_token("mqc")
        rec = ConsumerRecord(
            name, topic, mode, start, lock_timeout_s, max_attempts, False, 0.0, 0, hash_token(token), now_ms()
        )
        if self.ctx.registry.topic(dlq_topic(name)) is None:
            await self.create_topic(dlq_topic(name), 1, t.retention_ms, t.retention_bytes)
        await self._ensure_side_topics(rec, t)
        await self.ctx.registry.change("add_consumer", rec)
        if mode == MODE_CLUSTER:
            layout = await self.layout(rec)
            await self.ctx.offsets.ensure_table(name, "", await self.start_offsets(rec, layout), now_ms())
        return rec, token

    async def update_consumer(self, name: str, **changes: object) -> ConsumerRecord:
        await self.consumer(name)
        await self.ctx.registry.change("update_consumer", name, **changes)
        return await self.consumer(name)

    async def new_token(self, kind: str, name: str) -> tuple[ProducerRecord | ConsumerRecord, str]:
        """Issue a new token to producer or consumer `name`: the old one is refused from now on
        (on other gateways from their next registry refresh)."""
        token = new_token("mqp" if kind == "producer" else "mqc")
        return await self._set_token_hash(kind, name, hash_token(token)), token

    async def revoke_token(self, kind: str, name: str) -> ProducerRecord | ConsumerRecord:
        """Leave `name` without a valid token until a new one is issued."""
        return await self._set_token_hash(kind, name, REVOKED)

    async def _set_token_hash(self, kind: str, name: str, token_hash: str) -> ProducerRecord | ConsumerRecord:
        if kind == "producer":
            await self.producer(name)
            await self.ctx.registry.change("update_producer", name, token_hash=token_hash)
            return await self.producer(name)
        await self.consumer(name)
        await self.ctx.registry.change("update_consumer", name, token_hash=token_hash)
        return await self.consumer(name)
