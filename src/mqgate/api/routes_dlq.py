"""Dead letters as an operator handles them (their state, redrive to the original topic) and
browsing any queue without consuming (docs/PROTOCOL.md, "Dead letters" and "Browse")."""

from __future__ import annotations

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.api.routes_admin import out
from mqgate.services.browse import Query
from mqgate.services.deadletters import Selection
from mqgate.services.gateway import Gateway
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


class DeadLetterRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def state(self, req: Request) -> Response:
        return Response(out(await self.gw.dead_letters.state(req.input.name), a.DeadLettersOut))

    async def redrive(self, req: Request) -> Response:
        inp: s.RedriveIn = req.input
        selection = Selection(
            offset=inp.offset,
            message_id=inp.message_id,
            reason=inp.reason,
            key=inp.key,
            since_ms=inp.since,
            until_ms=inp.until,
            source=inp.source,
            queue=inp.queue,
            everything=inp.everything,
            scan=inp.max,
            start=inp.start,
            copy=inp.copy,
            rate_per_s=inp.messages_per_second,
        )
        return Response(out(await self.gw.dead_letters.redrive(inp.name, selection), a.RedriveOut))

    async def browse(self, req: Request) -> Response:
        inp: s.BrowseIn = req.input
        query = Query(inp.offset, inp.timestamp, inp.key, inp.message_id, inp.max, inp.scan)
        page = await self.gw.browsing.browse(inp.topic, inp.queue, query)
        # Records are sent as stored, with their delivery fields appended, as /mq/read does.
        broker = msgspec.json.encode(self.gw.ctx.store.broker)
        head = b',"broker":' + broker + b',"queue":%d,"offset":' % inp.queue
        items = b",".join([payload[:-1] + head + b"%d}" % o for o, payload in page.records])
        limit = b',"scanLimit":%d' % inp.scan if query.searching else b""
        return Response(
            body=b'{"status":200,"message":"ok","result":{"topic":%b,"broker":%b,"queue":%d,'
            b'"offset":%d,"next":%d,"scanned":%d%b,"msgList":[%b]}}'
            % (
                msgspec.json.encode(inp.topic),
                broker,
                inp.queue,
                page.start,
                page.next,
                page.scanned,
                limit,
                items,
            )
        )

    def routes(self) -> list[Route]:
        return [
            Route(
                "GET",
                "/admin/consumers/{name}/dead-letters",
                self.state,
                "admin",
                "A consumer's dead-letter topic: its offsets and redrive position",
                s.NamedIn,
                a.DeadLettersOut,
                (404, 507),
                body="none",
            ),
            Route(
                "POST",
                "/admin/consumers/{name}/dead-letters/redrive",
                self.redrive,
                "admin",
                "Copy dead letters (one, a filter, or all) back to their consumer, each once (or copy only)",
                s.RedriveIn,
                a.RedriveOut,
                (404, 409, 507),
            ),
            Route(
                "GET",
                "/mq/browse",
                self.browse,
                "reader",
                "Browse a store queue by offset, time, key or message id, without consuming "
                "(admin or a consumer of the topic)",
                s.BrowseIn,
                a.BrowseOut,
                (404,),
                body="none",
            ),
        ]
