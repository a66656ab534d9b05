"""Produce (SPEC G3): messages into their queues now, or to the scheduler until they are due
(SPEC S1-S3), and the delivery of what comes due."""

from __future__ import annotations

import contextlib
import logging
import operator
import zlib
from typing import Final, Protocol

import msgspec

from mqgate.core.ids import ids_by_queue, new_message_ids
from mqgate.core.layout import INBOX_PREFIX, QueueGrid
from mqgate.core.trace_context import TRACEPARENT, request_context, with_traceparent
from mqgate.errors import BadRequest, MqgateError, NotFound
from mqgate.model import MessageInput, Receipt, StoredMessage
from mqgate.registry.records import ProducerRecord, TopicRecord
from mqgate.scheduler.interface import Destination, Due
from mqgate.services.context import Context, now_ms
from mqgate.services.observers import Observers
from mqgate.services.qos import (
    TOPIC_TARGET,
    Placement,
    all_plain,
    held_message,
    held_payload,
    placements,
    split_target,
)
from mqgate.services.topology import Topology
from mqgate.store.interface import Encoded
from mqgate.store.scope import request_scope

log = logging.getLogger(__name__)

STORED: Final = "stored"
SCHEDULED: Final = "scheduled"
NO_SCOPE: Final = contextlib.nullcontext()  # a produce of a gateway without failover
SPOOLED: Final = "spooled"  # kept in the gateway's spool until a cluster takes it (SPEC P8, E7)
_ORDER_KEY: Final = operator.attrgetter("order_key")  # read in C, for a whole batch


class SpoolSink(Protocol):
    """Where produces go that the project's cluster cannot take (failover/service.py)."""

    @property
    def routes_any(self) -> bool: ...

    def project_of_topic(self, topic: str) -> str | None: ...

    def must_spool(self, project: str, topic: str, queues: list[int]) -> bool: ...

    async def spool_produce(
        self, project: str, topic: str, batches: dict[int, list[StoredMessage]], tried: bool
    ) -> bool:
        """Keep the messages for a later send. `tried`: a send of them failed (it may have
        stored them, unless the sink knows it failed before it got anywhere). Whether they may
        have been stored already: their receipts say so."""
        ...


class Spooled(msgspec.Struct, frozen=True):
    """A produce kept in the spool; `possible_duplicate`: its failed send may have stored it."""

    possible_duplicate: bool


