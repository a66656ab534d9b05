"""The console's ASGI application: routing, sessions, CSRF, rendering, errors.

Every page is rendered on the server; every state change is a POST of a form that carries the
session's CSRF token (sign-in carries a double-submit token, as there is no session yet), from
this origin. A page is only rendered for a signed-in user; what they may see and change
follows from their grants (roles.py), checked by each page before it reads or changes.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import math
import mimetypes
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import parse_qs

import msgspec
import sqlalchemy as sa

from mqgate.alerts.service import Alerts
from mqgate.api.shapes import ConsumerIn
from mqgate.console.accounts import Accounts
from mqgate.console.applications import Applications
from mqgate.console.audit import AuditLog
from mqgate.console.formats import TEMPLATE_GLOBALS
from mqgate.console.identity import IdentityProvider
from mqgate.console.redrives import RedriveTasks
from mqgate.console.roles import Principal
from mqgate.console.sessions import Session, SessionPolicy, Sessions
from mqgate.console.tables import create_tables, engine_for
from mqgate.console.throttle import Limits, Throttle
from mqgate.console.web import MAX_FORM_BYTES, SECURITY_HEADERS
from mqgate.errors import BadRequest, Forbidden, MqgateError, NotFound
from mqgate.platform import Platform
from mqgate.settings import Settings
from mqgate.web.app import Headers, WebApp
from mqgate.web.request import Request, trusted_networks
from mqgate.web.response import Response, page, redirect
from mqgate.web.route import Handler, Route

if TYPE_CHECKING:
    import jinja2

log = logging.getLogger(__name__)
HERE: Final = Path(__file__).parent
# Third-party files shipped under static/vendor/<name>/ (scripts/vendor_uplot.sh), by version: a
# page asks for them with ?v=<version>, so a browser may keep them until the version changes.
VENDORED: Final = {"uplot": "1.6.32"}
VENDOR_CACHE: Final = b"public, max-age=31536000, immutable"
STATIC_TYPES: Final = {
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
}
MOUNT: Final = "/console"
SESSION_COOKIE: Final = "mqgate_console"
SIGNIN_COOKIE: Final = "mqgate_console_signin"  # the sign-in form's double-submit token
T = TypeVar("T")


# public: anyone (sign-in, static files); signed_in: a signed-in user, sent to the sign-in page
# otherwise; fragment: a part of a page its script fetches again (live figures), which answers
# 403 without a session instead of sending the browser to the sign-in page.
ROLES: Final = frozenset({"public", "signed_in", "fragment"})


def route(method: str, path: str, handler: Handler, role: str = "signed_in") -> Route:
    return Route(method, path, handler, role)


class SessionCookie(msgspec.Struct, frozen=True):
    """What the session cookie names: the session, and the cookie's value (to end it)."""

    session: Session
    value: str
    pending: int = 0  # applications this user may decide (the navigation's badge)


def principal(v: Request) -> Principal:
    """Who is signed in (every page but the public ones has one)."""
    if not isinstance(v.caller, Principal):
        raise Forbidden("sign in first")
    return v.caller


def csrf_of(v: Request) -> str:
    return v.credential.session.csrf if isinstance(v.credential, SessionCookie) else ""


