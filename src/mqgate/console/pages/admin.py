"""The audit log page, users and their roles, the projects' self-service setting, and the
settings in force."""

from __future__ import annotations

from mqgate.console.app import Console, principal, route
from mqgate.console.audit import AuditFilter
from mqgate.console.pages.common import require_admin, require_change, required, snapshot
from mqgate.console.pages.operations import parse_time
from mqgate.console.projects import all_projects
from mqgate.console.roles import EVERY_PROJECT, ROLES
from mqgate.console.settings_view import setting_rows
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route


class AdminPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def audit(self, v: Request) -> Response:
        me = principal(v)
        since, until = v.arg("since"), v.arg("until")
        # Everyone sees what happened in their projects; admins see everything.
        projects = None if me.is_admin else [*me.visible(all_projects(snapshot(self.c))), ""]
        wanted = v.arg("project")
        if wanted:
            projects = [wanted] if projects is None or wanted in projects else []
        f = AuditFilter(
            actor=v.arg("actor") or None,
            action=v.arg("action") or None,
            target=v.arg("target") or None,
            projects=projects,
            since_ms=parse_time(since) if since else None,
            until_ms=parse_time(until) if until else None,
            before_id=v.int_arg("before"),
        )
        entries = await self.c.db(self.c.audit.query, f)
        if not me.is_admin:  # entries of no project (sign-ins, users) are one's own only
            entries = [e for e in entries if e.project or e.actor == me.name]
        query = {k: v.arg(k) for k in ("actor", "action", "target", "project", "since", "until")}
        return self.c.page(v, "audit.html", entries=entries, q=query)

    async def users(self, v: Request) -> Response:
        require_admin(v)
        rows = await self.c.db(self.c.accounts.list)
        projects = all_projects(snapshot(self.c))
        settings = {p: await self.c.db(self.c.applications.auto_approve, p) for p in projects}
        return self.c.page(
            v, "users.html", rows=rows, roles=ROLES, projects=[EVERY_PROJECT, *projects], auto=settings
        )

    async def settings(self, v: Request) -> Response:
        require_admin(v)
        rows = setting_rows(self.c.settings)
        changed = v.arg("show") != "all"
        shown = [r for r in rows if r.source != "default"] if changed else rows
        return self.c.page(v, "settings.html", rows=shown, total=len(rows), changed=changed)

    async def add_user(self, v: Request) -> Response:
        require_admin(v)
        name, role, project = required(v, "name"), required(v, "role"), v.arg("project", EVERY_PROJECT)
        row = await self.c.db(self.c.accounts.add, name, required(v, "password"), role, project)
        after = {"grants": [[g.role, g.project] for g in row.grants]}
        await self.c.audit_change(v, "user.add", name, "", after=after)
        return redirect(self.c.url(f"/users?note=user {name} added"))

    async def grant(self, v: Request) -> Response:
        require_admin(v)
        name, role, project = v.params["name"], required(v, "role"), required(v, "project")
        revoke = v.arg("revoke") == "yes"
        await self.c.db(self.c.accounts.revoke if revoke else self.c.accounts.grant, name, role, project)
        action = "user.revoke" if revoke else "user.grant"
        await self.c.audit_change(
            v, action, name, "" if project == EVERY_PROJECT else project, after=[role, project]
        )
        return redirect(
            self.c.url(f"/users?note={name}: {role} on {project} {'revoked' if revoke else 'granted'}")
        )

    async def delete_user(self, v: Request) -> Response:
        require_admin(v)
        name = v.params["name"]
        await self.c.db(self.c.accounts.delete, name)
        await self.c.audit_change(v, "user.delete", name, "")
        return redirect(self.c.url(f"/users?note=user {name} deleted"))

    async def auto_approve(self, v: Request) -> Response:
        project = v.params["project"]
        require_change(v, project)
        on = v.arg("on") == "yes"
        before = await self.c.db(self.c.applications.auto_approve, project)
        await self.c.db(self.c.applications.set_auto_approve, project, on)
        await self.c.audit_change(v, "project.auto_approve", project, project, before, on)
        return redirect(self.c.url(f"/applications?note={project}: auto-approve {'on' if on else 'off'}"))

    def routes(self) -> list[Route]:
        return [
            route("GET", "/audit", self.audit),
            route("GET", "/users", self.users),
            route("GET", "/settings", self.settings),
            route("POST", "/users", self.add_user),
            route("POST", "/users/{name}/grant", self.grant),
            route("POST", "/users/{name}/delete", self.delete_user),
            route("POST", "/projects/{project}/auto-approve", self.auto_approve),
        ]
