"""The audit log page, users and their roles, and the projects' self-service setting."""

from __future__ import annotations

from mqgate.console.app import Console, Route, Visit
from mqgate.console.audit import AuditFilter
from mqgate.console.pages.common import require_admin, require_change, required, snapshot
from mqgate.console.pages.operations import parse_time
from mqgate.console.projects import all_projects
from mqgate.console.roles import EVERY_PROJECT, ROLES
from mqgate.console.web import WebResponse, redirect


class AdminPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def audit(self, v: Visit) -> WebResponse:
        me = v.principal
        since, until = v.req.arg("since"), v.req.arg("until")
        # Everyone sees what happened in their projects; admins see everything.
        projects = None if me.is_admin else [*me.visible(all_projects(snapshot(self.c))), ""]
        wanted = v.req.arg("project")
        if wanted:
            projects = [wanted] if projects is None or wanted in projects else []
        f = AuditFilter(
            actor=v.req.arg("actor") or None,
            action=v.req.arg("action") or None,
            target=v.req.arg("target") or None,
            projects=projects,
            since_ms=parse_time(since) if since else None,
            until_ms=parse_time(until) if until else None,
            before_id=v.req.int_arg("before"),
        )
        entries = await self.c.db(self.c.audit.query, f)
        if not me.is_admin:  # entries of no project (sign-ins, users) are one's own only
            entries = [e for e in entries if e.project or e.actor == me.name]
        query = {k: v.req.arg(k) for k in ("actor", "action", "target", "project", "since", "until")}
        return self.c.page(v, "audit.html", entries=entries, q=query)

    async def users(self, v: Visit) -> WebResponse:
        require_admin(v)
        rows = await self.c.db(self.c.accounts.list)
        projects = all_projects(snapshot(self.c))
        settings = {p: await self.c.db(self.c.applications.auto_approve, p) for p in projects}
        return self.c.page(
            v, "users.html", rows=rows, roles=ROLES, projects=[EVERY_PROJECT, *projects], auto=settings
        )

    async def add_user(self, v: Visit) -> WebResponse:
        require_admin(v)
        name, role, project = required(v, "name"), required(v, "role"), v.req.arg("project", EVERY_PROJECT)
        row = await self.c.db(self.c.accounts.add, name, required(v, "password"), role, project)
        after = {"grants": [[g.role, g.project] for g in row.grants]}
        await self.c.audit_change(v, "user.add", name, "", after=after)
        return redirect(self.c.url(f"/users?note=user {name} added"))

    async def grant(self, v: Visit) -> WebResponse:
        require_admin(v)
        name, role, project = v.params["name"], required(v, "role"), required(v, "project")
        revoke = v.req.arg("revoke") == "yes"
        await self.c.db(self.c.accounts.revoke if revoke else self.c.accounts.grant, name, role, project)
        action = "user.revoke" if revoke else "user.grant"
        await self.c.audit_change(
            v, action, name, "" if project == EVERY_PROJECT else project, after=[role, project]
        )
        return redirect(
            self.c.url(f"/users?note={name}: {role} on {project} {'revoked' if revoke else 'granted'}")
        )

    async def delete_user(self, v: Visit) -> WebResponse:
        require_admin(v)
        name = v.params["name"]
        await self.c.db(self.c.accounts.delete, name)
        await self.c.audit_change(v, "user.delete", name, "")
        return redirect(self.c.url(f"/users?note=user {name} deleted"))

    async def auto_approve(self, v: Visit) -> WebResponse:
        project = v.params["project"]
        require_change(v, project)
        on = v.req.arg("on") == "yes"
        before = await self.c.db(self.c.applications.auto_approve, project)
        await self.c.db(self.c.applications.set_auto_approve, project, on)
        await self.c.audit_change(v, "project.auto_approve", project, project, before, on)
        return redirect(self.c.url(f"/applications?note={project}: auto-approve {'on' if on else 'off'}"))

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/audit", self.audit),
            Route("GET", "/users", self.users),
            Route("POST", "/users", self.add_user),
            Route("POST", "/users/{name}/grant", self.grant),
            Route("POST", "/users/{name}/delete", self.delete_user),
            Route("POST", "/projects/{project}/auto-approve", self.auto_approve),
        ]
