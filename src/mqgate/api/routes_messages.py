"""Message-level consumption over HTTP (issue 30, `mode=message`): receive messages each with a
receipt handle, delete them or change their visibility by it (services/messages.py)."""

from __future__ import annotations

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.errors import BadRequest, Conflict
from mqgate.model import MODE_PUSH
from mqgate.registry.records import ConsumerRecord
from mqgate.services.gateway import Gateway
from mqgate.services.messages import Delivery
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


def received_body(deliveries: list[Delivery], broker: str) -> bytes:
    """The answer assembled from the stored JSON objects (as a pull's is): each gets where it
    is and its receipt appended in place of its closing brace, nothing decoded again."""
    items = []
    b = msgspec.json.encode(broker)
    for d in deliveries:
        source = b',"source":' + msgspec.json.encode(d.source) if d.source != d.topic else b""
        items.append(
            d.raw[:-1] + b',"broker":%b%b,"queue":%d,"offset":%d,"receiptHandle":"%b","receiveCount":%d,'
            b'"firstReceiveTime":%d}'
            % (b, source, d.queue, d.offset, d.receipt.encode(), d.receives, d.first_ms)
        )
    return b'{"status":200,"message":"ok","result":{"messages":[%b]}}' % b",".join(items)


def _not_push(c: ConsumerRecord) -> None:
    if c.mode == MODE_PUSH:
        raise BadRequest(
            f"consumer {c.name} is a push consumer: the gateway delivers to it", field="consumer"
        )


class MessageRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def receive(self, req: Request) -> Response:
        inp: s.ReceiveIn = req.input
        _not_push(req.caller)
        got = await self.gw.messages.receive(
            req.caller, max_count=inp.max, wait_s=inp.wait, visibility_s=inp.visibility
        )
        return Response(body=received_body(got, self.gw.ctx.store.broker))

    async def delete(self, req: Request) -> Response:
        inp: s.ReceiptsIn = req.input
        _not_push(req.caller)
        outcomes = await self.gw.messages.delete_many(req.caller, list(inp.receipt_handles))
        return Response(a.MessagesDeletedOut(outcomes=list(outcomes)))

    async def visibility(self, req: Request) -> Response:
        inp: s.VisibilityIn = req.input
        _not_push(req.caller)
        outcome = await self.gw.messages.change_visibility(req.caller, inp.receipt_handle, inp.seconds)
        if outcome != "changed":
            raise Conflict(f"visibility not changed: {outcome.replace('_', ' ')}", field="receiptHandle",
                           code=outcome)  # fmt: skip
        return Response(a.VisibilityOut(outcome=outcome))

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/mq/receive", self.receive, "consumer",
                  "Receive messages, each hidden until deleted or its visibility ends (mode=message)",
                  s.ReceiveIn, a.ReceiveOut, (404, 507)),
            Route("POST", "/mq/delete", self.delete, "consumer",
                  "Delete received messages by their receipt handles (mode=message)",
                  s.ReceiptsIn, a.MessagesDeletedOut, (507,)),
            Route("POST", "/mq/visibility", self.visibility, "consumer",
                  "Hide a received message longer, or show it again at once (mode=message)",
                  s.VisibilityIn, a.VisibilityOut, (409, 507)),
        ]  # fmt: skip