class SignInFirst(Forbidden):
    """A page asked for without a session: the browser is sent to the sign-in page."""


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
        self.redrives = RedriveTasks(gateway.dead_letters, self._audit_as)  # paced, in the background

    @functools.cached_property
    def templates(self) -> jinja2.Environment:
        """Made for the first page: importing jinja2 (16 ms) is not a part of a gateway's start."""
        import jinja2

        templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        templates.globals.update(
            url=self.url,
            when=when,
            when_ms=when_ms,
            mount=self.mount,
            vendored=VENDORED,
            defaults=form_defaults(self.settings),
            **TEMPLATE_GLOBALS,
        )
        return templates

    def url(self, path: str) -> str:
        return self.mount + path

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A call to the database, off the event loop (as the registry does)."""
        return await asyncio.to_thread(lambda: fn(*args, **kwargs))

    def page(self, v: Request, template: str, http_status: int = 200, **values: Any) -> Response:
        html = self.templates.get_template(template).render(
            user=v.caller if isinstance(v.caller, Principal) else None,
            csrf=csrf_of(v),
            awaiting=v.credential.pending if isinstance(v.credential, SessionCookie) else 0,
            note=v.arg("note"),
            path=v.path,
            **values,
        )
        return page(html.encode(), http_status)

    async def _audit_as(self, actor: str, action: str, target: str, project: str, after: Any) -> None:
        await self.db(self.audit.record, actor, action, target, via="console", project=project, after=after)

    async def audit_change(
        self, v: Request, action: str, target: str, project: str, before: Any = None, after: Any = None
    ) -> None:
        await self.db(
            self.audit.record,
            principal(v).name,
            action,
            target,
            via="console",
            project=project,
            before=before,
            after=after,
        )


def form_defaults(settings: Settings) -> dict[str, Any]:
    """What the console's forms start with: the API's own defaults (its request shapes and the
    settings it fills a missing field from), so both doors make the same thing of a blank field."""
    consumer = {f.name: f.default for f in msgspec.structs.fields(ConsumerIn)}
    return {
        "queues": settings.default_queues,
        "retention_hours": settings.default_retention_ms / 3_600_000,
        "mode": consumer["mode"],
        "start": consumer["start"],
        "modes": ("cluster", "broadcast", "message"),
        "starts": ("earliest", "latest"),
    }


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


class ConsoleDoor:
    """The console's side of the web layer: the session cookie, forms with their CSRF token, HTML
    answers with the security headers, errors as the error page."""

    roles = ROLES
    max_body_bytes = MAX_FORM_BYTES

    def __init__(self, console: Console) -> None:
        self.console = console

    async def admit(self, route: Route, request: Request) -> None:
        if route.role == "public":
            return
        await self._identify(request)
        if request.caller is None:
            if request.method == "GET" and route.role != "fragment":
                raise SignInFirst("sign in first")
            raise Forbidden("sign in first (no session)")

    def decode(self, route: Route, request: Request, body: bytes) -> None:
        if request.method != "POST":
            return
        kind = request.headers.get(b"content-type", b"").split(b";")[0].strip()
        if body and kind != b"application/x-www-form-urlencoded":
            raise BadRequest("forms are sent as application/x-www-form-urlencoded", field="body")
        request.form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)

    async def authorize(self, route: Route, request: Request) -> None:
        if route.role != "public" and request.method == "POST":
            self._check_csrf(request)

    def failed(self, request: Request, error: MqgateError) -> Response:
        c = self.console
        if isinstance(error, SignInFirst):
            return redirect(c.url("/signin?next=") + c.url(request.path))
        try:
            answer = c.page(
                request,
                "error.html",
                error.http_status,
                status=error.http_status,
                message=error.message,
                field=error.field,
            )
            if error.retry_after_s is not None:
                answer.headers.append((b"retry-after", str(math.ceil(error.retry_after_s)).encode()))
            return answer
        except Exception:  # the error page itself failed: plain text
            log.exception("console error page")
            return page(error.message.encode(), error.http_status, b"text/plain; charset=utf-8")

    def encode(self, response: Response) -> tuple[Headers, bytes]:
        own = {name for name, _ in response.headers}
        kept = [(name, value) for name, value in SECURITY_HEADERS if name not in own]
        body = response.body if response.body is not None else b""
        return [(b"content-type", response.content_type), *kept, *response.headers], body

    async def _identify(self, v: Request) -> None:
        value = v.cookies.get(SESSION_COOKIE, "")
        if not value:
            return
        c = self.console
        session = await c.db(c.sessions.find, value, now_ms())
        if session is None:
            return
        user = await c.db(c.accounts.principal, session.user)
        if user is None:
            return
        pending = 0
        if user.can_change_any and v.method == "GET":
            pending = await c.db(c.applications.pending_count, user.deciding)
        v.credential, v.caller = SessionCookie(session, value, pending), user

    def _check_csrf(self, v: Request) -> None:
        """The form's token is the session's, and the form came from this origin."""
        check_origin(v)
        sent = v.arg("csrf")
        expected = csrf_of(v)
        if not sent or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            raise Forbidden("the form's CSRF token is missing or wrong: reload the page", field="csrf")


def check_origin(req: Request) -> None:
    """A browser names the page a form came from: it must be this host."""
    origin = req.headers.get(b"origin") or req.headers.get(b"referer")
    if origin is None:
        return  # not a browser, or one that hides it: the CSRF token decides
    host = req.headers.get(b"host", b"")
    text = origin.decode("latin-1")
    if text == "null" or text.split("://", 1)[-1].split("/", 1)[0].encode() != host:
        raise Forbidden("the form was sent from another site", field="origin")


def _static(folder: Path, name: str) -> Response:
    path = folder / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise NotFound(f"no static file {name}", field="file")
    kind = STATIC_TYPES.get(path.suffix)
    if kind is None:
        kind = (mimetypes.guess_type(name)[0] or "application/octet-stream").encode()
    return page(path.read_bytes(), 200, kind)


async def static_file(v: Request) -> Response:
    return _static(HERE / "static", v.params["file"])


async def vendor_file(v: Request) -> Response:
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
) -> WebApp:
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
        limits=limits
        or Limits(
            settings.console_signin_failures_per_user,
            settings.console_signin_failures_per_ip,
            int(settings.console_signin_window_s * 1000),
        ),
        providers=providers or [],
        mount=mount,
    )
    routes = [
        route("GET", "/static/{file}", static_file, "public"),
        route("GET", "/static/vendor/{lib}/{file}", vendor_file, "public"),
        *all_routes(console),
    ]
    return WebApp(
        ConsoleDoor(console),
        routes,
        mount=mount,
        missing="no page",
        trusted_proxies=console.trusted_proxies,
        timing_header=True,  # the page's server time, for benchmarks
        role_limits=dict.fromkeys(("signed_in", "fragment"), settings.console_max_concurrent_requests),
    )
