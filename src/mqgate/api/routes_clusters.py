"""Store clusters, each project's primary and backup, fail-back and the spool (SPEC P8, E7)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from mqgate.api import answers as a
from mqgate.api.paging import Paging
from mqgate.api.routes_admin import out
from mqgate.api.shapes import Input, Name, PageIn
from mqgate.failover.pool import ClusterSpec
from mqgate.failover.service import Failover
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

ClusterUrl = Annotated[
    str, Meta(min_length=1, max_length=2048, description="redis://, rediss://, unix://, or embedded:<dir>")
]


class ClusterIn(Input, kw_only=True, frozen=True):
    name: Name
    url: ClusterUrl
    pool: Name = "default"
    # The broker name in its ack tokens; default: the cluster's name.
    broker: Name | None = None


class ClusterNameIn(Input, kw_only=True, frozen=True):
    name: Name


class ProjectClustersIn(Input, kw_only=True, frozen=True):
    name: Name
    primary: Name
    backup: Name | None = None
    auto_failback: bool = False


class ClusterOut(a.Output, kw_only=True):
    name: str
    url: str
    pool: str
    state: str
    reason: str
    changed_ms: int
    opened: bool
    last_probe_ms: int
    last_probe_latency_ms: float
    last_outcome: str
    error_rate: float
    probes: int


class ClustersOut(a.Output, kw_only=True):
    clusters: list[ClusterOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class ProjectFailoverOut(a.Output, kw_only=True):
    project: str
    primary: str
    draining: list[str]
    backup: str | None = None
    auto_failback: bool = False
    active: str | None = None
    epoch: int = 0
    reason: str = ""
    changed_ms: int = 0
    spooled: int = 0


class SpoolOut(a.Output, kw_only=True):
    pending: int
    pending_bytes: int
    disk_bytes: int
    max_bytes: int
    spooled_total: int
    resent_total: int
    oldest_age_ms: int
    possible_duplicates: int
    torn_tails_cut: int
    corrupt_skipped: int


class ClusterRoutes:
    def __init__(self, failover: Failover) -> None:
        self.failover = failover
        self.paging = Paging(failover.ctx.settings.max_answer_bytes)

    async def add(self, req: Request) -> Response:
        inp: ClusterIn = req.input
        status = await self.failover.add_cluster(ClusterSpec(inp.name, inp.url, inp.pool, inp.broker))
        return Response(out(status, ClusterOut))

    async def listing(self, req: Request) -> Response:
        found, nxt = self.paging.listing(
            req.input, "clusters", self.failover.clusters(), lambda c: (c.name,), lambda c: out(c, ClusterOut)
        )
        return Response(ClustersOut(clusters=found, next=nxt))

    async def show(self, req: Request) -> Response:
        return Response(out(self.failover.cluster(req.input.name), ClusterOut))

    async def delete(self, req: Request) -> Response:
        await self.failover.remove_cluster(req.input.name)
        return Response(a.DeletedOut(name=req.input.name, deleted=True))

    async def assign(self, req: Request) -> Response:
        inp: ProjectClustersIn = req.input
        state = await self.failover.assign(inp.name, inp.primary, inp.backup, inp.auto_failback)
        return Response(out(state, ProjectFailoverOut))

    async def project(self, req: Request) -> Response:
        return Response(out(await self.failover.state_of(req.input.name), ProjectFailoverOut))

    async def failback(self, req: Request) -> Response:
        return Response(out(await self.failover.failback(req.input.name), ProjectFailoverOut))

    async def spool(self, req: Request) -> Response:
        return Response(out(self.failover.spool_stats(), SpoolOut))

    def routes(self) -> list[Route]:
        cluster = "/admin/clusters/{name}"
        project = "/admin/projects/{name}"
        return [
            Route("POST", "/admin/clusters", self.add, "admin", "Add a store cluster to a pool (SPEC P8)",
                  ClusterIn, ClusterOut, (409,)),
            Route("GET", "/admin/clusters", self.listing, "admin", "Clusters with their health (paged)",
                  PageIn, ClustersOut, body="none"),
            Route("GET", cluster, self.show, "admin", "One cluster's health", ClusterNameIn, ClusterOut,
                  (404,), body="none"),
            Route("DELETE", cluster, self.delete, "admin", "Remove a cluster no project uses",
                  ClusterNameIn, a.DeletedOut, (404, 409), body="none"),
            Route("PUT", project + "/clusters", self.assign, "admin",
                  "Set a project's primary and backup cluster (SPEC P8)", ProjectClustersIn,
                  ProjectFailoverOut, (404,)),
            Route("GET", project + "/failover", self.project, "admin",
                  "A project's clusters: the active one, the last switch and its reason",
                  ClusterNameIn, ProjectFailoverOut, (404,), body="none"),
            Route("POST", project + "/failback", self.failback, "admin",
                  "Move a project back to its primary", ClusterNameIn, ProjectFailoverOut, (404,),
                  body="none"),
            Route("GET", "/admin/spool", self.spool, "admin", "This gateway's producer spool (SPEC E7)",
                  None, SpoolOut, body="none"),
        ]  # fmt: skip
