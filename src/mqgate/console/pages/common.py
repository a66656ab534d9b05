"""What the pages share: role checks against a record's project, and the records a user sees."""

from __future__ import annotations

from typing import Any

import msgspec

from mqgate.console.app import Console, Visit
from mqgate.console.projects import project_of, user_topics
from mqgate.errors import BadRequest, Forbidden
from mqgate.registry.records import ConsumerRecord, ProducerRecord, Snapshot, TopicRecord


def snapshot(c: Console) -> Snapshot:
    return c.gateway.ctx.registry.snapshot


def require_view(v: Visit, project: str) -> None:
    if not v.principal.can_view(project):
        raise Forbidden(f"you have no role in project {project}", field="project")


def require_change(v: Visit, project: str) -> None:
    if not v.principal.can_change(project):
        raise Forbidden(f"changing project {project} needs the owner or admin role", field="project")


def require_admin(v: Visit) -> None:
    if not v.principal.is_admin:
        raise Forbidden("this needs the admin role", field="role")


def visible_topics(c: Console, v: Visit) -> list[TopicRecord]:
    snap = snapshot(c)
    return [t for t in user_topics(snap) if v.principal.can_view(project_of(snap, t))]


def visible_consumers(c: Console, v: Visit) -> list[ConsumerRecord]:
    snap = snapshot(c)
    found = [x for x in snap.consumers.values() if v.principal.can_view(project_of(snap, x))]
    return sorted(found, key=lambda x: x.name)


def visible_producers(c: Console, v: Visit) -> list[ProducerRecord]:
    snap = snapshot(c)
    found = [x for x in snap.producers.values() if v.principal.can_view(project_of(snap, x))]
    return sorted(found, key=lambda x: x.name)


def plain(rec: Any) -> dict[str, Any]:
    """A record as the audit log keeps it (no token hashes)."""
    values: dict[str, Any] = msgspec.to_builtins(rec)
    values.pop("token_hash", None)
    return values


def required(v: Visit, name: str) -> str:
    value = v.req.arg(name)
    if not value:
        raise BadRequest(f"{name} is required", field=name)
    return value
