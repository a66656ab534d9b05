"""The operations of Alibaba Cloud MQ's HTTP API on mqgate's own parts (issue 32, docs/ALIYUN.md).

- An instance (`ns`) is the access key's project: another instance is AccessDenied; none is the
  key's project. A topic is the project's topic of that name (another project's, or a name of a
  compatibility edge, `sqs.…` and `aliyun.…`, is TopicNotExist, as one that never was).
- A publish is a produce to the topic (its tag, keys and properties as the message's; a sharding
  key as its order key, so a key's messages share one queue; `__STARTDELIVERTIME` through the
  scheduler), by the producer `aliyun.<key name>` (not registered: the name its messages carry).
- A group (`consumer`) is the `mode=message` consumer of the topic registered under the group id
  (or, for a group on several topics, under `<group id>.<topic>`): a consume is its receive
  (`trans=order`: ordered, a queue's batch at a time), an ack its deletes by receipt handle.
  A tag filter is the group's subscription: a message of no tag it names is deleted for the
  group as it is met, as RocketMQ treats a message its group's subscription filters out.
- Transactional (half) messages: a publish with `__TransCheckT`, `trans=commit|rollback|pop`,
  on transactions/ (the half messages the native `/mq/half` routes share).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Final

from mqgate.accesskeys.service import AccessKey
from mqgate.aliyun import errors
from mqgate.aliyun import xml as mqxml
from mqgate.aliyun.errors import AliyunError
from mqgate.aliyun.protocol import AliyunRequest
from mqgate.errors import BadRequest, Conflict, Forbidden, MqgateError, NotFound
from mqgate.model import MODE_MESSAGE, StoredMessage
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.services.context import now_ms
from mqgate.services.gateway import Gateway
from mqgate.services.messages import Delivery
from mqgate.transactions.half import (
    BAD_HANDLE,
    DEFAULT_CHECK_INTERVAL_S,
    DEFAULT_MAX_CHECKS,
    MAX_CHECK_AFTER_S,
    OP_COMMIT,
    OP_ROLLBACK,
)
from mqgate.transactions.service import HalfMessages, PlainMessage

PRODUCER_PREFIX: Final = "aliyun."
# Topics no request of this API may name: the compatibility edges' own.
HIDDEN_TOPIC_PREFIXES: Final = ("sqs.", "aliyun.", "%")
# Properties the gateway and its features add: never answered as the message's.
INTERNAL_PROPERTY_PREFIXES: Final = ("aliyun.", "sqs.", "dlq.", "mq.", "traceparent", "tracestate")
MAX_FILTERED_ROUNDS: Final = 8  # receives of one consume whose batches the tag filter all took
MAX_START_DELIVER_AHEAD_MS: Final = 40 * 24 * 3600 * 1000  # the service's longest delay: 40 days
_NO_GROUP: Final = (
    "is not a mode=message consumer of the topic: register the group id as one "
    "(POST /admin/consumers with mode=message), see docs/ALIYUN.md"
)


def _not_exist(message: str) -> AliyunError:
    return AliyunError(errors.MESSAGE_NOT_EXIST, message)


def _argument(message: str, element: str) -> AliyunError:
    return AliyunError(errors.INVALID_ARGUMENT, message, element=element)


def answered_properties(m: StoredMessage) -> dict[str, str]:
    """A stored message's properties as a consume answers them: its keys as KEYS, the
    gateway's own left out."""
    out = {k: v for k, v in m.properties.items() if not k.startswith(INTERNAL_PROPERTY_PREFIXES)}
    if m.keys:
        out[mqxml.KEYS] = " ".join(m.keys)
    return out


def _consumed(d: Delivery, next_ms: int) -> mqxml.ConsumedMessage:
    m = d.message
    return mqxml.ConsumedMessage(
        message_id=m.msg_id,
        receipt_handle=d.receipt,
        body=m.body,
        publish_time_ms=m.timestamp_ms,
        first_consume_time_ms=d.first_ms,
        next_consume_time_ms=next_ms,
        consumed_times=d.receives,
        tag=m.tags[0] if m.tags else "",
        properties=answered_properties(m),
    )


