"""Message QoS at the gateway (SPEC S1–S5): where each destination of a produced message goes
and when, the payload the scheduler holds, and the loop that delivers what comes due."""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from mqgate.core.layout import inbox_topic, retry_topic
from mqgate.core.scheduling import deadline_for, validate_window
from mqgate.errors import BadRequest, Forbidden, MqgateError
from mqgate.model import DestinationInput, MessageInput, StoredMessage, decode_stored
from mqgate.registry.records import ProducerRecord
from mqgate.scheduler.interface import Destination, Due, Scheduler
from mqgate.store.interface import Encoded

log = logging.getLogger(__name__)

TOPIC_TARGET: Final = "t:"
INBOX_TARGET: Final = "i:"
RETRY_TARGET: Final = "r:"
CLAIM_MS: Final = 30_000  # a claimer that died gives its claims back after this
DELIVERY_BATCH: Final = 2_000
IDLE_RECHECK_S: Final = 1.0

_encode_held = msgspec.msgpack.Encoder().encode
# (stored JSON, order key, timestamp ms); two items in payloads held by older versions
_decode_held = msgspec.msgpack.Decoder().decode
_encode_json = msgspec.json.Encoder().encode


class Placement(msgspec.Struct, frozen=True):
    """One destination of a produced message, resolved: a target and its window."""

    target: str  # "t:<topic>", "i:<consumer>" (inbox) or "r:<consumer>" (retry)
    label: str | None  # as the producer named it, for the receipt (None: the default topic)
    start_ms: int
    deadline_ms: int  # 0 = none
    priority: int

    def destination(self) -> Destination:
        return Destination(self.target, self.start_ms, self.deadline_ms, self.priority)


def split_target(target: str) -> tuple[str, str]:
    """(kind, name): kind is TOPIC_TARGET, INBOX_TARGET or RETRY_TARGET; name a topic or consumer."""
    kind, name = target[:2], target[2:]
    if kind not in (TOPIC_TARGET, INBOX_TARGET, RETRY_TARGET):
        raise ValueError(f"unknown target {target!r}")
    return kind, name


def target_topic(target: str) -> str:
    """The store topic a target's messages are appended to."""
    kind, name = split_target(target)
    if kind == TOPIC_TARGET:
        return name
    return inbox_topic(name) if kind == INBOX_TARGET else retry_topic(name)


# A message's QoS fields, read in C: checking a batch of them makes no Python call per message.
_QOS_FIELDS: Final = operator.attrgetter("deliver_at", "delay_ms", "ttl_ms", "priority", "destinations")
_NO_QOS: Final = (None, None, None, None, None)


def all_plain(messages: list[MessageInput]) -> bool:
    """No message asks for QoS: the fast path."""
    return all(map(_NO_QOS.__eq__, map(_QOS_FIELDS, messages)))


def placements(producer: ProducerRecord, msg: MessageInput, now_ms: int) -> list[Placement]:
    """Resolve a message's destinations (or its producer's topic) with their windows (SPEC S2:
    deadline = start + validity). Permission and lane checks against topics come later."""
    specs = msg.destinations
    if specs is None:
        return [_placement(TOPIC_TARGET + producer.topic, None, msg, None, now_ms, "")]
    out = []
    for i, d in enumerate(specs):
        where = f"destinations[{i}]."
        if d.topic is not None:
            target, label = TOPIC_TARGET + d.topic, d.topic
        else:
            assert d.consumer is not None
            target, label = INBOX_TARGET + d.consumer, f"inbox:{d.consumer}"
        if not producer.may_write(label):
            raise Forbidden(
                f"producer {producer.name} may not write to {label} (register it with that destination)",
                field=f"{where}{'topic' if d.topic is not None else 'consumer'}",
            )
        out.append(_placement(target, label, msg, d, now_ms, where))
    return out


def _placement(
    target: str, label: str | None, msg: MessageInput, d: DestinationInput | None, now_ms: int, where: str
) -> Placement:
    """The destination's own QoS where it has some, else the message's."""
    deliver_at, delay_ms = (d.deliver_at, d.delay_ms) if d is not None else (None, None)
    if deliver_at is None and delay_ms is None:
        deliver_at, delay_ms = msg.deliver_at, msg.delay_ms
    start = deliver_at if deliver_at is not None else now_ms + (delay_ms or 0)
    ttl = (d.ttl_ms if d is not None else None) or msg.ttl_ms
    priority = msg.priority if d is None or d.priority is None else d.priority
    deadline = deadline_for(start, ttl)
    validate_window(start, deadline, now_ms, start_field=f"{where}deliverAt", deadline_field=f"{where}ttlMs")
    if deadline and deadline < now_ms:
        raise BadRequest(
            f"the message would expire before it is stored ({where}ttlMs)", field=f"{where}ttlMs"
        )
    return Placement(target, label, start, deadline, priority or 0)


