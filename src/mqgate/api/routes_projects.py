"""Projects, their queue state and health (SPEC P1), trace policies (P2-P4) and trace look-ups
(P5, P6)."""

from __future__ import annotations

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes_projects as sp
from mqgate.api.routes_admin import out
from mqgate.platform import Platform
from mqgate.registry.records import PolicyRecord, ProjectRecord
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


class ProjectRoutes:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.gw = platform.gateway

    def _project_out(self, rec: ProjectRecord) -> sp.ProjectOut:
        topics = sorted(t.name for t in self.platform.projects.topics_of(rec.name))
        return sp.ProjectOut(name=rec.name, description=rec.description, topics=topics)

    async def create(self, req: Request) -> Response:
        inp: sp.ProjectIn = req.input
        return Response(self._project_out(await self.platform.projects.create(inp.name, inp.description)))

    async def listing(self, req: Request) -> Response:
        recs = sorted(self.gw.ctx.registry.snapshot.projects.values(), key=lambda p: p.name)
        return Response(sp.ProjectsOut(projects=[self._project_out(p) for p in recs]))

    async def show(self, req: Request) -> Response:
        return Response(self._project_out(await self.platform.projects.project(req.input.name)))

    async def delete(self, req: Request) -> Response:
        await self.platform.projects.delete(req.input.name)
        return Response(a.DeletedOut(name=req.input.name, deleted=True))

    async def health(self, req: Request) -> Response:
        project = await self.platform.projects.project(req.input.name)
        return Response(out(await self.platform.queue_state.health(project.name), sp.ProjectHealthOut))

    async def queues(self, req: Request) -> Response:
        inp: sp.ProjectQueuesIn = req.input
        project = await self.platform.projects.project(inp.name)
        rows = await self.platform.queue_state.queues(
            project.name, inp.topic, inp.queue, inp.since, inp.until
        )
        return Response(
            sp.QueueHistoryOut(project=project.name, intervals=[out(r, sp.QueueIntervalOut) for r in rows])
        )

    async def routers(self, req: Request) -> Response:
        """Every queue of every topic, by project or topic (SPEC P5 routers): from the registry,
        so each exists once, from the registration of its topic on."""
        inp: sp.RoutersIn = req.input
        if inp.project is not None:
            await self.platform.projects.project(inp.project)
        found = []
        for t in sorted(self.gw.ctx.registry.snapshot.topics.values(), key=lambda t: t.name):
            if (inp.project is not None and t.project != inp.project) or (inp.topic not in (None, t.name)):
                continue
            for q in range(t.store_queues):
                lane = t.grid.lane_of(q)
                found.append(
                    sp.RouterOut(
                        id=f"{t.project}/{t.name}/{q}", project=t.project, topic=t.name, queue=q, lane=lane
                    )
                )
        return Response(sp.RoutersOut(routers=found))

    async def add_policy(self, req: Request) -> Response:
        inp: sp.PolicyIn = req.input
        rec = await self.platform.projects.add_policy(
            inp.mode, inp.level, project=inp.project, topic=inp.topic, queue=inp.queue, service=inp.service
        )
        return Response(_policy_out(rec))

    async def policies(self, req: Request) -> Response:
        return Response(sp.PoliciesOut(policies=[_policy_out(p) for p in self.platform.projects.policies()]))

    async def delete_policy(self, req: Request) -> Response:
        await self.platform.projects.delete_policy(req.input.id)
        return Response(a.DeletedOut(name=req.input.id, deleted=True))

    async def traces(self, req: Request) -> Response:
        inp: sp.TraceIn = req.input
        found = await self.platform.trace_lookup.find(
            msg_id=inp.msg_id, request_id=inp.request_id, key=inp.key
        )
        paths = [
            sp.PathOut(
                **msgspec.structs.asdict(out(p.path, _PathBase)),
                consumers=[out(s, sp.GroupStateOut) for s in p.consumers],
            )
            for p in found.paths
        ]
        return Response(
            sp.TraceOut(
                paths=paths,
                may_be_incomplete=found.may_be_incomplete,
                index_lag_events=found.index_lag_events,
                index_lag_ms=found.index_lag_ms,
            )
        )

    def routes(self) -> list[Route]:
        project = "/admin/projects/{name}"
        return [
            Route("POST", "/admin/projects", self.create, "admin", "Create a project (SPEC P1)",
                  sp.ProjectIn, sp.ProjectOut, (409, 507)),
            Route("GET", "/admin/projects", self.listing, "admin", "List projects with their topics",
                  None, sp.ProjectsOut, body="none"),
            Route("GET", project, self.show, "admin", "Show a project", sp.ProjectNameIn, sp.ProjectOut,
                  (404,), body="none"),
            Route("DELETE", project, self.delete, "admin", "Delete an empty project", sp.ProjectNameIn,
                  a.DeletedOut, (404, 409), body="none"),
            Route("GET", project + "/health", self.health, "admin",
                  "Project health: a queue fault told from a consumer fault (SPEC P1)", sp.ProjectNameIn,
                  sp.ProjectHealthOut, (404,), body="none"),
            Route("GET", project + "/queues", self.queues, "admin",
                  "Queue state over time: max length and average occupancy per interval (SPEC P1)",
                  sp.ProjectQueuesIn, sp.QueueHistoryOut, (404,), body="none"),
            Route("GET", "/admin/routers", self.routers, "admin",
                  "Every queue of every topic, by project or topic (SPEC P5 routers)", sp.RoutersIn,
                  sp.RoutersOut, (404,), body="none"),
            Route("POST", "/admin/trace-policies", self.add_policy, "admin",
                  "Add a trace policy (SPEC P2-P4)", sp.PolicyIn, sp.PolicyOut, (404,)),
            Route("GET", "/admin/trace-policies", self.policies, "admin", "List trace policies", None,
                  sp.PoliciesOut, body="none"),
            Route("DELETE", "/admin/trace-policies/{id}", self.delete_policy, "admin",
                  "Delete a trace policy", sp.PolicyIdIn, a.DeletedOut, (404,), body="none"),
            Route("GET", "/admin/traces", self.traces, "admin",
                  "A message's full path by msgId, requestId or key (SPEC P6)", sp.TraceIn, sp.TraceOut,
                  body="none"),
        ]  # fmt: skip


class _PathBase(a.Output, kw_only=True):
    """A path as the index gives it, before the consumers' states are added."""

    msg_id: str
    project: str
    topic: str
    keys: list[str]
    producer: str | None = None
    traceparent: str | None = None
    level: str
    hops: list[sp.HopOut]
    failures: list[sp.HopOut]


def _policy_out(rec: PolicyRecord) -> sp.PolicyOut:
    return out(rec, sp.PolicyOut)  # type: ignore[no-any-return]