def encode_consumed(messages: list[mqxml.ConsumedMessage]) -> tuple[bytes, list[int]]:
    """The consume answer, and the indexes of messages XML cannot carry (left out of it: an
    empty body, a character XML 1.0 has not). They stay in flight, come back after their
    invisible time and, past the group's maxAttempts, go to its dead-letter topic."""
    try:
        return mqxml.encode_consume_result(messages), []
    except mqxml.NotXmlText:
        pass
    kept: list[mqxml.ConsumedMessage] = []
    left: list[int] = []
    for i, m in enumerate(messages):
        try:
            mqxml.encode_consume_result([m])
            kept.append(m)
        except mqxml.NotXmlText:
            left.append(i)
    return (mqxml.encode_consume_result(kept) if kept else b""), left


class AliyunService:
    def __init__(
        self,
        gateway: Gateway,
        *,
        max_body_bytes: int,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        max_checks: int = DEFAULT_MAX_CHECKS,
        halves: HalfMessages | None = None,
    ) -> None:
        self.gw = gateway
        self.max_body_bytes = max_body_bytes
        self.check_interval_s = check_interval_s
        self.max_checks = max_checks
        # The gateway's one: the native routes' half messages are the same (one ledger, one turn).
        self.halves = halves or HalfMessages(
            gateway, check_interval_s=check_interval_s, max_checks=max_checks
        )

    async def handle(
        self, req: AliyunRequest, key: AccessKey, body: bytes, request_id: str = ""
    ) -> tuple[int, bytes]:
        """The operation's status and answer body; an AliyunError for a refusal. `request_id`
        (the answer's x-mq-request-id) goes with a consume's deliveries to their traces."""
        t = await self._topic(req, key)
        if req.operation == "publish":
            return 201, await self.publish(t, key, body)
        if req.operation == "consume":
            if req.trans == "pop":
                return 200, await self.pop_half(req, t)
            return 200, await self.consume(req, t, request_id)
        handles = mqxml.decode_ack(body)
        if req.trans in ("commit", "rollback"):
            failures = await self.decide(t, key, handles, OP_COMMIT if req.trans == "commit" else OP_ROLLBACK)
        else:
            failures = await self.ack(req, t, handles)
        if failures:
            return errors.ACK_PARTIAL_FAILURE_STATUS, mqxml.encode_ack_errors(failures)
        return 204, b""

    async def _idle(self, wait_s: float) -> None:
        """A long poll that can find nothing: its time, cut short when the gateway stops."""
        await self.halves.idle(wait_s)

    # --- names ----------------------------------------------------------------------------

    async def _topic(self, req: AliyunRequest, key: AccessKey) -> TopicRecord:
        if req.instance and req.instance != key.project:
            raise AliyunError(
                errors.ACCESS_DENIED,
                f"The AccessKey may not use the instance {req.instance!r}: its instance is its "
                f"project, {key.project!r}.",
                element="ns",
            )
        missing = AliyunError(errors.TOPIC_NOT_EXIST, element="topic")
        if req.topic.startswith(HIDDEN_TOPIC_PREFIXES):
            raise missing
        try:
            t = await self.gw.topology.topic(req.topic)
        except NotFound:
            raise missing from None
        if t.project != key.project:
            raise missing
        return t

    async def _group(self, t: TopicRecord, group: str) -> ConsumerRecord:
        registry = self.gw.ctx.registry
        names = (group, f"{group}.{t.name}")
        found = [registry.consumer(n) for n in names]
        if all(c is None or c.topic != t.name for c in found) and await registry.refresh_on_miss():
            found = [registry.consumer(n) for n in names]
        for c in found:
            if c is not None and c.topic == t.name:
                if c.mode != MODE_MESSAGE:
                    raise _argument(f"The group {group} {_NO_GROUP} (it is mode={c.mode}).", "consumer")
                return c
        raise _argument(f"The group {group} {_NO_GROUP}.", "consumer")

    @staticmethod
    def _producer(topic: str, key: AccessKey) -> ProducerRecord:
        return ProducerRecord(PRODUCER_PREFIX + key.name, topic, "", 0)

    # --- publish --------------------------------------------------------------------------

    def _message(self, p: mqxml.PublishRequest, now: int) -> PlainMessage:
        for name in p.user_properties:
            if name.startswith(INTERNAL_PROPERTY_PREFIXES):
                raise _argument(f"The property name {name[:64]!r} is reserved by the gateway.", "Properties")
        deliver_at = self._deliver_at(p.start_deliver_time_ms, now)
        properties = {k: v for k, v in p.properties.items() if k != mqxml.KEYS}
        return PlainMessage(
            p.body,
            properties,
            list(p.keys),
            [p.tag] if p.tag else [],
            order_key=p.sharding_key or None,
            deliver_at=deliver_at,
        )

    @staticmethod
    def _deliver_at(start_ms: int | None, now: int) -> int | None:
        if start_ms is None or start_ms <= now:
            return None
        if start_ms - now > MAX_START_DELIVER_AHEAD_MS:
            raise _argument(
                f"{mqxml.START_DELIVER_TIME} may be at most 40 days ahead ({MAX_START_DELIVER_AHEAD_MS} ms).",
                "Properties",
            )
        return start_ms

    async def publish(self, t: TopicRecord, key: AccessKey, body: bytes) -> bytes:
        p = mqxml.decode_publish(body, max_body_bytes=self.max_body_bytes)
        now = now_ms()
        message = self._message(p, now)
        if p.trans_check_immunity_s is not None:
            return await self._publish_half(t, key, p, message, now)
        receipts = await self.gw.producing.produce(self._producer(t.name, key), [message])
        return mqxml.encode_publish_result(receipts[0].msg_id, mqxml.message_body_md5(p.body))

    # --- consume and ack ------------------------------------------------------------------

    async def consume(self, req: AliyunRequest, t: TopicRecord, request_id: str = "") -> bytes:
        c = await self._group(t, req.group)
        messages = self.gw.messages
        if c.paused:  # a paused group gets nothing: after its long poll, as an empty topic
            await self._idle(req.wait_s)
            raise _not_exist("There is no message to consume: the group is paused.")
        deadline = time.monotonic() + req.wait_s
        rounds = 0
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            got = await messages.receive(
                c,
                max_count=req.max_messages,
                wait_s=remaining,
                ordered=req.trans == "order",
                request_id=request_id,
            )
            if not got:
                break
            next_ms = now_ms() + int(c.lock_timeout_s * 1000)
            wanted: list[mqxml.ConsumedMessage] = []
            filtered: list[str] = []
            for d in got:
                if req.tags is not None and req.tags.isdisjoint(d.message.tags):
                    filtered.append(d.receipt)
                else:
                    wanted.append(_consumed(d, next_ms))
            if filtered:  # not the group's subscription: consumed for it
                await asyncio.gather(*(messages.delete(c, r) for r in filtered))
                self.gw.ctx.store.wake(t.name, consumer=c.name, count=1)
            if wanted:
                answer, _ = encode_consumed(wanted)
                if answer:
                    return answer
            rounds += 1
            # Past the long poll, only a batch all filtered out earns another look, a few times.
            if time.monotonic() >= deadline and (not filtered or rounds >= MAX_FILTERED_ROUNDS):
                break
        raise _not_exist("There is no message to consume.")

    async def ack(
        self, req: AliyunRequest, t: TopicRecord, handles: tuple[str, ...]
    ) -> list[mqxml.AckFailure]:
        c = await self._group(t, req.group)
        messages = self.gw.messages

        async def one(handle: str) -> mqxml.AckFailure | None:
            try:
                outcome = await messages.delete(c, handle)
            except MqgateError as exc:
                if exc.http_status >= 500:
                    raise
                return mqxml.AckFailure(handle, errors.RECEIPT_HANDLE_ERROR)
            if outcome == "stale_receipt":
                return mqxml.AckFailure(
                    handle,
                    errors.MESSAGE_NOT_EXIST,
                    "The receipt handle has expired: the message was consumed again since.",
                )
            return None

        results = await asyncio.gather(*(one(h) for h in handles))
        if len(results) > sum(1 for r in results if r is not None):
            # A queue's next ordered batch may go out now: a waiting consume takes it.
            self.gw.ctx.store.wake(t.name, consumer=c.name, count=1)
        return [r for r in results if r is not None]

    # --- transactional (half) messages: transactions/ --------------------------------------

    async def _publish_half(
        self, t: TopicRecord, key: AccessKey, p: mqxml.PublishRequest, message: PlainMessage, now: int
    ) -> bytes:
        immunity = p.trans_check_immunity_s or 0
        if immunity > MAX_CHECK_AFTER_S:
            raise _argument(
                f"{mqxml.TRANS_CHECK_IMMUNITY_TIME} may be at most {MAX_CHECK_AFTER_S} seconds.",
                "Properties",
            )
        half = PlainMessage(message.body, message.properties, message.keys, message.tags)
        with _half_errors():
            (put,) = await self.halves.put(t, self._producer(t.name, key).name, [half], immunity)
        return mqxml.encode_publish_result(put.msg_id, mqxml.message_body_md5(p.body), put.handle)

    async def pop_half(self, req: AliyunRequest, t: TopicRecord) -> bytes:
        """The topic's half messages due for a check, each with a new handle."""
        halves = self.halves
        deadline = time.monotonic() + req.wait_s
        while True:
            got = await halves.due(t, req.max_messages, max(0.0, deadline - time.monotonic()))
            if not got:
                break
            c = await halves.consumer(t)
            next_ms = now_ms() + int((c.lock_timeout_s if c is not None else halves.check_interval_s) * 1000)
            answer, _ = encode_consumed([_consumed(d, next_ms) for d in got])
            if answer:
                return answer
            if time.monotonic() >= deadline:
                break
        raise _not_exist("There is no half message to check.")

    def _committed(self, m: StoredMessage) -> PlainMessage:
        """A half message as its commit publishes it: no longer transactional (without
        __TransCheckT), its delay and sharding key from its properties."""
        properties = {
            k: v
            for k, v in m.properties.items()
            if not k.startswith(INTERNAL_PROPERTY_PREFIXES) and k != mqxml.TRANS_CHECK_IMMUNITY_TIME
        }
        start = properties.get(mqxml.START_DELIVER_TIME)
        return PlainMessage(
            m.body,
            properties,
            list(m.keys),
            list(m.tags),
            order_key=properties.get(mqxml.SHARDING_KEY) or None,
            deliver_at=self._deliver_at(int(start) if start and start.isdigit() else None, now_ms()),
        )

    async def decide(
        self, t: TopicRecord, key: AccessKey, handles: tuple[str, ...], op: str
    ) -> list[mqxml.AckFailure]:
        """Commit or roll back the half message of each handle."""
        failures: list[mqxml.AckFailure] = []
        producer = self._producer(t.name, key)
        for handle in handles:
            try:
                with _half_errors():
                    await self.halves.decide(t, producer, handle, op, self._committed, "ReceiptHandle")
            except AliyunError as exc:
                failures.append(mqxml.AckFailure(handle, exc.kind, exc.message))
        return failures


@contextlib.contextmanager
def _half_errors() -> Iterator[None]:
    """transactions/' refusals as this API's errors."""
    try:
        yield
    except AliyunError:
        raise
    except BadRequest as exc:
        if exc.code == BAD_HANDLE:
            raise AliyunError(errors.RECEIPT_HANDLE_ERROR, element="ReceiptHandle") from None
        raise _argument(exc.message[:1].upper() + exc.message[1:] + ".", exc.field or "topic") from None
    except (NotFound, Conflict) as exc:
        raise _not_exist(exc.message[:1].upper() + exc.message[1:] + ".") from None
    except Forbidden as exc:
        raise AliyunError(errors.ACCESS_DENIED, exc.message[:1].upper() + exc.message[1:] + ".") from None