def held_payload(stored: StoredMessage, order_key: str | None) -> bytes:
    """What the scheduler holds: the message encoded once, as the JSON object it will be stored
    as, without its QoS fields (each destination adds its own when it comes due)."""
    bare = msgspec.structs.replace(stored, priority=None, deliver_at_ms=None, deadline_ms=None)
    return _encode_held((_encode_json(bare), order_key or "", stored.timestamp_ms))


def held_message(payload: bytes) -> StoredMessage:
    """The message a held payload carries (without its destinations' QoS fields)."""
    body = _decode_held(payload)[0]
    assert isinstance(body, bytes)
    return decode_stored(body)


def stored_message(encoded: Encoded) -> StoredMessage:
    return decode_stored(encoded[1])


def delivered_form(payload: bytes, d: Destination) -> tuple[Encoded, str | None]:
    """A held message as stored for destination `d`, and its order key: its JSON object with the
    destination's QoS fields appended, byte for byte what encoding the whole message gives."""
    held: list[Any] = _decode_held(payload)
    body, order_key = held[0], held[1]
    assert isinstance(body, bytes) and isinstance(order_key, str)
    if len(held) == 2:  # held before the timestamp was kept beside the JSON: decode once
        stored = decode_stored(body)
        bare = msgspec.structs.replace(stored, priority=None, deliver_at_ms=None, deadline_ms=None)
        body, timestamp_ms = _encode_json(bare), stored.timestamp_ms
    else:
        stamp = held[2]
        assert isinstance(stamp, int)
        timestamp_ms = stamp
    qos = b',"priority":%d' % d.priority if d.priority else b""
    qos += b',"deliverAt":%d' % d.deliver_at_ms
    if d.deadline_ms:
        qos += b',"deadline":%d' % d.deadline_ms
    return (timestamp_ms, body[:-1] + qos + b"}"), order_key or None


# (stored message, order key, priority) per target
Deliver = Callable[[dict[str, list[tuple[Encoded, str | None, int]]]], Awaitable[None]]


class DeliveryLoop:
    """Moves due destinations from the scheduler into their queues, highest priority first
    (the scheduler orders what it hands out); expired ones are dropped and counted."""

    def __init__(
        self,
        scheduler: Scheduler,
        deliver: Deliver,
        on_expired: Callable[[Due], None],
        on_failure: Callable[[str], None],
    ) -> None:
        self.scheduler = scheduler
        self.deliver = deliver
        self.on_expired = on_expired
        self.on_failure = on_failure  # counted and shown in /healthz; the loop goes on

    async def run(self) -> None:
        while True:
            try:
                if not await self.step():
                    await self._sleep()
            except asyncio.CancelledError:
                raise
            except MqgateError as exc:  # the store or Redis is down: claims expire, try again
                self.on_failure(exc.message)
                await asyncio.sleep(IDLE_RECHECK_S)
            except Exception as exc:
                log.exception("delivery of scheduled messages failed")
                self.on_failure(repr(exc))
                await asyncio.sleep(IDLE_RECHECK_S)

    async def step(self) -> int:
        """Deliver what is due now; return how many destinations were handled."""
        dues = await self.scheduler.claim_due(_now_ms(), DELIVERY_BATCH, CLAIM_MS)
        if not dues:
            return 0
        by_topic: dict[str, list[tuple[Encoded, str | None, int]]] = {}
        for due in dues:
            if due.expired:
                self.on_expired(due)
                continue
            d = due.destination
            encoded, order_key = delivered_form(due.payload, d)
            by_topic.setdefault(d.target, []).append((encoded, order_key, d.priority))
        if by_topic:
            await self.deliver(by_topic)
        await self.scheduler.settle([(d.seq, d.index) for d in dues])
        return len(dues)

    async def _sleep(self) -> None:
        nxt = await self.scheduler.next_due_ms()
        timeout = IDLE_RECHECK_S if nxt is None else min(max((nxt - _now_ms()) / 1000, 0.0), IDLE_RECHECK_S)
        if timeout > 0:
            await self.scheduler.wait(timeout)


def _now_ms() -> int:
    return int(time.time() * 1000)
