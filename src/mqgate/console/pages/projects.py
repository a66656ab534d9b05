"""Projects (SPEC P1): list, create and delete them, their topics, their health verdict with
its findings (a queue fault told from a consumer fault), and their queue state over time."""

from __future__ import annotations

import asyncio
from typing import Any, Final
from urllib.parse import urlencode

import sqlalchemy as sa

from mqgate.console.app import Console, now_ms, principal, route
from mqgate.console.pages.clusters import where_it_lives
from mqgate.console.pages.common import (
    fragment,
    paginate,
    plain,
    require_admin,
    require_view,
    required,
    snapshot,
)
from mqgate.console.pages.topology import TOPICS_PER_PAGE
from mqgate.console.projects import DEFAULT_PROJECT
from mqgate.console.web import REPORT_CSP
from mqgate.errors import BadRequest, NotFound
from mqgate.names import INTERNAL_PREFIXES
from mqgate.queuestate.diagnosis import ProjectHealth
from mqgate.queuestate.rows import QueueInterval
from mqgate.web.request import Request
from mqgate.web.response import Response, page, redirect
from mqgate.web.route import Route

HOUR_MS: Final = 3_600_000
PROJECTS_PER_PAGE: Final = 50
FINDINGS_PER_PAGE: Final = 100
QUEUE_ROWS: Final = 500  # queue-state intervals shown at most, newest first
VERDICT_CLASS: Final = {"healthy": "ok", "no_data": "muted", "consumer_fault": "bad", "queue_fault": "bad",
                        "queue_and_consumer_fault": "bad"}  # fmt: skip


def _report_of(c: Console, project: str) -> dict[str, object]:
    """Whether the project has a trace analytics report, and when it was written."""
    path = c.settings.project_report_dir(project) / "report.html"
    try:
        return {"at_ms": int(path.stat().st_mtime * 1000), "dir": str(path.parent)}
    except OSError:
        return {"at_ms": None, "dir": str(path.parent)}


async def newest_intervals(
    c: Console, project: str, topic: str | None, queue: int | None, since_ms: int, limit: int
) -> tuple[list[QueueInterval], bool]:
    """A project's newest queue-state rows since `since_ms` (of a topic, a queue), at most
    `limit`, newest first; and whether there are more. The database picks them (index on
    project and time): a project of hundreds of queues has tens of thousands an hour; a steady
    run is shown as its intervals."""
    qs = c.platform.queue_state
    await qs.recorder.flush()  # closed intervals this gateway still holds
    return await asyncio.to_thread(
        qs.history.newest_queue_intervals, project, topic=topic, queue=queue, since_ms=since_ms, limit=limit
    )


