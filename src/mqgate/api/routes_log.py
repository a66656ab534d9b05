"""Reading the log by offset and committing a reader's own progress (SPEC D1), and the
gateway's own endpoints: health, metrics, this API's OpenAPI document."""

from __future__ import annotations

import hmac
import os
from typing import Final

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.api.auth import Admin
from mqgate.errors import BadRequest, Unauthorized
from mqgate.registry.records import ConsumerRecord
from mqgate.services.gateway import Gateway
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

# How long a scrape waits for lag gauges of changes already made (an ack just answered).
METRICS_SETTLE_S: Final = 0.5


def offsets_of(value: dict[str, object]) -> dict[int, int]:
    """{"<store queue>": next offset}, e.g. {"0": 120}; each refusal names the entry."""
    if not value:
        raise BadRequest('offsets must be a non-empty object such as {"0": 120}', field="offsets")
    if len(value) > s.MAX_STORE_QUEUES:
        raise BadRequest(f"offsets names at most {s.MAX_STORE_QUEUES} queues", field="offsets")
    out: dict[int, int] = {}
    for key, offset in value.items():
        where = f"offsets.{key}"
        if not (key.isdigit() and len(key) <= 6):
            raise BadRequest("queue numbers must be decimal strings", field=where)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= s.MAX_OFFSET:
            raise BadRequest(f"offset must be an integer between 0 and {s.MAX_OFFSET}", field=where)
        out[int(key)] = offset
    return out


class LogRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def bounds(self, req: Request) -> Response:
        topic = req.input.topic
        bounds = await self.gw.log_reading.bounds(topic)
        queues = [a.BoundOut(queue=b.queue, min=b.min, max=b.max) for b in bounds]
        return Response(a.BoundsOut(topic=topic, broker=self.gw.ctx.store.broker, queues=queues))

    async def read(self, req: Request) -> Response:
        inp: s.ReadIn = req.input
        reader = req.caller.name if isinstance(req.caller, ConsumerRecord) else "admin"
        start, raw = await self.gw.log_reading.read(inp.topic, inp.queue, inp.offset, inp.max, reader)
        broker = msgspec.json.encode(self.gw.ctx.store.broker)
        head = b',"broker":' + broker + b',"queue":%d,"offset":' % inp.queue
        items = b",".join([payload[:-1] + head + b"%d}" % o for o, payload in raw])
        end = raw[-1][0] + 1 if raw else start
        return Response(
            body=b'{"status":200,"message":"ok","result":{"topic":%b,"broker":%b,"queue":%d,'
            b'"offset":%d,"next":%d,"msgList":[%b]}}'
            % (msgspec.json.encode(inp.topic), broker, inp.queue, start, end, items)
        )

    async def commit(self, req: Request) -> Response:
        inp: s.CommitIn = req.input
        consumer = req.caller
        if isinstance(consumer, Admin):
            consumer = await self.gw.topology.consumer(inp.consumer)
        committed = await self.gw.log_reading.commit(consumer, offsets_of(inp.offsets))
        queues = [a.CommittedOut(queue=q, committed=c) for q, c in committed.items()]
        return Response(a.CommitOut(consumer=inp.consumer, queues=queues))

    async def healthz(self, req: Request) -> Response:
        # 200 while serving, degraded or not: the detail says what is wrong.
        health = self.gw.ctx.health.snapshot()
        return Response(
            a.HealthOut(
                healthy=True,
                broker=self.gw.ctx.store.broker,
                pid=os.getpid(),
                status=health["status"],
                degraded=health["degraded"],
                faults=[a.FaultOut(**f) for f in health["faults"]],
            )
        )

    async def metrics(self, req: Request) -> Response:
        """Renders gauges kept current by the operations that move them: no store reads here.
        It waits (briefly) only for the lag of changes already made, e.g. an ack just answered."""
        wanted = self.gw.ctx.settings.metrics_token
        if wanted and not hmac.compare_digest((req.bearer or "").encode(), wanted.encode()):
            raise Unauthorized("metrics need the metrics token (Authorization: Bearer ...)")
        await self.gw.operations.lag_settled(METRICS_SETTLE_S)
        return Response(body=self.gw.ctx.metrics.render(), content_type=b"text/plain; version=0.0.4")

    def routes(self) -> list[Route]:
        return [
            Route(
                "GET",
                "/mq/bounds",
                self.bounds,
                "reader",
                "Oldest and next offset of each of a topic's store queues (admin or a consumer of the topic)",
                s.BoundsIn,
                a.BoundsOut,
                (404,),
                body="none",
            ),
            Route(
                "GET",
                "/mq/read",
                self.read,
                "reader",
                "Read a store queue by offset, without locks or commits (admin or a consumer of the topic)",
                s.ReadIn,
                a.ReadOut,
                (404,),
                body="none",
            ),
            Route(
                "POST",
                "/mq/commit",
                self.commit,
                "reader",
                "Raise a cluster consumer's committed offsets, never lowering one (its token or admin)",
                s.CommitIn,
                a.CommitOut,
                (404, 507),
            ),
            Route("GET", "/healthz", self.healthz, "none", "Liveness", None, a.HealthOut, body="none"),
            Route(
                "GET",
                "/metrics",
                self.metrics,
                "none",
                "Prometheus metrics (text); the metrics token if the gateway sets one",
                None,
                None,
                (401,),
                body="none",
            ),
        ]
