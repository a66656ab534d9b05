"""Topics, producers and consumers: list, create, grow, rotate or revoke tokens, delete."""

from __future__ import annotations

import asyncio

from mqgate.api.shapes import ConsumerIn, TopicChangeIn, TopicIn
from mqgate.console.app import Console, principal, route
from mqgate.console.pages.common import (
    form_input,
    matching,
    paginate,
    plain,
    require_change,
    required,
    snapshot,
    visible_consumers,
    visible_producers,
    visible_topics,
)
from mqgate.console.projects import all_projects, create_topic_in, project_of, topic_project
from mqgate.errors import BadRequest
from mqgate.services.topology import REVOKED
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

HOUR_MS = 3600 * 1000
TOPICS_PER_PAGE = 100
CLIENTS_PER_PAGE = 50  # of consumers, and of producers: each row carries three forms


class TopologyPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    # --- topics -------------------------------------------------------------------------

    async def topics(self, v: Request) -> Response:
        topics, pager = paginate(
            v, matching(v, visible_topics(self.c, v), "name", "project"), TOPICS_PER_PAGE
        )
        store = self.c.gateway.ctx.store
        bounds = await asyncio.gather(*(store.bounds(t.name) for t in topics))
        rows = [
            {"t": t, "project": topic_project(t), "messages": sum(b.max - b.min for b in bs)}
            for t, bs in zip(topics, bounds, strict=True)
        ]
        projects = principal(v).changeable(all_projects(snapshot(self.c)))
        return self.c.page(
            v,
            "topics.html",
            rows=rows,
            projects=projects,
            settings=self.c.settings,
            pager=pager,
            q=v.arg("q"),
        )

    async def create_topic(self, v: Request) -> Response:
        project = v.arg("project", "default")
        require_change(v, project)
        s = self.c.settings
        topic = topic_form(self.c, v, project)
        name = topic.name
        rec = await create_topic_in(
            self.c.gateway,
            name,
            project,
            topic.queues or s.default_queues,
            topic.retention_ms or s.default_retention_ms,
            topic.max_priority,
        )
        await self.c.audit_change(v, "topic.create", name, project, after=plain(rec))
        back = f"/projects/{project}" if v.arg("back") == "project" else "/topics"
        return redirect(self.c.url(f"{back}?note=topic {name} created in project {project}"))

    async def grow_topic(self, v: Request) -> Response:
        name = v.params["name"]
        before = await self.c.gateway.topology.topic(name)
        project = topic_project(before)
        require_change(v, project)
        grow = form_input(
            self.c,
            TopicChangeIn,
            name=name,
            queues=v.arg("queues"),
            max_priority=v.arg("max_priority"),
        )
        after = await self.c.gateway.topology.change_topic(
            name, queues=grow.queues, max_priority=grow.max_priority
        )
        await self.c.audit_change(v, "topic.grow", name, project, plain(before), plain(after))
        return redirect(self.c.url(f"/topics?note=topic {name}: {after.queues} queues"))

    async def delete_topic(self, v: Request) -> Response:
        name = v.params["name"]
        before = await self.c.gateway.topology.topic(name)
        project = topic_project(before)
        require_change(v, project)
        await self.c.gateway.topology.delete_topic(name)
        await self.c.audit_change(v, "topic.delete", name, project, before=plain(before))
        return redirect(self.c.url(f"/topics?note=topic {name} deleted"))

    # --- producers and consumers ----------------------------------------------------------

    async def clients(self, v: Request) -> Response:
        snap = snapshot(self.c)
        topics = [t for t in visible_topics(self.c, v) if principal(v).can_change(topic_project(t))]
        consumers, consumer_pager = paginate(
            v, matching(v, visible_consumers(self.c, v), "name", "topic"), CLIENTS_PER_PAGE, "page"
        )
        producers, producer_pager = paginate(
            v, matching(v, visible_producers(self.c, v), "name", "topic"), CLIENTS_PER_PAGE, "ppage"
        )
        return self.c.page(
            v,
            "clients.html",
            producers=[(p, project_of(snap, p)) for p in producers],
            consumers=[(x, project_of(snap, x)) for x in consumers],
            consumer_pager=consumer_pager,
            producer_pager=producer_pager,
            q=v.arg("q"),
            topics=topics,
            revoked=REVOKED,
        )

    async def _topic_project(self, topic: str) -> str:
        return topic_project(await self.c.gateway.topology.topic(topic))

    async def register(self, v: Request) -> Response:
        kind = v.params["kind"]
        name, topic = required(v, "name"), required(v, "topic")
        if kind not in ("producer", "consumer"):
            raise BadRequest("kind must be producer or consumer", field="kind")
        project = await self._topic_project(topic)
        require_change(v, project)
        token = await register_client(self.c, kind, name, topic, v.arg("mode"), v.arg("start"))
        rec = await self._record(kind, name)
        await self.c.audit_change(v, f"{kind}.register", name, project, after=plain(rec))
        return self.c.page(v, "token.html", kind=kind, name=name, token=token, back=self.c.url("/clients"))

    async def _record(self, kind: str, name: str) -> object:
        if kind not in ("producer", "consumer"):
            raise BadRequest("kind must be producer or consumer", field="kind")
        topology = self.c.gateway.topology
        return await (topology.producer(name) if kind == "producer" else topology.consumer(name))

    async def _owned(self, v: Request, kind: str, name: str) -> tuple[object, str]:
        rec = await self._record(kind, name)
        project = project_of(snapshot(self.c), rec)  # type: ignore[arg-type]
        require_change(v, project)
        return rec, project

    async def rotate(self, v: Request) -> Response:
        kind, name = v.params["kind"], v.params["name"]
        _, project = await self._owned(v, kind, name)
        _, token = await self.c.gateway.topology.new_token(kind, name)
        await self.c.audit_change(v, f"{kind}.token.rotate", name, project)
        return self.c.page(v, "token.html", kind=kind, name=name, token=token, back=self.c.url("/clients"))

    async def revoke(self, v: Request) -> Response:
        kind, name = v.params["kind"], v.params["name"]
        _, project = await self._owned(v, kind, name)
        await self.c.gateway.topology.revoke_token(kind, name)
        await self.c.audit_change(v, f"{kind}.token.revoke", name, project)
        return redirect(self.c.url(f"/clients?note={kind} {name}: token revoked"))

    async def delete(self, v: Request) -> Response:
        kind, name = v.params["kind"], v.params["name"]
        rec, project = await self._owned(v, kind, name)
        topology = self.c.gateway.topology
        if kind == "producer":
            await topology.delete_producer(name)
        else:
            await topology.delete_consumer(name, keep_dead_letters=v.arg("keep_dead_letters") == "on")
        await self.c.audit_change(v, f"{kind}.delete", name, project, before=plain(rec))
        return redirect(self.c.url(f"/clients?note={kind} {name} deleted"))

    def routes(self) -> list[Route]:
        kind = "/clients/{kind}/{name}"
        return [
            route("GET", "/topics", self.topics),
            route("POST", "/topics", self.create_topic),
            route("POST", "/topics/{name}/grow", self.grow_topic),
            route("POST", "/topics/{name}/delete", self.delete_topic),
            route("GET", "/clients", self.clients),
            route("POST", "/clients/{kind}", self.register),
            route("POST", kind + "/token", self.rotate),
            route("POST", kind + "/revoke", self.revoke),
            route("POST", kind + "/delete", self.delete),
        ]


def topic_form(c: Console, v: Request, project: str) -> TopicIn:
    """A new topic's form (on the topics and project pages, in an application for a topic) as
    the API's request for it: the same limits, refused with the same messages."""
    hours = v.float_arg("retention_hours")
    return form_input(
        c,
        TopicIn,
        name=v.arg("name"),
        project=project,
        queues=v.arg("queues"),
        max_priority=v.arg("max_priority"),
        retention_ms=int(hours * HOUR_MS) if hours is not None else None,
    )


async def register_client(c: Console, kind: str, name: str, topic: str, mode: str, start: str) -> str:
    """Register a producer or consumer; its token (shown once)."""
    topology = c.gateway.topology
    if kind == "producer":
        _, token = await topology.register_producer(name, topic)
        return token
    if kind != "consumer":
        raise BadRequest("kind must be producer or consumer", field="kind")
    s = c.settings
    # The API's request shape: its defaults (mode, start) and its checks, one source for both doors.
    wanted = form_input(c, ConsumerIn, name=name, topic=topic, mode=mode or None, start=start or None)
    _, token = await topology.register_consumer(
        name, topic, wanted.mode, wanted.start, s.default_lock_timeout_s, s.default_max_attempts
    )
    return token
