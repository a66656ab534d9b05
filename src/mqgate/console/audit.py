"""The audit log: who changed what, when, from what to what. The console writes it; the API
and the CLI call `AuditLog.record` (or `record_async`) the same way."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Final

import msgspec
import sqlalchemy as sa

from mqgate.console import tables as t

PAGE_ROWS: Final = 100


class AuditEntry(msgspec.Struct, frozen=True):
    id: int
    at_ms: int
    actor: str
    via: str
    action: str
    target: str
    project: str
    before: Any
    after: Any


class AuditFilter(msgspec.Struct, frozen=True):
    actor: str | None = None
    action: str | None = None  # a prefix: "topic." matches every topic action
    target: str | None = None  # a substring
    projects: list[str] | None = None  # None: every project
    since_ms: int | None = None
    until_ms: int | None = None
    before_id: int | None = None  # paging: entries older than this one
    limit: int = PAGE_ROWS


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


class AuditLog:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def record(
        self,
        actor: str,
        action: str,
        target: str,
        *,
        via: str = "console",
        project: str = "",
        before: Any = None,
        after: Any = None,
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(t.audit).values(
                    at_ms=int(time.time() * 1000),
                    actor=actor,
                    via=via,
                    action=action,
                    target=target,
                    project=project,
                    before=_json(before),
                    after=_json(after),
                )
            )

    async def record_async(self, actor: str, action: str, target: str, **kwargs: Any) -> None:
        await asyncio.to_thread(lambda: self.record(actor, action, target, **kwargs))

    def query(self, f: AuditFilter) -> list[AuditEntry]:
        c = t.audit.c
        q = sa.select(t.audit).order_by(c.id.desc()).limit(max(1, min(f.limit, 1000)))
        if f.actor:
            q = q.where(c.actor == f.actor)
        if f.action:
            q = q.where(c.action.startswith(f.action, autoescape=True))
        if f.target:
            q = q.where(c.target.contains(f.target, autoescape=True))
        if f.projects is not None:
            q = q.where(c.project.in_(f.projects))
        if f.since_ms is not None:
            q = q.where(c.at_ms >= f.since_ms)
        if f.until_ms is not None:
            q = q.where(c.at_ms < f.until_ms)
        if f.before_id is not None:
            q = q.where(c.id < f.before_id)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return [
            AuditEntry(
                r.id,
                r.at_ms,
                r.actor,
                r.via,
                r.action,
                r.target,
                r.project,
                json.loads(r.before) if r.before else None,
                json.loads(r.after) if r.after else None,
            )
            for r in rows
        ]
