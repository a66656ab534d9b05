"""Half messages on mqgate's parts (half.py says where they are kept), for any door: put,
check, commit and roll back. A door brings its names (the topic, the producer) and, for a
commit, how a stored half message becomes the message it publishes.

A commit appends the message to the topic (as a produce would, by the door's producer), then
the op record, then deletes the half message if the handle is a check's receipt; a rollback only
the op record and the delete. A half message decided with its publish handle is deleted from the
half topic when a check next meets it. A crash between the append to the topic and the op record
leaves the half message open: it is checked again and, committed again, delivered twice (at least
once, as RocketMQ's own transactions)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import msgspec

from mqgate.core.message_window import MessageOutcome
from mqgate.errors import AlreadyExists, BadRequest, Forbidden, MqgateError, NotFound
from mqgate.model import MODE_MESSAGE, DestinationInput, MessageInput, Receipt, StoredMessage
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.services.context import now_ms
from mqgate.services.gateway import Gateway
from mqgate.services.messages import Delivery
from mqgate.transactions.half import (
    DEFAULT_CHECK_INTERVAL_S,
    DEFAULT_MAX_CHECKS,
    HALF_QUEUES,
    MAX_CHECK_AFTER_S,
    MAX_TOPIC_CHARS,
    OP_COMMIT,
    PROPERTY_CHECK_AT,
    PROPERTY_PREFIX,
    PROPERTY_TOPIC,
    PUBLISH_HANDLE_PREFIX,
    AlreadyDecided,
    BadHandle,
    HalfGone,
    Ledger,
    PublishHandle,
    decode_publish_handle,
    encode_publish_handle,
    half_topic,
    op_topic,
)

IDLE_STEP_S: Final = 0.5  # how soon a long poll of nothing ends once the gateway stops
MAX_VISIBILITY_S: Final = 43_200.0


class PlainMessage(msgspec.Struct):
    """A message without QoS (`mqgate.model.MessageInput`): a half message as stored, an op
    record, or what a door commits (with its QoS set)."""

    body: str
    properties: dict[str, str]
    keys: list[str]
    tags: list[str]
    order_key: str | None = None
    deliver_at: int | None = None
    delay_ms: int | None = None
    ttl_ms: int | None = None
    priority: int | None = None
    destinations: Sequence[DestinationInput] | None = None


class HalfPut(msgspec.Struct, frozen=True):
    """A half message stored: its id, its publish handle and where it is."""

    msg_id: str
    handle: str
    queue: int
    offset: int
    check_at: int  # epoch ms of its first check


Committed = Callable[[StoredMessage], MessageInput]  # a door's: the message a commit publishes


def own_properties(m: StoredMessage) -> dict[str, str]:
    """A half message's properties without the transaction's own."""
    return {k: v for k, v in m.properties.items() if not k.startswith(PROPERTY_PREFIX)}


class HalfMessages:
    def __init__(
        self,
        gateway: Gateway,
        *,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        max_checks: int = DEFAULT_MAX_CHECKS,
    ) -> None:
        self.gw = gateway
        self.check_interval_s = check_interval_s
        self.max_checks = max_checks
        self.ledger = Ledger(gateway.ctx.store)

    async def idle(self, wait_s: float) -> None:
        """A long poll that can find nothing: its time, cut short when the gateway stops."""
        deadline = time.monotonic() + wait_s
        while not self.gw.consuming.closing and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, IDLE_STEP_S))

    # --- the records ----------------------------------------------------------------------

    async def records(self, t: TopicRecord) -> ConsumerRecord:
        """The topic's half topic, op topic and half consumer, made on first use."""
        topology = self.gw.topology
        registry = self.gw.ctx.registry
        half, ops = half_topic(t.name), op_topic(t.name)
        if len(t.name) > MAX_TOPIC_CHARS:
            raise BadRequest(
                f"half messages need a topic name of at most {MAX_TOPIC_CHARS} characters", field="topic"
            )
        c = registry.consumer(half)
        if c is not None and c.topic == half:
            return c
        for name, queues in ((ops, 1), (half, HALF_QUEUES)):
            rec = registry.topic(name)
            if rec is None:
                try:
                    rec = await topology.create_topic(
                        name, queues, t.retention_ms, t.retention_bytes, project=t.project, reserved=True
                    )
                except AlreadyExists:
                    rec = await topology.topic(name)
            if rec.project != t.project:
                raise Forbidden(
                    f"the topic {name} the gateway keeps this topic's half messages in belongs to "
                    "another project", field="topic",
                )  # fmt: skip
        with contextlib.suppress(AlreadyExists):  # made alongside
            await topology.register_consumer(
                half, half, MODE_MESSAGE, "earliest", self.check_interval_s, self.max_checks + 1,
                reserved=True,
            )  # fmt: skip
        return await topology.consumer(half)

    async def consumer(self, t: TopicRecord) -> ConsumerRecord | None:
        """The topic's half consumer, or None when no half message was ever put."""
        registry = self.gw.ctx.registry
        name = half_topic(t.name)
        c = registry.consumer(name)
        if c is None and await registry.refresh_on_miss():
            c = registry.consumer(name)
        return c if c is not None and c.topic == name else None

    # --- put ------------------------------------------------------------------------------

    async def put(
        self, t: TopicRecord, producer: str, messages: Sequence[PlainMessage], check_after_s: float
    ) -> list[HalfPut]:
        """Store half messages of `t`, first checked `check_after_s` from now; `producer` is the
        name their records carry."""
        if not 0 <= check_after_s <= MAX_CHECK_AFTER_S:
            raise BadRequest(f"checkAfterS must be 0 to {MAX_CHECK_AFTER_S}", field="checkAfterS")
        await self.records(t)
        check_at = now_ms() + int(check_after_s * 1000)
        halves = [
            PlainMessage(
                m.body,
                {**m.properties, PROPERTY_CHECK_AT: str(check_at), PROPERTY_TOPIC: t.name},
                m.keys,
                m.tags,
            )
            for m in messages
        ]
        as_half = ProducerRecord(producer, half_topic(t.name), "", 0)
        receipts = await self.gw.producing.produce(as_half, list(halves))
        secret = self.gw.ctx.secret
        out = []
        for r in receipts:
            queue = r.queue if r.queue is not None else -1
            offset = r.offset if r.offset is not None else -1
            handle = encode_publish_handle(PublishHandle(t.name, r.msg_id, queue, offset), secret)
            out.append(HalfPut(r.msg_id, handle, queue, offset, check_at))
        return out

    # --- check ----------------------------------------------------------------------------

    async def due(self, t: TopicRecord, max_count: int, wait_s: float) -> list[Delivery]:
        """The topic's half messages due for a check (each with its receipt as a new handle),
        waiting up to `wait_s` for one; none at the deadline."""
        c = await self.consumer(t)
        if c is None:  # no half message was ever put to the topic
            await self.idle(wait_s)
            return []
        messages = self.gw.messages
        deadline = time.monotonic() + wait_s
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            got = await messages.receive(c, max_count=max_count, wait_s=remaining)
            if not got:
                return []
            await self.ledger.catch_up(t.name)
            now = now_ms()
            due: list[Delivery] = []
            settle: list[Awaitable[MessageOutcome]] = []
            for d in got:
                if self.ledger.resolved(t.name, d.message.msg_id) is not None:
                    settle.append(messages.delete(c, d.receipt))  # decided with its publish handle
                    continue
                check_at = int(d.message.properties.get(PROPERTY_CHECK_AT, "0") or 0)
                if check_at > now:  # not yet: hidden until its first check
                    hide = min((check_at - now) / 1000, MAX_VISIBILITY_S)
                    settle.append(messages.change_visibility(c, d.receipt, hide))
                    continue
                due.append(d)
            if settle:
                await asyncio.gather(*settle)
            if due or time.monotonic() >= deadline:
                return due

    # --- commit and rollback --------------------------------------------------------------

    async def find(
        self, t: TopicRecord, handle: str, field: str = "handle"
    ) -> tuple[StoredMessage, ConsumerRecord | None]:
        """The half message a handle names, and the half consumer when it is a check's receipt."""
        store = self.gw.ctx.store
        half = half_topic(t.name)
        gone = HalfGone("the half message does not exist, or was committed or rolled back", field=field)
        if handle.startswith(PUBLISH_HANDLE_PREFIX):
            ph = decode_publish_handle(handle, self.gw.ctx.secret, field)
            if ph.topic != t.name:
                raise BadHandle(f"the handle is a half message of another topic than {t.name}", field=field)
            if ph.offset < 0:
                raise gone
            try:
                msgs = await store.read(half, ph.queue, ph.offset, 1)
            except NotFound:
                raise gone from None
            if not msgs or msgs[0][0] != ph.offset or msgs[0][1].msg_id != ph.msg_id:
                raise gone
            return msgs[0][1], None
        c = await self.consumer(t)
        bad = BadHandle("the handle is not a half message's handle of this topic", field=field)
        if c is None:
            raise bad
        try:
            r = self.gw.messages.receipt(c, handle)
        except MqgateError as exc:
            if exc.http_status >= 500:
                raise
            raise bad from None
        layout = await self.gw.topology.layout(c)
        slot = layout.slot(r.queue)
        msgs = await store.read(slot.topic, slot.queue, r.offset, 1)
        if not msgs or msgs[0][0] != r.offset:
            raise gone
        return msgs[0][1], c

    async def decide(
        self,
        t: TopicRecord,
        producer: ProducerRecord,
        handle: str,
        op: str,
        committed: Committed,
        field: str = "handle",
    ) -> tuple[str, list[Receipt]]:
        """Commit or roll back the half message of `handle`: its id, and a commit's receipts.
        `producer` (of `t`) publishes a commit, made by `committed` from the stored half
        message. BadHandle, HalfGone, AlreadyDecided when it cannot be."""
        m, c = await self.find(t, handle, field)
        ledger = self.ledger
        receipts: list[Receipt] = []
        async with ledger.turn(t.name):
            await ledger.catch_up(t.name)
            if ledger.resolved(t.name, m.msg_id) is not None:
                raise AlreadyDecided("the half message was committed or rolled back already", field=field)
            if op == OP_COMMIT:
                receipts = await self.gw.producing.produce(producer, [committed(m)])
            record = PlainMessage(m.msg_id, {}, [], [op])
            as_op = ProducerRecord(producer.name, op_topic(t.name), "", 0)
            (r,) = await self.gw.producing.produce(as_op, [record])
            ledger.record(t.name, m.msg_id, op, r.queue, r.offset)
        if c is not None:
            await self.gw.messages.delete(c, handle)
        return m.msg_id, receipts
