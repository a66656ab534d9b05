"""Self-service with approval (MQCloud): apply, approve or reject with a comment, see the new
token once; a project may approve its applications by itself."""

from __future__ import annotations

from typing import Any

from mqgate.api.shapes import ConsumerIn, TopicIn
from mqgate.console.app import Console, principal, route
from mqgate.console.applications import APPROVED, FAILED, KINDS, PENDING, REJECTED, Application
from mqgate.console.pages.common import form_input, require_change, required, snapshot, visible_topics
from mqgate.console.pages.topology import HOUR_MS, register_client, topic_form
from mqgate.console.projects import all_projects, create_topic_in, topic_project
from mqgate.errors import BadRequest, Forbidden, MqgateError, NotFound
from mqgate.names import validate_name
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

AUTO = "auto-approve"


class SelfServicePages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def overview(self, v: Request) -> Response:
        me = principal(v)
        projects = all_projects(snapshot(self.c))
        mine = await self.c.db(self.c.applications.list, applicant=me.name)
        deciding = me.changeable(projects)
        to_decide = await self.c.db(self.c.applications.list, projects=deciding) if deciding else []
        auto = {p: await self.c.db(self.c.applications.auto_approve, p) for p in deciding}
        return self.c.page(
            v,
            "applications.html",
            kinds=KINDS,
            projects=me.applicable(projects),
            topics=[t for t in visible_topics(self.c, v) if me.can_apply(topic_project(t))],
            mine=mine,
            pending=[a for a in to_decide if a.state == PENDING],
            decided=[a for a in to_decide if a.state != PENDING][:50],
            auto=auto,
        )

    async def apply(self, v: Request) -> Response:
        kind, name = required(v, "kind"), required(v, "name")
        if kind not in KINDS:
            raise BadRequest(f"kind must be one of {', '.join(KINDS)}", field="kind")
        validate_name(name, "name")
        settings: dict[str, Any] = {}
        if kind == "topic":
            project = required(v, "project")
            topic_in = topic_form(self.c, v, project)  # refused now, not when it is approved
            settings = {
                "queues": topic_in.queues or self.c.settings.default_queues,
                "max_priority": topic_in.max_priority,
                "retention_hours": v.float_arg("retention_hours"),
            }
        else:
            topic = required(v, "topic")
            project = topic_project(await self.c.gateway.topology.topic(topic))
            settings = {"topic": topic}
            if kind == "consumer":  # checked and defaulted as the API does, now, not when approved
                wanted = form_input(
                    self.c,
                    ConsumerIn,
                    name=name,
                    topic=topic,
                    mode=v.arg("mode") or None,
                    start=v.arg("start") or None,
                )
                settings |= {"mode": wanted.mode, "start": wanted.start}
        if not principal(v).can_apply(project):
            raise Forbidden(f"applying in project {project} needs the member role", field="project")
        apps = self.c.applications
        app_id = await self.c.db(apps.apply, kind, name, project, settings, principal(v).name)
        await self.c.audit_change(v, f"application.{kind}", name, project, after={"id": app_id, **settings})
        if not await self.c.db(apps.auto_approve, project):
            return redirect(self.c.url(f"/applications?note=application {app_id} sent for approval"))
        token = await self._carry_out(
            v, await self.c.db(apps.get, app_id), AUTO, "approved by the project's setting"
        )
        if token is None:
            return redirect(self.c.url(f"/applications?note=application {app_id} approved"))
        await self.c.db(apps.take_token, app_id, principal(v).name)  # shown now: not kept
        back = self.c.url("/applications")
        return self.c.page(v, "token.html", kind=kind, name=name, token=token, back=back)

    async def _carry_out(self, v: Request, app: Application, by: str, comment: str) -> str | None:
        """Register what `app` asks for; its token (None for a topic). A refusal (the name is
        taken, the topic went) marks the application failed with the reason."""
        apps = self.c.applications
        if not await self.c.db(apps.claim, app.id):
            raise BadRequest(f"application {app.id} was decided already", field="id")
        s = app.settings
        try:
            token = None
            if app.kind == "topic":
                # Checked again as the API would: an application stored before a limit changed
                # (or written to the table by hand) is refused, not carried out.
                hours = s.get("retention_hours")
                topic_in = form_input(
                    self.c,
                    TopicIn,
                    name=app.name,
                    project=app.project,
                    queues=s.get("queues"),
                    max_priority=s.get("max_priority"),
                    retention_ms=int(hours * HOUR_MS) if hours is not None else None,
                )
                await create_topic_in(
                    self.c.gateway,
                    app.name,
                    app.project,
                    topic_in.queues or self.c.settings.default_queues,
                    topic_in.retention_ms or self.c.settings.default_retention_ms,
                    topic_in.max_priority,
                )
            else:
                token = await register_client(
                    self.c, app.kind, app.name, s["topic"], s.get("mode", ""), s.get("start", "")
                )
        except MqgateError as exc:
            await self.c.db(apps.settle, app.id, FAILED, by, f"{comment} — refused: {exc.message}")
            await self.c.audit_change(v, "application.failed", app.name, app.project, after={"id": app.id})
            raise
        await self.c.db(apps.settle, app.id, APPROVED, by, comment, token)
        await self.c.audit_change(
            v, f"{app.kind}.register", app.name, app.project, after={"application": app.id, **s}
        )
        return token

    async def _pending(self, v: Request) -> Application:
        app_id = v.params["id"]
        if not app_id.isdigit():
            raise NotFound(f"application {app_id} does not exist", field="id")
        app = await self.c.db(self.c.applications.get, int(app_id))
        require_change(v, app.project)
        return app

    async def approve(self, v: Request) -> Response:
        app = await self._pending(v)
        comment = v.arg("comment")
        await self._carry_out(v, app, principal(v).name, comment)
        await self.c.audit_change(
            v, "application.approve", app.name, app.project, after={"id": app.id, "comment": comment}
        )
        return redirect(self.c.url(f"/applications?note=application {app.id} approved"))

    async def reject(self, v: Request) -> Response:
        app = await self._pending(v)
        comment = required(v, "comment")
        await self.c.db(self.c.applications.decide, app.id, REJECTED, principal(v).name, comment)
        await self.c.audit_change(
            v, "application.reject", app.name, app.project, after={"id": app.id, "comment": comment}
        )
        return redirect(self.c.url(f"/applications?note=application {app.id} rejected"))

    async def token(self, v: Request) -> Response:
        app_id = v.params["id"]
        app = await self.c.db(self.c.applications.get, int(app_id) if app_id.isdigit() else -1)
        token = await self.c.db(self.c.applications.take_token, app.id, principal(v).name)
        if token is None:
            raise NotFound(
                "the token was shown once already (or is not yours): rotate it to get a new one", field="id"
            )
        await self.c.audit_change(
            v, f"{app.kind}.token.shown", app.name, app.project, after={"application": app.id}
        )
        return self.c.page(
            v, "token.html", kind=app.kind, name=app.name, token=token, back=self.c.url("/applications")
        )

    def routes(self) -> list[Route]:
        return [
            route("GET", "/applications", self.overview),
            route("POST", "/applications", self.apply),
            route("POST", "/applications/{id}/approve", self.approve),
            route("POST", "/applications/{id}/reject", self.reject),
            route("POST", "/applications/{id}/token", self.token),
        ]
