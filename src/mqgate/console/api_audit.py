"""The admin API's changes in the console's audit log (issue 13 §2): who (the admin token and
the caller's address), what, when, before → after, for every admin call that changes state.

`audited_routes(routes, gateway, engine)` gives the API's routes with each admin route that is
not a GET wrapped: the record it touches is read before the call, and once the call succeeded
the entry is written with the record after it. One line in `build_app` turns it on; wrapping
twice is harmless. The CLI's admin commands go through the API, so they land here too (marked
`via=cli` when the client names itself `mqgate-cli` in its User-Agent).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Final, Protocol

import msgspec
import sqlalchemy as sa
from msgspec.structs import replace

from mqgate.console.audit import AuditLog
from mqgate.console.tables import create_tables
from mqgate.registry.records import DEFAULT_PROJECT
from mqgate.services.gateway import Gateway
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

log = logging.getLogger(__name__)

# (method, route path) -> (audit action, kind of record it changes). The actions are the
# console's own names, so one filter ("consumer.") finds a change whichever way it was made.
ACTIONS: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("POST", "/admin/topics"): ("topic.create", "topic"),
    ("PATCH", "/admin/topics/{name}"): ("topic.change", "topic"),
    ("DELETE", "/admin/topics/{name}"): ("topic.delete", "topic"),
    ("POST", "/admin/producers"): ("producer.register", "producer"),
    ("DELETE", "/admin/producers/{name}"): ("producer.delete", "producer"),
    ("POST", "/admin/producers/{name}/token"): ("producer.token.rotate", "producer"),
    ("DELETE", "/admin/producers/{name}/token"): ("producer.token.revoke", "producer"),
    ("POST", "/admin/consumers"): ("consumer.register", "consumer"),
    ("PATCH", "/admin/consumers/{name}"): ("consumer.change", "consumer"),
    ("DELETE", "/admin/consumers/{name}"): ("consumer.delete", "consumer"),
    ("POST", "/admin/consumers/{name}/reset"): ("consumer.reset", "consumer"),
    ("POST", "/admin/consumers/{name}/pause"): ("consumer.pause", "consumer"),
    ("POST", "/admin/consumers/{name}/resume"): ("consumer.resume", "consumer"),
    ("POST", "/admin/consumers/{name}/rate-limit"): ("consumer.rate-limit", "consumer"),
    ("POST", "/admin/consumers/{name}/alert"): ("consumer.alert", "consumer"),
    ("POST", "/admin/consumers/{name}/token"): ("consumer.token.rotate", "consumer"),
    ("DELETE", "/admin/consumers/{name}/token"): ("consumer.token.revoke", "consumer"),
    ("POST", "/admin/consumers/{name}/dead-letters/redrive"): ("deadletter.redrive", "consumer"),
    ("POST", "/admin/topics/{name}/purge"): ("topic.purge", "topic"),
    ("POST", "/admin/consumers/{name}/purge"): ("consumer.purge", "consumer"),
    ("POST", "/admin/projects"): ("project.create", "project"),
    ("DELETE", "/admin/projects/{name}"): ("project.delete", "project"),
    ("PUT", "/admin/projects/{name}/clusters"): ("project.clusters", "project"),
    ("POST", "/admin/projects/{name}/failback"): ("project.failback", "project"),
    ("POST", "/admin/clusters"): ("cluster.add", ""),
    ("DELETE", "/admin/clusters/{name}"): ("cluster.remove", ""),
    ("POST", "/admin/trace-policies"): ("trace_policy.add", "policy"),
    ("DELETE", "/admin/trace-policies/{id}"): ("trace_policy.delete", "policy"),
    ("POST", "/admin/access-keys"): ("access_key.create", ""),  # the answer's secret is hidden
    ("DELETE", "/admin/access-keys/{name}"): ("access_key.revoke", ""),
}
# Calls whose answer says more than the record does (what moved, what was redriven).
KEEP_ANSWER: Final = frozenset({"consumer.reset", "deadletter.redrive", "topic.purge", "consumer.purge",
                                "project.clusters", "project.failback"})  # fmt: skip
PROJECT_PATH: Final = "/admin/projects/{name}"  # a route under it changes the project it names
SECRET_WORDS: Final = ("token", "secret", "password", "requestid")
MAX_LIST: Final = 50  # list items kept per list in an entry (a redrive of thousands)
MAX_TEXT: Final = 1000  # characters kept per string (message bodies)
CLI_AGENT: Final = b"mqgate-cli"
AUDITED: Final = "__mqgate_audited__"


class Recorder(Protocol):
    async def __call__(
        self,
        actor: str,
        action: str,
        target: str,
        before: Any,
        after: Any,
        *,
        via: str = ...,
        project: str = ...,
    ) -> None: ...


def api_auditor(engine: sa.Engine) -> Recorder:
    """`await record(actor, action, target, before, after, via="api", project="")`: one entry."""
    create_tables(engine)
    audit = AuditLog(engine)

    async def record(
        actor: str, action: str, target: str, before: Any, after: Any, *, via: str = "api", project: str = ""
    ) -> None:
        await audit.record_async(actor, action, target, via=via, project=project, before=before, after=after)

    return record


def clean(value: Any) -> Any:
    """A value as an entry keeps it: builtins, no secrets (tokens, passwords, request ids, which
    are ack tokens), long lists and strings cut."""
    value = msgspec.to_builtins(value)
    if isinstance(value, dict):
        return {
            k: "(hidden)" if any(w in str(k).lower().replace("_", "") for w in SECRET_WORDS) else clean(v)
            for k, v in value.items()
            if k != "token_hash"
        }
    if isinstance(value, list):
        kept = [clean(v) for v in value[:MAX_LIST]]
        return [*kept, f"… {len(value) - MAX_LIST} more"] if len(value) > MAX_LIST else kept
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + "…"
    return value


class ApiAudit(msgspec.Struct):
    gateway: Gateway
    record: Recorder
    failures: int = 0  # entries that could not be written (logged; the change itself stands)

    def _record_of(self, kind: str, name: str | None) -> Any:
        if name is None:
            return None
        snap = self.gateway.ctx.registry.snapshot
        records: dict[str, dict[str, Any]] = {
            "topic": snap.topics,
            "producer": snap.producers,
            "consumer": snap.consumers,
            "project": snap.projects,
            "policy": snap.policies,
        }
        found = records[kind].get(name)
        return None if found is None else clean(found)

    def _project_of(self, kind: str, name: str, rec: dict[str, Any] | None) -> str:
        """The project an entry is filed under (who may read it follows from it)."""
        if kind == "project":
            return name
        if rec is None:
            return ""
        snap = self.gateway.ctx.registry.snapshot

        def of_topic(topic: Any) -> str:
            t = snap.topics.get(str(topic))
            return t.project if t is not None else ""

        if kind == "topic":
            return str(rec.get("project") or DEFAULT_PROJECT)
        if kind in ("producer", "consumer"):
            return of_topic(rec.get("topic")) or DEFAULT_PROJECT
        # a policy: its project, its topic's, or its service's topic's
        if rec.get("project"):
            return str(rec["project"])
        if rec.get("topic"):
            return of_topic(rec["topic"])
        service = snap.producers.get(str(rec.get("service"))) or snap.consumers.get(str(rec.get("service")))
        return of_topic(service.topic) if service is not None else ""

    def wrap(self, route: Route) -> Route:
        if route.role != "admin" or route.method == "GET" or getattr(route.handler, AUDITED, False):
            return route
        action, kind = ACTIONS.get((route.method, route.path), (f"api {route.method} {route.path}", ""))
        inner = route.handler

        @functools.wraps(inner)
        async def handler(request: Request) -> Response:
            name = _name_of(request.input)
            before = self._record_of(kind, name) if kind else None
            response = await inner(request)
            if response.status < 400:
                await self._audit(request, response, action, kind, name, before, route.path)
            return response

        setattr(handler, AUDITED, True)
        return replace(route, handler=handler)

    async def _audit(
        self,
        request: Request,
        response: Response,
        action: str,
        kind: str,
        name: str | None,
        before: Any,
        path: str = "",
    ) -> None:
        try:
            if name is None:  # made by the call: its answer names it (a policy's id)
                name = _name_of(response.result)
            record = self._record_of(kind, name) if kind else None
            after: Any = record
            if action in KEEP_ANSWER or not kind:
                after = {"record": record, "request": clean(request.input), "answer": clean(response.result)}
            agent = request.headers.get(b"user-agent", b"")
            await self.record(
                f"admin-token@{request.client_host or 'unknown'}",
                action,
                name or request.path,
                before,
                after,
                via="cli" if agent.startswith(CLI_AGENT) else "api",
                project=self._project_of(kind, name or "", record or before) or _project_named(path, request),
            )
        except Exception:  # the change is made and answered: a lost entry is logged, not a 500
            self.failures += 1
            log.exception("audit entry for %s %s was not written", request.method, request.path)


def _project_named(path: str, request: Request) -> str:
    """The project a call names, for one of no known kind: its path's (`/admin/projects/{name}/…`)
    or its body's `project`; "" when it names none (a cluster, an access key)."""
    if path.startswith(PROJECT_PATH):
        return _name_of(request.input) or ""
    found = getattr(request.input, "project", None)
    return found if isinstance(found, str) else ""


def _name_of(value: Any) -> str | None:
    for attr in ("name", "id"):
        found = getattr(value, attr, None)
        if isinstance(found, str):
            return found
    return None


def audited_routes(routes: list[Route], gateway: Gateway, engine: sa.Engine) -> list[Route]:
    """`routes` with every admin state change recorded in the audit log (see the module)."""
    audit = ApiAudit(gateway, api_auditor(engine))
    return [audit.wrap(r) for r in routes]