async def project_health(c: Console, project: str) -> ProjectHealth:
    """The project's health verdict, computed again only when what it reads may have changed: a
    new interval began, a newer queue-state row was written, or the registry changed (paused
    consumers). The diagnosis reads every row of its window (at hundreds of queues, tens of
    thousands); a changed answer shows at the latest one interval late (late merges of other
    gateways into rows already written). One computation serves every request that waits."""
    qs = c.platform.queue_state
    interval_ms = max(int(c.settings.queue_state_interval_s * 1000), 1)
    await qs.recorder.flush()  # closed intervals this gateway still holds
    h = qs.history

    def newest() -> tuple[int | None, ...]:
        with h.engine.connect() as conn:
            return tuple(
                conn.execute(sa.select(sa.func.max(t.c.start_ms)).where(t.c.project == project)).scalar()
                for t in (h.queues, h.consumers, h.produce, h.errors)
            )

    key = (snapshot(c).version, now_ms() // interval_ms, await asyncio.to_thread(newest))
    known: dict[str, tuple[Any, asyncio.Task[ProjectHealth]]] = c.cache.setdefault("health", {})
    found = known.get(project)
    failed = (
        found is not None and found[1].done() and (found[1].cancelled() or found[1].exception() is not None)
    )
    if found is None or found[0] != key or failed:
        found = known[project] = (key, asyncio.ensure_future(qs.health(project)))
    return await asyncio.shield(found[1])  # a request that goes away does not cancel it for others


class ProjectPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def listing(self, v: Request) -> Response:
        me = principal(v)
        snap = snapshot(self.c)
        shown, pager = paginate(v, [n for n in sorted(snap.projects) if me.can_view(n)], PROJECTS_PER_PAGE)
        projects = self.c.platform.projects
        rows = []
        for name in shown:
            mine = [t.name for t in projects.topics_of(name) if not t.name.startswith(INTERNAL_PREFIXES)]
            policies = sum(name in projects.projects_of(p) for p in snap.policies.values())
            rows.append({"p": snap.projects[name], "topics": mine, "policies": policies})
        return self.c.page(v, "projects.html", rows=rows, pager=pager, default=DEFAULT_PROJECT)

    async def create(self, v: Request) -> Response:
        require_admin(v)
        name = required(v, "name")
        rec = await self.c.platform.projects.create(name, v.arg("description"))
        await self.c.audit_change(v, "project.create", name, name, after=plain(rec))
        return redirect(self.c.url(f"/projects/{name}?note=project {name} created"))

    async def delete(self, v: Request) -> Response:
        require_admin(v)
        name = v.params["name"]
        rec = await self.c.platform.projects.project(name)
        await self.c.platform.projects.delete(name)
        await self.c.audit_change(v, "project.delete", name, name, before=plain(rec))
        return redirect(self.c.url(f"/projects?note=project {name} deleted"))

    async def show(self, v: Request) -> Response:
        name = v.params["name"]
        rec = await self.c.platform.projects.project(name)
        require_view(v, name)
        hours = v.float_arg("hours", 1.0)
        assert hours is not None
        if not 0 < hours <= 24 * 90:
            raise BadRequest("hours is more than 0 and at most 2160 (90 days)", field="hours")
        topic, queue = v.arg("topic") or None, v.int_arg("queue")
        since = now_ms() - int(hours * HOUR_MS)
        intervals, more = await newest_intervals(self.c, name, topic, queue, since, QUEUE_ROWS)
        own = self.c.platform.projects.topics_of(name)
        every = [t for t in own if not t.name.startswith(INTERNAL_PREFIXES)]
        topics, topic_pager = paginate(v, every, TOPICS_PER_PAGE, "topics_page")
        # The health part is loaded with the page's own arguments, so that its pager's links
        # (`findings_page`) keep them.
        health_query = urlencode([(k, val) for k, values in v.query.items() for val in values])
        return self.c.page(
            v,
            "project.html",
            p=rec,
            health_query=health_query,
            intervals=intervals,
            more=more,
            topics=topics,
            topic_pager=topic_pager,
            q={"topic": topic or "", "queue": "" if queue is None else queue, "hours": hours},
            can_change=principal(v).can_change(name),
            settings=self.c.settings,
            report=_report_of(self.c, name),
            where=where_it_lives(self.c, v, name),
        )

    async def health(self, v: Request) -> Response:
        """The project's health verdict and findings (a diagnosis over its queue-state window:
        at a few hundred queues, a second or more), a part the project page loads after it."""
        name = v.params["name"]
        await self.c.platform.projects.project(name)
        require_view(v, name)
        found = await project_health(self.c, name)
        findings, pager = paginate(v, found.findings, FINDINGS_PER_PAGE, "findings_page")
        return fragment(
            self.c,
            v,
            "project_health.html",
            health=found,
            findings=findings,
            pager=pager,
            verdict_class=VERDICT_CLASS,
        )

    async def report(self, v: Request) -> Response:
        """The project's trace analytics report (`mqgate analytics --out <reports_dir>/<name>`),
        as the job wrote it: self-contained HTML (or its JSON with every figure)."""
        name = v.params["name"]
        await self.c.platform.projects.project(name)
        require_view(v, name)
        wanted = "report.json" if v.arg("format") == "json" else "report.html"
        path = self.c.settings.project_report_dir(name) / wanted
        try:
            body = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise NotFound(f"project {name} has no trace analytics report yet", field="name") from None
        kind = b"application/json" if wanted.endswith(".json") else b"text/html; charset=utf-8"
        return page(body, 200, kind, headers=[(b"content-security-policy", REPORT_CSP)])

    def routes(self) -> list[Route]:
        return [
            route("GET", "/projects", self.listing),
            route("POST", "/projects", self.create),
            route("GET", "/projects/{name}", self.show),
            route("GET", "/projects/{name}/report", self.report),
            route("GET", "/live/projects/{name}/health", self.health, "fragment"),
            route("POST", "/projects/{name}/delete", self.delete),
        ]
