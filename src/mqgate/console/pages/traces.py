"""Traces (SPEC P2-P6): find a message's path by message id, request id or key and show it as
a timeline with the failing hop marked, and the trace policies that decide what is traced."""

from __future__ import annotations

from typing import Final

from mqgate.console.app import Console, principal, route
from mqgate.console.pages.common import listing, snapshot
from mqgate.console.projects import all_projects, topic_project, user_topics
from mqgate.errors import BadRequest, Forbidden
from mqgate.registry.records import PolicyRecord
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

# What the search form offers, as (form value, label, keyword of TraceLookup.find).
FIND_BY: Final = (("msgId", "Message id", "msg_id"), ("requestId", "Request id", "request_id"),
                  ("key", "Key", "key"))  # fmt: skip
MODES: Final = ("project", "route", "queue", "service")
LEVELS: Final = ("info", "error", "debug")
SERVICE_CHOICES: Final = 300  # producer and consumer names offered while typing (any may be typed)
# Consumer states a reader should notice first.
STATE_CLASS: Final = {
    "dead_lettered": "bad",
    "in_retry": "warn",
    "redriven": "warn",
    "in_delivery": "warn",
    "consumed": "ok",
}


class TracePages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def search(self, v: Request) -> Response:
        by, value = v.arg("by", "msgId"), v.arg("value")
        keyword = next((k for form, _, k in FIND_BY if form == by), None)
        if keyword is None:
            raise BadRequest("find by msgId, requestId or key", field="by")
        found = None
        paths = []
        if value:
            found = await self.c.platform.trace_lookup.find(**{
                "msg_id": None, "request_id": None, "key": None, keyword: value
            })  # fmt: skip
            # A path is shown to whoever may see its project; the others are not even counted:
            # an id traced only in a project one cannot see gets the page of an id traced nowhere.
            paths = [p for p in found.paths if principal(v).can_view(p.path.project)]
        return self.c.page(
            v,
            "traces.html",
            find_by=FIND_BY,
            by=by,
            value=value,
            found=found,
            paths=paths,
            state_class=STATE_CLASS,
        )

    # --- policies ---------------------------------------------------------------------------

    def _projects_of(self, rec: PolicyRecord) -> set[str]:
        return self.c.platform.projects.projects_of(rec)

    def _require_policy_change(self, v: Request, rec: PolicyRecord) -> None:
        """An admin, or an owner of every project the policy can select."""
        if principal(v).is_admin:
            return
        projects = self._projects_of(rec)
        if not projects:
            raise Forbidden("only an admin may name what no project of yours holds", field="selector")
        refused = sorted(p for p in projects if not principal(v).can_change(p))
        if refused:
            shown = ", ".join(refused)
            raise Forbidden(f"a trace policy on {shown} needs the owner or admin role", field="project")

    async def policies(self, v: Request) -> Response:
        me = principal(v)
        snap = snapshot(self.c)
        rows = []
        for rec in self.c.platform.projects.policies():
            projects = self._projects_of(rec)
            if me.is_admin or any(me.can_view(p) for p in projects):
                can_delete = me.is_admin or (bool(projects) and all(me.can_change(p) for p in projects))
                rows.append({"p": rec, "projects": sorted(projects), "can_delete": can_delete})
        changeable = me.changeable(all_projects(snap))
        topics = [t for t in user_topics(snap) if topic_project(t) in changeable]
        mine = set(changeable)
        known = listing(self.c)
        services = sorted(
            {p.name for p, project in known.producers if project in mine}
            | {x.name for x, project in known.consumers if project in mine}
        )
        return self.c.page(
            v,
            "policies.html",
            rows=rows,
            modes=MODES,
            levels=LEVELS,
            projects=changeable,
            topics=topics,
            services=services[:SERVICE_CHOICES],
            more_services=len(services) > SERVICE_CHOICES,
        )

    async def add_policy(self, v: Request) -> Response:
        mode, level = v.arg("mode"), v.arg("level", "info")
        if mode not in MODES:
            raise BadRequest(f"mode must be one of {', '.join(MODES)}", field="mode")
        # Only the selector of the chosen mode is sent on (the form shows them all).
        project = (v.arg("project") or None) if mode == "project" else None
        topic = (v.arg("topic") or None) if mode in ("route", "queue") else None
        queue = v.int_arg("queue") if mode == "queue" else None
        service = (v.arg("service") or None) if mode == "service" else None
        draft = PolicyRecord("", mode, level, project, topic, queue, service, 0)
        self._require_policy_change(v, draft)
        rec = await self.c.platform.projects.add_policy(
            mode, level, project=project, topic=topic, queue=queue, service=service
        )
        project_name = _one(self._projects_of(rec))
        await self.c.audit_change(v, "trace_policy.add", rec.id, project_name, after=_plain(rec))
        return redirect(self.c.url(f"/traces/policies?note=trace policy {rec.id} added"))

    async def delete_policy(self, v: Request) -> Response:
        policy_id = v.params["id"]
        rec = self.c.gateway.ctx.registry.snapshot.policies.get(policy_id)
        if rec is None:
            await self.c.platform.projects.delete_policy(policy_id)  # 404 naming the id
            return redirect(self.c.url("/traces/policies"))
        self._require_policy_change(v, rec)
        await self.c.platform.projects.delete_policy(policy_id)
        await self.c.audit_change(
            v, "trace_policy.delete", policy_id, _one(self._projects_of(rec)), before=_plain(rec)
        )
        return redirect(self.c.url(f"/traces/policies?note=trace policy {policy_id} deleted"))

    def routes(self) -> list[Route]:
        return [
            route("GET", "/traces", self.search),
            route("GET", "/traces/policies", self.policies),
            route("POST", "/traces/policies", self.add_policy),
            route("POST", "/traces/policies/{id}/delete", self.delete_policy),
        ]


def _one(projects: set[str]) -> str:
    """The project an audit entry is filed under: the policy's one project, else none."""
    return next(iter(projects)) if len(projects) == 1 else ""


def _plain(rec: PolicyRecord) -> dict[str, object]:
    return {k: getattr(rec, k) for k in ("id", "mode", "level", "project", "topic", "queue", "service")}
