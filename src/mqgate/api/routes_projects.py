"""Projects, their queue state and health (SPEC P1), trace policies (P2-P4) and trace look-ups
(P5, P6)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Final

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes_projects as sp
from mqgate.api.paging import KeyInt, KeyText, Paging
from mqgate.api.routes_admin import out
from mqgate.api.shapes import PageIn
from mqgate.platform import Platform
from mqgate.registry.records import PolicyRecord, ProjectRecord
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

# The key of a queue interval in its list: topic, queue, start.
_INTERVAL_KEY: Final = (KeyText, KeyInt, KeyInt)
_ROUTER_KEY: Final = (KeyText, KeyInt)  # topic, queue
_POLICY_KEY: Final = (KeyInt, KeyText)  # created, id: the order policies are listed in
_FINDING_KEY: Final = (KeyText, KeyText, KeyText, KeyInt, KeyText)  # side, rule, topic, queue, consumer


def _finding_key(f: sp.FindingOut) -> tuple[str, str, str, int, str]:
    return (f.side, f.rule, f.topic or "", -1 if f.queue is None else f.queue, f.consumer or "")


class ProjectRoutes:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.gw = platform.gateway
        self.paging = Paging(self.gw.ctx.settings.max_answer_bytes)

    def _project_out(self, rec: ProjectRecord) -> sp.ProjectOut:
        topics = self.platform.projects.topics_of(rec.name)
        named = [t.name for t in topics[: sp.PROJECT_TOPICS_NAMED]]
        return sp.ProjectOut(
            name=rec.name, description=rec.description, topics=named, topic_count=len(topics)
        )

    async def create(self, req: Request) -> Response:
        inp: sp.ProjectIn = req.input
        return Response(self._project_out(await self.platform.projects.create(inp.name, inp.description)))

    async def listing(self, req: Request) -> Response:
        inp: PageIn = req.input
        recs = self.gw.ctx.registry.snapshot.projects.values()
        found, nxt = self.paging.listing(inp, "projects", recs, lambda p: (p.name,), self._project_out)
        return Response(sp.ProjectsOut(projects=found, next=nxt))

    async def show(self, req: Request) -> Response:
        return Response(self._project_out(await self.platform.projects.project(req.input.name)))

    async def delete(self, req: Request) -> Response:
        await self.platform.projects.delete(req.input.name)
        return Response(a.DeletedOut(name=req.input.name, deleted=True))

    async def health(self, req: Request) -> Response:
        inp: sp.ProjectHealthIn = req.input
        project = await self.platform.projects.project(inp.name)
        found = await self.platform.queue_state.health(project.name)
        every = [out(f, sp.FindingOut) for f in found.findings]
        findings, nxt = self.paging.listing(inp, "findings", every, _finding_key, lambda f: f, _FINDING_KEY)
        return Response(
            sp.ProjectHealthOut(
                project=found.project,
                verdict=found.verdict,
                checked_ms=found.checked_ms,
                window_since_ms=found.window_since_ms,
                findings=findings,
                finding_count=len(found.findings),
                next=nxt,
            )
        )

    async def queues(self, req: Request) -> Response:
        """A page of the project's queue intervals, in (topic, queue, start) order: a steady
        run of the history is its single intervals, and a page may end inside one (the cursor
        names the interval, not the row)."""
        inp: sp.ProjectQueuesIn = req.input
        project = await self.platform.projects.project(inp.name)
        after = self.paging.after(inp, "queues", _INTERVAL_KEY)
        rows, more = await self.platform.queue_state.queue_page(
            project.name, inp.topic, inp.queue, inp.since, inp.until, after=after, limit=inp.limit
        )
        keyed = (((r.topic, r.queue, r.start_ms), out(r, sp.QueueIntervalOut)) for r in rows)
        found, nxt = self.paging.page(inp, "queues", keyed, more=more)
        return Response(sp.QueueHistoryOut(project=project.name, intervals=found, next=nxt))

    async def routers(self, req: Request) -> Response:
        """Every queue of every topic, by project or topic (SPEC P5 routers): from the registry,
        so each exists once, from the registration of its topic on. In (topic, queue) order,
        made only as far as the page goes."""
        inp: sp.RoutersIn = req.input
        if inp.project is not None:
            await self.platform.projects.project(inp.project)
        after = self.paging.after(inp, "routers", _ROUTER_KEY)
        topics = sorted(
            (
                t
                for t in self.gw.ctx.registry.snapshot.topics.values()
                if (inp.project is None or t.project == inp.project) and inp.topic in (None, t.name)
            ),
            key=lambda t: t.name,
        )
        if after is not None:
            topics = topics[bisect.bisect_left(topics, after[0], key=lambda t: t.name) :]

        def keyed() -> Iterator[tuple[tuple[str, int], sp.RouterOut]]:
            for t in topics:
                first = after[1] + 1 if after is not None and t.name == after[0] else 0
                for q in range(max(first, 0), t.store_queues):
                    router = sp.RouterOut(
                        id=f"{t.project}/{t.name}/{q}", project=t.project, topic=t.name, queue=q,
                        lane=t.grid.lane_of(q),
                    )  # fmt: skip
                    yield (t.name, q), router

        found, nxt = self.paging.page(inp, "routers", keyed())
        return Response(sp.RoutersOut(routers=found, next=nxt))

    async def add_policy(self, req: Request) -> Response:
        inp: sp.PolicyIn = req.input
        rec = await self.platform.projects.add_policy(
            inp.mode, inp.level, project=inp.project, topic=inp.topic, queue=inp.queue, service=inp.service
        )
        return Response(_policy_out(rec))

    async def policies(self, req: Request) -> Response:
        inp: PageIn = req.input
        found, nxt = self.paging.listing(
            inp, "policies", self.platform.projects.policies(), lambda p: (p.created_ms, p.id), _policy_out,
            _POLICY_KEY,
        )  # fmt: skip
        return Response(sp.PoliciesOut(policies=found, next=nxt))

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
            Route("GET", "/admin/projects", self.listing, "admin", "List projects with their topics (paged)",
                  PageIn, sp.ProjectsOut, body="none"),
            Route("GET", project, self.show, "admin", "Show a project", sp.ProjectNameIn, sp.ProjectOut,
                  (404,), body="none"),
            Route("DELETE", project, self.delete, "admin", "Delete an empty project", sp.ProjectNameIn,
                  a.DeletedOut, (404, 409), body="none"),
            Route("GET", project + "/health", self.health, "admin",
                  "Project health: a queue fault told from a consumer fault (SPEC P1)", sp.ProjectHealthIn,
                  sp.ProjectHealthOut, (404,), body="none"),
            Route("GET", project + "/queues", self.queues, "admin",
                  "Queue state over time: max length and average occupancy per interval (SPEC P1; paged)",
                  sp.ProjectQueuesIn, sp.QueueHistoryOut, (404,), body="none"),
            Route("GET", "/admin/routers", self.routers, "admin",
                  "Every queue of every topic, by project or topic (SPEC P5 routers; paged)", sp.RoutersIn,
                  sp.RoutersOut, (404,), body="none"),
            Route("POST", "/admin/trace-policies", self.add_policy, "admin",
                  "Add a trace policy (SPEC P2-P4)", sp.PolicyIn, sp.PolicyOut, (404,)),
            Route("GET", "/admin/trace-policies", self.policies, "admin", "List trace policies (paged)",
                  PageIn, sp.PoliciesOut, body="none"),
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
