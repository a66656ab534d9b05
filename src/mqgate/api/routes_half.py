"""Half (transactional) messages over the native API (issue 32; docs/PROTOCOL.md, "Half
messages"): put half messages to the producer's topic, check the ones left open, commit or roll
them back by handle. transactions/ keeps them; the Aliyun API's half messages are the same ones.
A message's QoS (order key, deliverAt or delayMs, ttlMs, priority) waits in the half message's
own properties and applies from its commit."""

from __future__ import annotations

from typing import Final

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.errors import BadRequest
from mqgate.model import StoredMessage
from mqgate.names import INTERNAL_PREFIXES, RESERVED_PREFIXES
from mqgate.registry.records import ProducerRecord, TopicRecord
from mqgate.services.context import now_ms
from mqgate.services.gateway import Gateway
from mqgate.transactions.half import MAX_TOPIC_CHARS, OP_COMMIT, OP_ROLLBACK, PROPERTY_PREFIX
from mqgate.transactions.service import HalfMessages, PlainMessage, own_properties
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

# The QoS of a half message, kept until its commit (under the transaction's own prefix: never a
# committed message's property, never answered).
ORDER_KEY: Final = PROPERTY_PREFIX + "orderKey"
DELIVER_AT: Final = PROPERTY_PREFIX + "deliverAt"
DELAY_MS: Final = PROPERTY_PREFIX + "delayMs"
TTL_MS: Final = PROPERTY_PREFIX + "ttlMs"
PRIORITY: Final = PROPERTY_PREFIX + "priority"


def _int(m: StoredMessage, name: str) -> int | None:
    value = m.properties.get(name)
    return int(value) if value is not None and value.isdigit() else None


def committed(m: StoredMessage) -> PlainMessage:
    """The message a commit publishes: the half message's body, keys, tags and properties, its
    QoS from the commit (a deliverAt already past: at once; delayMs counted from the commit)."""
    deliver_at = _int(m, DELIVER_AT)
    return PlainMessage(
        m.body,
        own_properties(m),
        list(m.keys),
        list(m.tags),
        order_key=m.properties.get(ORDER_KEY),
        deliver_at=deliver_at if deliver_at is not None and deliver_at > now_ms() else None,
        delay_ms=_int(m, DELAY_MS),
        ttl_ms=_int(m, TTL_MS),
        priority=_int(m, PRIORITY),
    )


def _half(m: s.MessageIn, i: int, t: TopicRecord) -> PlainMessage:
    field = f"messages[{i}]."
    if m.destinations is not None:
        raise BadRequest("a half message goes to the producer's topic: it names no destinations",
                         field=field + "destinations")  # fmt: skip
    for name in m.properties:
        if name.startswith(PROPERTY_PREFIX):
            raise BadRequest(f"property names starting with {PROPERTY_PREFIX!r} are the gateway's",
                             field=field + "properties")  # fmt: skip
    if m.priority is not None and m.priority > t.max_priority:
        raise BadRequest(f"priority {m.priority} is above the max priority ({t.max_priority}) of "
                         f"topic {t.name}", field=field + "priority")  # fmt: skip
    properties = dict(m.properties)
    for name, value in (
        (ORDER_KEY, m.order_key), (DELIVER_AT, m.deliver_at), (DELAY_MS, m.delay_ms), (TTL_MS, m.ttl_ms),
        (PRIORITY, m.priority),
    ):  # fmt: skip
        if value is not None:
            properties[name] = str(value)
    return PlainMessage(m.body, properties, list(m.keys), list(m.tags))


class HalfRoutes:
    def __init__(self, gateway: Gateway, halves: HalfMessages) -> None:
        self.gw = gateway
        self.halves = halves

    async def _topic(self, producer: ProducerRecord) -> TopicRecord:
        name = producer.topic
        if name.startswith((*INTERNAL_PREFIXES, *RESERVED_PREFIXES)):
            raise BadRequest(f"the producer's topic {name} is the gateway's own: it takes no half messages",
                             field="producer")  # fmt: skip
        if len(name) > MAX_TOPIC_CHARS:
            raise BadRequest(f"half messages need a topic name of at most {MAX_TOPIC_CHARS} characters; "
                             f"the producer's is {name}", field="producer")  # fmt: skip
        return await self.gw.topology.topic(name)

    async def put(self, req: Request) -> Response:
        inp: s.HalfIn = req.input
        t = await self._topic(req.caller)
        halves = [_half(m, i, t) for i, m in enumerate(inp.messages)]
        put = await self.halves.put(t, req.caller.name, halves, inp.check_after_s)
        return Response(
            a.HalvesOut(
                messages=[
                    a.HalfPutOut(message_id=p.msg_id, handle=p.handle, check_at=p.check_at) for p in put
                ]
            )
        )

    async def check(self, req: Request) -> Response:
        inp: s.HalfCheckIn = req.input
        t = await self._topic(req.caller)
        due = await self.halves.due(t, inp.max, inp.wait)
        return Response(
            a.HalfCheckOut(
                messages=[
                    a.HalfCheckedOut(
                        message_id=d.message.msg_id,
                        handle=d.receipt,
                        timestamp=d.message.timestamp_ms,
                        producer=d.message.producer,
                        message=d.message.body,
                        keys=d.message.keys,
                        tags=d.message.tags,
                        properties=own_properties(d.message),
                        receive_count=d.receives,
                    )
                    for d in due
                ]
            )
        )

    async def _decide(self, req: Request, op: str) -> Response:
        inp: s.HalfDecideIn = req.input
        t = await self._topic(req.caller)
        msg_id, receipts = await self.halves.decide(t, req.caller, inp.handle, op, committed)
        if op == OP_COMMIT:
            return Response(a.HalfDecidedOut(message_id=msg_id, outcome="committed", receipts=receipts))
        return Response(a.HalfDecidedOut(message_id=msg_id, outcome="rolled_back"))

    async def commit(self, req: Request) -> Response:
        return await self._decide(req, OP_COMMIT)

    async def rollback(self, req: Request) -> Response:
        return await self._decide(req, OP_ROLLBACK)

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/mq/half", self.put, "producer",
                  "Put half (transactional) messages to the producer's topic: stored, not delivered "
                  "until committed; a handle each", s.HalfIn, a.HalvesOut, (404, 413, 507)),
            Route("POST", "/mq/half/check", self.check, "producer",
                  "The producer's topic's half messages left open past their check time, each with "
                  "a new handle", s.HalfCheckIn, a.HalfCheckOut, (404, 507)),
            Route("POST", "/mq/half/commit", self.commit, "producer",
                  "Commit a half message by its handle: delivered from now as an ordinary message",
                  s.HalfDecideIn, a.HalfDecidedOut, (404, 409, 507)),
            Route("POST", "/mq/half/rollback", self.rollback, "producer",
                  "Roll back a half message by its handle: never delivered",
                  s.HalfDecideIn, a.HalfDecidedOut, (404, 409, 507)),
        ]  # fmt: skip
