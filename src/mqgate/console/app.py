"""The console's ASGI application: routing, sessions, CSRF, rendering, errors.

Every page is rendered on the server; every state change is a POST of a form that carries the
session's CSRF token (sign-in carries a double-submit token, as there is no session yet), from
this origin. A page is only rendered for a signed-in user; what they may see and change
follows from their grants (roles.py), checked by each page before it reads or changes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import mimetypes
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import jinja2
import sqlalchemy as sa

from mqgate.alerts.service import Alerts
from mqgate.console.accounts import Accounts
from mqgate.console.applications import Applications
from mqgate.console.audit import AuditLog
from mqgate.console.identity import IdentityProvider
from mqgate.console.roles import Principal
from mqgate.console.sessions import Session, SessionPolicy, Sessions
from mqgate.console.tables import create_tables, engine_for
from mqgate.console.throttle import Limits, Throttle
from mqgate.console.web import (
    WebRequest,
    WebResponse,
    read_request,
    redirect,
    send_response,
    trusted_networks,
)
from mqgate.errors import Forbidden, MqgateError, NotFound
from mqgate.platform import Platform
from mqgate.settings import Settings
from mqgate.web.asgi import ASGIApp, Receive, Scope, Send
from mqgate.web.router import Router

log = logging.getLogger(__name__)
HERE: Final = Path(__file__).parent
# Third-party files shipped under static/vendor/<name>/ (scripts/vendor_uplot.sh), by version: a
# page asks for them with ?v=<version>, so a browser may keep them until the version changes.
VENDORED: Final = {"uplot": "1.6.32"}
VENDOR_CACHE: Final = b"public, max-age=31536000, immutable"
STATIC_TYPES: Final = {".js": b"text/javascript; charset=utf-8", ".css": b"text/css; charset=utf-8"}
MOUNT: Final = "/console"
SESSION_COOKIE: Final = "mqgate_console"
SIGNIN_COOKIE: Final = "mqgate_console_signin"  # the sign-in form's double-submit token
T = TypeVar("T")


@dataclass(slots=True)
class Visit:
    """One request to the console, with who makes it."""

    req: WebRequest
    params: dict[str, str] = field(default_factory=dict)
    user: Principal | None = None
    session: Session | None = None
    cookie: str = ""

    @property
    def principal(self) -> Principal:
        if self.user is None:
            raise Forbidden("sign in first")
        return self.user


Handler = Callable[[Visit], Awaitable[WebResponse]]


@dataclass(slots=True, frozen=True)
class Route:
    method: str
    path: str  # "{name}" segments are parameters
    handler: Handler
    public: bool = False  # reachable without signing in (sign-in itself, static files)
    # A part of a page its script fetches again (live figures): without a session it answers
    # 403 instead of sending the browser to the sign-in page.
    fragment: bool = False


class Console:
    """What every page uses: the gateway's services, the console's stores, the templates."""

    def __init__(
        self,
        platform: Platform,
        settings: Settings,
        engine: sa.Engine,
        *,
        session_policy: SessionPolicy,
        limits: Limits,
        providers: list[IdentityProvider],
        mount: str,
    ) -> None:
        self.platform = platform
        self.gateway = gateway = platform.gateway  # the data path
        self.alerts: Alerts | None = platform.alerts
        self.settings = settings
        self.engine = engine
        self.mount = mount
        self.accounts = Accounts(engine)
        self.sessions = Sessions(engine, session_policy)
        self.throttle = Throttle(engine, limits)
        self.audit = AuditLog(engine)
        self.applications = Applications(engine, gateway.ctx.secret)
        self.providers = providers
        self.trusted_proxies = trusted_networks(settings.console_trusted_proxies)
        self.cache: dict[str, Any] = {}  # what pages derive from a registry snapshot, for it
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.globals.update(
            url=self.url, when=when, when_ms=when_ms, mount=mount, vendored=VENDORED
        )

    def url(self, path: str) -> str:
        return self.mount + path

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A call to the database, off the event loop (as the registry does)."""
        return await asyncio.to_thread(lambda: fn(*args, **kwargs))

    def page(self, v: Visit, template: str, http_status: int = 200, **values: Any) -> WebResponse:
        html = self.templates.get_template(template).render(
            user=v.user,
            csrf=v.session.csrf if v.session else "",
            note=v.req.arg("note"),
            path=v.req.path,
            **values,
        )
        return WebResponse(html.encode(), http_status)

    async def audit_change(
        self, v: Visit, action: str, target: str, project: str, before: Any = None, after: Any = None
    ) -> None:
        await self.db(
            self.audit.record,
            v.principal.name,
            action,
            target,
            via="console",
            project=project,
            before=before,
            after=after,
        )


def when(ms: int | None) -> str:
    if not ms:
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when_ms(ms: int | None) -> str:
    """A moment to the millisecond (trace hops are milliseconds apart)."""
    if not ms:
        return "—"
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


def now_ms() -> int:
    return int(time.time() * 1000)


