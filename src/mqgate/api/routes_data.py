"""The data path: produce, pull, ack, release, extend (SPEC G3-G6, G8)."""

from __future__ import annotations

from typing import Final

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.core.tokens import AckToken
from mqgate.model import Receipt
from mqgate.registry.records import ConsumerRecord
from mqgate.services.consume import FOUND, RATE_LIMITED, PullResult
from mqgate.services.gateway import Gateway
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

_STATUS_MESSAGE: Final = {FOUND: "ok"}


def found_body(result: PullResult, broker: str) -> bytes:
    """The FOUND answer, assembled from the stored JSON objects: each gets its delivery
    fields appended in place of its closing brace, nothing is decoded or re-encoded."""
    assert result.messages is not None and result.request_id is not None
    source = b',"source":' + msgspec.json.encode(result.source) if result.source else b""
    head = b',"broker":' + msgspec.json.encode(broker) + source + b',"queue":%d,"offset":' % result.queue
    tail = b',"reconsumeTimes":%d,"popTime":%d}' % (result.reconsume_times, result.pop_time_ms)
    # One formatting per message, its bytes then its delivery fields (a % in the broker's or
    # the source's name escaped; the tail is digits and names).
    item = b"%b" + head.replace(b"%", b"%%") + b"%d" + tail
    items = b",".join([item % (payload[:-1], offset) for offset, payload in result.messages])
    ack = b',"ack":%b' % msgspec.json.encode(result.ack) if result.ack is not None else b""
    return b'{"status":200,"message":"ok","result":{"status":"FOUND","requestId":"%b"%b,"msgList":[%b]}}' % (
        result.request_id.encode(),
        ack,
        items,
    )


def _traceparent(req: Request) -> str | None:
    """The W3C trace context of the request, kept with its messages (SPEC P6)."""
    value = req.headers.get(b"traceparent")
    return value.decode("latin-1") if value else None


class DataRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def produce(self, req: Request) -> Response:
        receipts = await self.gw.producing.produce(req.caller, [req.input], _traceparent(req))
        # One destination: its receipt, as always; several: one receipt per destination.
        return Response(receipts[0] if len(receipts) == 1 else {"receipts": receipts})

    async def produce_batch(self, req: Request) -> Response:
        receipts = await self.gw.producing.produce(req.caller, req.input.messages, _traceparent(req))
        return Response({"receipts": receipts})

    async def pull(self, req: Request) -> Response:
        inp: s.PullIn = req.input
        owner = f"{req.client_host}/{inp.client_id}" if inp.client_id else req.client_host
        result = await self.gw.consuming.pull(
            req.caller,
            client_id=inp.client_id,
            max_count=inp.max,
            wait_s=inp.wait,
            request_id=inp.request_id,
            owner=owner,
        )
        if result.status == FOUND and result.messages:
            return Response(body=found_body(result, self.gw.ctx.store.broker))
        answer = a.PullOut(status=result.status, request_id=None, ack=result.ack, msg_list=[])  # type: ignore[arg-type]
        if result.status == RATE_LIMITED:
            retry = max(1, round(result.retry_after_s + 0.5))
            return Response(
                answer, status=429, message="rate limited", headers=[(b"retry-after", str(retry).encode())]
            )
        return Response(answer, message=_STATUS_MESSAGE.get(result.status, result.status.lower()))

    async def _queue_of(self, c: ConsumerRecord, token: AckToken) -> tuple[int, str | None]:
        """(store queue, store topic if not the consumer's) of the queue a token's table index names."""
        slot = (await self.gw.topology.layout(c)).slot(token.queue)
        return slot.queue, (slot.topic if slot.topic != c.topic else None)

    async def ack(self, req: Request) -> Response:
        caller = req.caller
        await self.gw.consuming.ack(caller.consumer, caller.token)
        queue, source = await self._queue_of(caller.consumer, caller.token)
        return Response(a.AckOut(queue=queue, source=source, committed=caller.token.next_offset))

    async def release(self, req: Request) -> Response:
        caller = req.caller
        await self.gw.consuming.release(caller.consumer, caller.token)
        queue, source = await self._queue_of(caller.consumer, caller.token)
        return Response(a.AckOut(queue=queue, source=source, committed=caller.token.offset))

    async def extend(self, req: Request) -> Response:
        caller = req.caller
        seconds = req.input.seconds or caller.consumer.lock_timeout_s
        await self.gw.consuming.extend(caller.consumer, caller.token, seconds)
        queue, source = await self._queue_of(caller.consumer, caller.token)
        return Response(a.ExtendOut(queue=queue, source=source, extended_by_seconds=seconds))

    def routes(self) -> list[Route]:
        return [
            Route(
                "POST",
                "/mq/produce",
                self.produce,
                "producer",
                "Produce one message (SPEC G3, S1)",
                s.ProduceIn,
                Receipt,
                (404, 413, 507),
            ),
            Route(
                "POST",
                "/mq/produce/batch",
                self.produce_batch,
                "producer",
                "Produce a batch of messages",
                s.ProduceBatchIn,
                a.ReceiptsOut,
                (404, 413, 415, 507),
                body="json",
            ),
            Route(
                "GET",
                "/mq/message",
                self.pull,
                "consumer",
                "Pull a batch from one locked queue (SPEC G4)",
                s.PullIn,
                a.PullOut,
                (404, 429, 507),
                body="none",
            ),
            Route(
                "POST",
                "/mq/ack",
                self.ack,
                "token",
                "Commit a pulled batch (SPEC G5)",
                s.TokenIn,
                a.AckOut,
                (409, 507),
            ),
            Route(
                "POST",
                "/mq/release",
                self.release,
                "token",
                "Give a pulled batch back without commit: it is delivered again after a backoff (SPEC S5)",
                s.TokenIn,
                a.AckOut,
                (409, 507),
            ),
            Route(
                "POST",
                "/mq/extend",
                self.extend,
                "token",
                "Keep a pulled batch's lock longer",
                s.ExtendIn,
                a.ExtendOut,
                (409,),
            ),
        ]
