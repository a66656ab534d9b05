"""Purge (issue 29): skip a topic queue's backlog for every consumer of the topic, or a
consumer's backlog, by moving committed offsets to the queues' ends; a GET is the plan, with
the count each move skips (docs/PROTOCOL.md, "Purge"). The console's purge pages call the same
`Operations.purge_plan` and `Operations.purge`."""

from __future__ import annotations

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.api.paging import Paging
from mqgate.services.gateway import Gateway
from mqgate.services.operations import PurgePlan
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


def purge_out(plan: PurgePlan, paging: Paging) -> a.PurgeOut:
    moves = (
        a.PurgeMoveOut(
            consumer=m.consumer,
            client_id=m.client_id,
            source=m.source,
            queue=m.queue,
            committed=m.committed,
            end=m.end,
            skipped=m.skipped,
        )
        for m in plan.moves
    )
    return a.PurgeOut(
        topic=plan.topic,
        consumer=plan.consumer,
        queue=plan.queue,
        purged=plan.purged,
        skipped=plan.skipped,
        consumers=plan.consumers,
        moves=paging.fitting(moves, a.PURGE_MOVES_NAMED),
        moves_count=len(plan.moves),
    )


class PurgeRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.paging = Paging(gateway.ctx.settings.max_answer_bytes)

    async def topic_plan(self, req: Request) -> Response:
        inp: s.PurgePlanIn = req.input
        return Response(
            purge_out(await self.gw.operations.purge_plan(topic=inp.name, queue=inp.queue), self.paging)
        )

    async def topic(self, req: Request) -> Response:
        inp: s.PurgeIn = req.input
        plan = await self.gw.operations.purge(topic=inp.name, queue=inp.queue, confirm=inp.confirm)
        return Response(purge_out(plan, self.paging))

    async def consumer_plan(self, req: Request) -> Response:
        inp: s.PurgePlanIn = req.input
        plan = await self.gw.operations.purge_plan(consumer=inp.name, queue=inp.queue)
        return Response(purge_out(plan, self.paging))

    async def consumer(self, req: Request) -> Response:
        inp: s.PurgeIn = req.input
        plan = await self.gw.operations.purge(consumer=inp.name, queue=inp.queue, confirm=inp.confirm)
        return Response(purge_out(plan, self.paging))

    def routes(self) -> list[Route]:
        topic, consumer = "/admin/topics/{name}/purge", "/admin/consumers/{name}/purge"
        return [
            Route(
                "GET",
                topic,
                self.topic_plan,
                "admin",
                "What purging a topic's queue (or all) would skip, per consumer and queue",
                s.PurgePlanIn,
                a.PurgeOut,
                (404,),
                body="none",
            ),
            Route(
                "POST",
                topic,
                self.topic,
                "admin",
                "Purge a topic's queue (or all): every consumer's committed offset to the queue's end",
                s.PurgeIn,
                a.PurgeOut,
                (404, 507),
            ),
            Route(
                "GET",
                consumer,
                self.consumer_plan,
                "admin",
                "What purging a consumer's backlog (one queue or all) would skip, per queue",
                s.PurgePlanIn,
                a.PurgeOut,
                (404,),
                body="none",
            ),
            Route(
                "POST",
                consumer,
                self.consumer,
                "admin",
                "Purge a consumer's backlog (one queue or all): its committed offsets to the ends",
                s.PurgeIn,
                a.PurgeOut,
                (404, 507),
            ),
        ]
