"""Projects (SPEC P1) and trace policies (SPEC P2): registration, look-ups, deletion.

Every topic belongs to a project; a project that a trace policy can select has its trace topic
`%TRACE%<project>`, made with the policy (and at start-up for policies that lack one), so trace
events have a durable home that Spark can read like any topic.
"""

from __future__ import annotations

import contextlib
import secrets

from mqgate.errors import AlreadyExists, BadRequest, Conflict, NotFound
from mqgate.names import validate_name
from mqgate.registry.records import DEFAULT_PROJECT, PolicyRecord, ProjectRecord, TopicRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.gateway import Feature
from mqgate.services.topology import Topology
from mqgate.tracing.events import trace_topic
from mqgate.tracing.policy import TracePolicy

TRACE_QUEUES = 1
TRACE_RETENTION_MS = 7 * 86_400_000


class Projects(Feature):
    def __init__(self, ctx: Context, topology: Topology) -> None:
        self.ctx = ctx
        self.topology = topology

    async def project(self, name: str) -> ProjectRecord:
        validate_name(name, "project")
        rec = self.ctx.registry.project(name)
        if rec is None and await self.ctx.registry.refresh_on_miss():
            rec = self.ctx.registry.project(name)
        if rec is None:
            raise NotFound(f"project {name} does not exist", field="project")
        return rec

    def topics_of(self, name: str) -> list[TopicRecord]:
        """The project's own topics (its trace topic left out), by name."""
        trace = trace_topic(name)
        return [t for t in self.ctx.registry.topics_in(name) if t.name != trace]

    async def create(self, name: str, description: str) -> ProjectRecord:
        validate_name(name, "name")
        if self.ctx.registry.project(name) is not None:
            raise AlreadyExists(f"project {name} already exists", field="name")
        rec = ProjectRecord(name, description, now_ms())
        await self.ctx.registry.change("add_project", rec)
        return rec

    async def start(self) -> None:
        await self.ensure_trace_topics()

    async def ensure_trace_topics(self) -> None:
        """Every project a policy can select has its trace topic."""
        for policy in list(self.ctx.registry.snapshot.policies.values()):
            for project in self.projects_of(policy):
                await self.ensure_trace_topic(project)

    def projects_of(self, policy: PolicyRecord) -> set[str]:
        """The projects whose messages `policy` can select."""
        snap = self.ctx.registry.snapshot
        if policy.project is not None:
            return {policy.project}
        topics: set[str] = set()
        if policy.topic is not None:
            topics.add(policy.topic)
        if policy.service is not None:
            p = snap.producers.get(policy.service)
            c = snap.consumers.get(policy.service)
            if p is not None:
                topics |= {p.topic, *(d for d in p.allowed() if not d.startswith("inbox:"))}
            if c is not None:
                topics.add(c.topic)
        return {snap.topics[t].project for t in topics if t in snap.topics}

    async def ensure_trace_topic(self, project: str) -> None:
        topic = trace_topic(project)
        if self.ctx.registry.topic(topic) is not None:
            return
        with contextlib.suppress(AlreadyExists):  # another gateway made it at the same moment
            await self.topology.create_topic(
                topic, TRACE_QUEUES, TRACE_RETENTION_MS, None, project=project, internal=True
            )

    async def delete(self, name: str) -> None:
        """Only an empty project goes (its trace topic with it); `default` stays."""
        await self.project(name)
        if name == DEFAULT_PROJECT:
            raise BadRequest("the default project cannot be deleted", field="name")
        topics = [t.name for t in self.topics_of(name)]
        if topics:
            shown = ", ".join(topics[:10]) + (" …" if len(topics) > 10 else "")
            raise Conflict(
                f"project {name} still has topics {shown}: delete them first", field="name", code="in_use"
            )
        await self.ctx.registry.change("remove", "project", name)
        if self.ctx.registry.topic(trace_topic(name)) is not None:
            await self.ctx.registry.change("remove", "topic", trace_topic(name))
            await self.ctx.store.delete_topic(trace_topic(name))

    # --- trace policies (SPEC P2) -----------------------------------------------------------

    async def add_policy(
        self,
        mode: str,
        level: str,
        *,
        project: str | None,
        topic: str | None,
        queue: int | None,
        service: str | None,
    ) -> PolicyRecord:
        policy_id = "tp_" + secrets.token_hex(6)
        checked = TracePolicy.create(
            policy_id, mode, level, project=project, topic=topic, queue=queue, service=service
        )
        try:
            if project is not None:
                await self.project(project)
            t = await self.topology.topic(topic) if topic is not None else None
        except NotFound as exc:  # a policy naming nothing is a bad request, not a missing resource
            raise BadRequest(exc.message, field=exc.field) from exc
        if t is not None and queue is not None and queue >= t.store_queues:
            raise BadRequest(f"topic {topic} has queues 0 to {t.store_queues - 1}", field="queue")
        if service is not None:
            snap = self.ctx.registry.snapshot
            if service not in snap.producers and service not in snap.consumers:
                await self.ctx.registry.refresh_on_miss()
                snap = self.ctx.registry.snapshot
                if service not in snap.producers and service not in snap.consumers:
                    raise BadRequest(f"no producer or consumer is named {service}", field="service")
        rec = PolicyRecord(
            policy_id, checked.mode.value, checked.level.label, project, topic, queue, service, now_ms()
        )
        for name in self.projects_of(rec):
            await self.ensure_trace_topic(name)
        await self.ctx.registry.change("add_policy", rec)
        return rec

    def policies(self) -> list[PolicyRecord]:
        return sorted(self.ctx.registry.snapshot.policies.values(), key=lambda p: p.created_ms)

    async def delete_policy(self, policy_id: str) -> None:
        if policy_id not in self.ctx.registry.snapshot.policies:
            await self.ctx.registry.refresh_on_miss()
        if policy_id not in self.ctx.registry.snapshot.policies:
            raise NotFound(f"trace policy {policy_id} does not exist", field="id")
        await self.ctx.registry.change("remove", "policy", policy_id)