class ConsoleApp:
    def __init__(self, console: Console, routes: list[Route]) -> None:
        self.console = console
        self.router = Router(routes, missing="no page")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        c = self.console
        path = scope["path"]
        if not (path == c.mount or path.startswith(c.mount + "/")):  # "/" of the gateway: here
            return await send_response(send, redirect(c.url("/")))
        v = Visit(WebRequest(scope["method"], "/", {}, {}, "", False))
        started = time.perf_counter()
        try:
            v.req = await read_request(scope, receive, c.mount, c.trusted_proxies)
            route, v.params = self.router.match(v.req.method, v.req.path)
            if not route.public:
                await self._identify(v)
                if v.user is None:
                    if v.req.method == "GET" and not route.fragment:
                        return await send_response(send, redirect(c.url("/signin?next=") + c.url(v.req.path)))
                    raise Forbidden("sign in first (no session)")
                if v.req.method == "POST":
                    self._check_csrf(v)
            response = await route.handler(v)
        except MqgateError as exc:
            response = self._error(v, exc.http_status, exc.message, exc.field)
        except Exception:
            log.exception("console error on %s %s", scope["method"], scope["path"])
            response = self._error(v, 500, "internal error", None)
        took_ms = (time.perf_counter() - started) * 1000  # the page's server time, for benchmarks
        response.headers.append((b"server-timing", b"app;dur=%.2f" % took_ms))
        await send_response(send, response)

    async def _identify(self, v: Visit) -> None:
        value = v.req.cookies.get(SESSION_COOKIE, "")
        if not value:
            return
        c = self.console
        session = await c.db(c.sessions.find, value, now_ms())
        if session is None:
            return
        user = await c.db(c.accounts.principal, session.user)
        if user is not None:
            v.user, v.session, v.cookie = user, session, value

    def _check_csrf(self, v: Visit) -> None:
        """The form's token is the session's, and the form came from this origin."""
        assert v.session is not None
        check_origin(v.req)
        sent = v.req.arg("csrf")
        if not sent or not hmac.compare_digest(sent.encode(), v.session.csrf.encode()):
            raise Forbidden("the form's CSRF token is missing or wrong: reload the page", field="csrf")

    def _error(self, v: Visit, status: int, message: str, field_name: str | None) -> WebResponse:
        try:
            return self.console.page(
                v, "error.html", status, status=status, message=message, field=field_name
            )
        except Exception:  # the error page itself failed: plain text
            log.exception("console error page")
            return WebResponse(message.encode(), status, b"text/plain; charset=utf-8")


def check_origin(req: WebRequest) -> None:
    """A browser names the page a form came from: it must be this host."""
    origin = req.headers.get(b"origin") or req.headers.get(b"referer")
    if origin is None:
        return  # not a browser, or one that hides it: the CSRF token decides
    host = req.headers.get(b"host", b"")
    text = origin.decode("latin-1")
    if text == "null" or text.split("://", 1)[-1].split("/", 1)[0].encode() != host:
        raise Forbidden("the form was sent from another site", field="origin")


def _static(folder: Path, name: str) -> WebResponse:
    path = folder / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise NotFound(f"no static file {name}", field="file")
    kind = STATIC_TYPES.get(path.suffix)
    if kind is None:
        kind = (mimetypes.guess_type(name)[0] or "application/octet-stream").encode()
    return WebResponse(path.read_bytes(), 200, kind)


async def static_file(v: Visit) -> WebResponse:
    return _static(HERE / "static", v.params["file"])


async def vendor_file(v: Visit) -> WebResponse:
    lib = v.params["lib"]
    if lib not in VENDORED:
        raise NotFound(f"no static file {lib}/{v.params['file']}", field="file")
    answer = _static(HERE / "static" / "vendor" / lib, v.params["file"])
    answer.headers.append((b"cache-control", VENDOR_CACHE))
    return answer


def build_console(
    platform: Platform,
    settings: Settings,
    engine_or_url: sa.Engine | str,
    *,
    session_policy: SessionPolicy | None = None,
    limits: Limits | None = None,
    providers: list[IdentityProvider] | None = None,
    mount: str = MOUNT,
) -> ConsoleApp:
    """The console for one gateway process, as an ASGI app answering under `mount`. Its tables
    are made in the registry's database if they are not there yet."""
    from mqgate.console.pages import all_routes

    engine = engine_for(engine_or_url)
    create_tables(engine)
    console = Console(
        platform,
        settings,
        engine,
        session_policy=session_policy or SessionPolicy(),
        limits=limits or Limits(),
        providers=providers or [],
        mount=mount,
    )
    routes = [
        Route("GET", "/static/{file}", static_file, public=True),
        Route("GET", "/static/vendor/{lib}/{file}", vendor_file, public=True),
        *all_routes(console),
    ]
    return ConsoleApp(console, routes)


def with_console(api: ASGIApp, console: ASGIApp, mount: str = MOUNT) -> ASGIApp:
    """One ASGI app: `/` and everything under `mount` to the console (which sends `/` on to
    its overview), everything else to the API (which also gets the lifespan events)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path in ("/", mount) or path.startswith(mount + "/")):
            return await console(scope, receive, send)
        await api(scope, receive, send)

    return app