class Producing:
    def __init__(
        self, ctx: Context, topology: Topology, observers: Observers, spool: SpoolSink | None = None
    ) -> None:
        self.ctx = ctx
        self.topology = topology
        self.observers = observers
        self._turns: dict[str, int] = {}  # each topic's round-robin turns taken
        self.failover = spool

    def queue_for(self, topic: str, queues: int, order_key: str | None) -> int:
        """The queue of a message: by its order key's hash, else round robin."""
        if order_key is not None:
            return zlib.crc32(order_key.encode()) % queues
        turn = self._turns.get(topic, 0)
        self._turns[topic] = turn + 1
        return turn % queues

    def store_queues_for(self, topic: str, grid: QueueGrid, messages: list[MessageInput]) -> list[int]:
        """The store queues of plain messages (lane 0), in order: a batch without order keys
        takes its round-robin turns in one step."""
        if len(messages) == 1 or any(map(_ORDER_KEY, messages)):
            return [self.store_queue_for(topic, grid, 0, m.order_key or None) for m in messages]
        queues = grid.queues
        turn = self._turns.get(topic, 0)
        self._turns[topic] = turn + len(messages)
        lane = grid.lane_queues(0)
        return [lane[(turn + i) % queues] for i in range(len(messages))]

    def store_queue_for(self, topic: str, grid: QueueGrid, lane: int, order_key: str | None) -> int:
        """The store queue of a message in priority lane `lane` of a topic."""
        return grid.store_queue(lane, self.queue_for(topic, grid.queues, order_key))

    async def produce(
        self, producer: ProducerRecord, messages: list[MessageInput], traceparent: str | None = None
    ) -> list[Receipt]:
        """`traceparent`: the request's W3C trace context, kept with each message (SPEC P6)."""
        topic = await self.topology.topic(producer.topic)
        try:
            routing = self.failover is not None and self.failover.routes_any
            with request_scope() if routing else NO_SCOPE:  # one cluster per request (SPEC P8)
                receipts = await self._produce(producer, topic, messages, traceparent)
        except MqgateError as exc:
            for failed in self.observers.produce_failed:
                failed(producer, topic, messages, exc)
            raise
        for produced in self.observers.produced:
            produced(topic, len(messages))
        return receipts

    async def _produce(
        self,
        producer: ProducerRecord,
        topic: TopicRecord,
        messages: list[MessageInput],
        traceparent: str | None,
    ) -> list[Receipt]:
        ts = now_ms()
        if not all_plain(messages):
            return await self._produce_with_qos(producer, messages, ts, traceparent)
        by_queue: dict[int, list[StoredMessage]] = {}
        placed: list[tuple[int, int]] = []  # (queue, index within that queue's batch)
        observers = self.observers
        # The request's valid trace context is kept with each message; without one, a message
        # keeps only its own, and a traced one is known by the context derived from its id
        # (core/trace_context.py): nothing more is stored.
        context = request_context(traceparent)
        grid = topic.grid
        queues = self.store_queues_for(topic.name, grid, messages)
        # Each queue's ids consecutive: its trace record names them as a run.
        ids = ids_by_queue(ts, queues)
        # Messages without properties of their own share one dict (nothing changes a stored
        # message's properties); `own_context`: queues where a message kept a context of its own.
        only_context = {TRACEPARENT: context} if context else {}
        own_context: set[int] = set()
        for m, msg_id, q in zip(messages, ids, queues, strict=True):
            batch = by_queue.setdefault(q, [])
            placed.append((q, len(batch)))
            props = m.properties
            if context:
                if not props:
                    props = only_context
                else:
                    props = with_traceparent(props, context)
                    if props is m.properties:
                        own_context.add(q)
            elif props and TRACEPARENT in props:
                own_context.add(q)
            batch.append(StoredMessage(msg_id, ts, producer.name, m.body, m.keys, m.tags, props))
        failover = self.failover
        project = (
            failover.project_of_topic(topic.name) if failover is not None and failover.routes_any else None
        )
        if project is not None:
            placed_firsts = await self._append_or_spool(project, topic, by_queue, ts)
            if isinstance(placed_firsts, Spooled):
                maybe = placed_firsts.possible_duplicate
                return [
                    Receipt(by_queue[q][i].msg_id, "spool", SPOOLED, q, None, possible_duplicate=maybe)
                    for q, i in placed
                ]
            firsts = placed_firsts
            for stored in observers.stored:
                await stored(producer, topic, by_queue, firsts, ts, context, own_context)
        else:
            records = None
            for records_with in observers.records_with:  # one feature writes records at most
                records = await records_with(producer, topic, by_queue, ts, context, own_context)
            if records is not None:
                # A feature's records go in the messages' own group commit: no second durable
                # wait. A store that refuses them tells their group, which keeps them to retry.
                firsts, _ = await self.ctx.store.append_many_with(topic.name, by_queue, records)
            else:
                firsts = await self.ctx.store.append_many(topic.name, by_queue)
                for stored in observers.stored:
                    await stored(producer, topic, by_queue, firsts, ts, context, own_context)
        self.ctx.metrics.child(self.ctx.metrics.produced, topic.name).inc(len(messages))
        broker = self.ctx.store.broker
        return [Receipt(by_queue[q][i].msg_id, broker, STORED, q, firsts[q] + i) for q, i in placed]

    async def _append_or_spool(
        self, project: str, topic: TopicRecord, by_queue: dict[int, list[StoredMessage]], ts: int
    ) -> dict[int, int] | Spooled:
        """Append to the project's active cluster (each queue's first offset); when it cannot
        take them (or earlier produces of these queues wait in the spool, whose order they must
        keep), keep them in the spool instead."""
        assert self.failover is not None
        if self.failover.must_spool(project, topic.name, list(by_queue)):
            maybe = await self.failover.spool_produce(project, topic.name, by_queue, tried=False)
            for spooled in self.observers.spooled:
                spooled(topic, by_queue, ts, "behind earlier spooled produces of its queue")
            return Spooled(maybe)
        try:
            return await self.ctx.store.append_many(topic.name, by_queue)
        except MqgateError as exc:
            if exc.http_status < 500:
                raise
            count = sum(map(len, by_queue.values()))
            log.warning("project %s: spooling %d messages of %s: %s", project, count, topic.name, exc.message)
            # It may have reached the cluster before failing: its resend is counted, and its
            # receipts say so (unless the sink knows it failed before it got there).
            maybe = await self.failover.spool_produce(project, topic.name, by_queue, tried=True)
            for spooled in self.observers.spooled:
                spooled(topic, by_queue, ts, exc.message)
            return Spooled(maybe)

    async def _produce_with_qos(
        self,
        producer: ProducerRecord,
        messages: list[MessageInput],
        ts: int,
        traceparent: str | None = None,
    ) -> list[Receipt]:
        """Destinations due now are stored at once, later ones held by the scheduler (SPEC S1-S3).
        Everything is validated before anything is written."""
        # (store topic, placement, message, store queue or -1 when held)
        plan: list[tuple[str, Placement, StoredMessage, int]] = []
        holds: list[tuple[bytes, list[Destination]]] = []
        context = request_context(traceparent)
        for i, (m, msg_id) in enumerate(zip(messages, new_message_ids(ts, len(messages)), strict=True)):
            props = m.properties
            if context:
                props = with_traceparent(props, context)
            stored = StoredMessage(msg_id, ts, producer.name, m.body, m.keys, m.tags, props)
            later: list[Destination] = []
            for pl in placements(producer, m, ts):
                topic, grid, max_priority = await self.topology.target(pl.target)
                if pl.priority > max_priority:
                    raise BadRequest(
                        f"priority {pl.priority} is above the max priority ({max_priority}) of "
                        f"{pl.label or topic}; create the topic with a higher maxPriority",
                        field=f"messages[{i}].priority" if len(messages) > 1 else "priority",
                    )
                if pl.start_ms > ts:
                    later.append(pl.destination())
                    plan.append((topic, pl, stored, -1))
                    continue
                q = self.store_queue_for(topic, grid, pl.priority, m.order_key or None)
                qos = msgspec.structs.replace(
                    stored,
                    priority=pl.priority or None,
                    deliver_at_ms=pl.start_ms if pl.start_ms != ts else None,
                    deadline_ms=pl.deadline_ms or None,
                )
                plan.append((topic, pl, qos, q))
            if later:
                holds.append((held_payload(stored, m.order_key or None), later))
        if holds:
            await self.ctx.scheduler.hold(holds)
            if self.observers.held:
                held = [
                    (held_message(payload), [f"{d.target} at {d.deliver_at_ms}" for d in later])
                    for payload, later in holds
                ]
                for hook in self.observers.held:
                    await hook(producer, held, ts)
        by_topic: dict[str, dict[int, list[StoredMessage]]] = {}
        slots: list[int] = []
        for topic, _, msg, q in plan:
            if q >= 0:
                batch = by_topic.setdefault(topic, {}).setdefault(q, [])
                slots.append(len(batch))
                batch.append(msg)
            else:
                slots.append(-1)
        firsts = {topic: await self.ctx.store.append_many(topic, qs) for topic, qs in by_topic.items()}
        for stored_qos in self.observers.stored_qos:
            await stored_qos(by_topic, firsts, ts)
        for topic, qs in by_topic.items():
            self.ctx.metrics.child(self.ctx.metrics.produced, topic).inc(sum(len(b) for b in qs.values()))
            if topic.startswith(INBOX_PREFIX):
                self.topology.wake_reader_of(topic[len(INBOX_PREFIX) :])
        broker = self.ctx.store.broker
        receipts = []
        for (topic, pl, msg, q), slot in zip(plan, slots, strict=True):
            if q < 0:
                receipt = Receipt(msg.msg_id, broker, SCHEDULED, None, None, pl.label, pl.start_ms)
            else:
                offset = firsts[topic][q] + slot
                receipt = Receipt(msg.msg_id, broker, STORED, q, offset, pl.label, msg.deliver_at_ms)
            receipts.append(msgspec.structs.replace(receipt, deadline=pl.deadline_ms or None))
        return receipts

    # --- scheduled delivery -------------------------------------------------------------

    async def deliver_due(self, by_target: dict[str, list[tuple[Encoded, str | None, int]]]) -> None:
        for target, items in by_target.items():
            try:
                topic, grid, max_priority = await self.topology.target(target)
            except NotFound:
                log.warning("dropping %d scheduled messages: %s was deleted", len(items), target)
                self.ctx.metrics.child(self.ctx.metrics.dropped_held, target).inc(len(items))
                continue
            by_queue: dict[int, list[Encoded]] = {}
            for msg, order_key, priority in items:
                lane = min(priority, max_priority)
                by_queue.setdefault(self.store_queue_for(topic, grid, lane, order_key), []).append(msg)
            # Taken before the append: a pull woken by it may deliver before this goes on, and
            # the messages were due and stored before that delivery.
            appended_ms = now_ms()
            firsts = await self.ctx.store.append_encoded(topic, by_queue)
            self.ctx.metrics.child(self.ctx.metrics.produced, topic).inc(len(items))
            for came_due in self.observers.came_due:
                came_due(target, topic, by_queue, firsts, appended_ms)
            kind, name = split_target(target)
            if kind != TOPIC_TARGET:
                self.topology.wake_reader_of(name)

    def expired_before_delivery(self, due: Due) -> None:
        self.ctx.metrics.child(self.ctx.metrics.expired_held, due.destination.target).inc()
