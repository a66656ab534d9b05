"""The native API on the web layer (mqgate.web): roles, request shapes, the JSON envelope and
the one error handler.

Each route declares its role and its request shape; the app checks the credential a role needs
(who holds the bearer token) before it reads the body, decodes the request into its shape,
applies the limits that are settings, lets the role's guard name who is calling, and only then
calls the handler.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import msgspec

from mqgate.api.decoding import body_fields, content_kind, convert, decode_json, query_fields
from mqgate.api.shapes import Input
from mqgate.errors import BadRequest, MqgateError, PayloadTooLarge
from mqgate.web.asgi import Receive, Scope, Send, headers_of, read_body
from mqgate.web.router import Router, WrongMethod

log = logging.getLogger(__name__)

_json_encode = msgspec.json.Encoder().encode
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]

# none: anyone; admin: the admin token; producer: the named producer's token (or admin);
# consumer: the named consumer's token; token: the token of the consumer an ack token names;
# reader: the admin token or the named consumer's token (a reader of the log).
Role = Literal["none", "admin", "producer", "consumer", "token", "reader"]


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[bytes, bytes]
    client_host: str
    credential: Any = None  # who holds the bearer token, as the role's guard found it
    input: Any = None  # the route's request shape, decoded and checked
    caller: Any = None  # what the role's guard found: a producer, a consumer and token, ...

    @property
    def bearer(self) -> str | None:
        value = self.headers.get(b"authorization", b"").decode("latin-1")
        if value[:7].lower() == "bearer ":
            return value[7:].strip() or None
        return None


@dataclass(slots=True)
class Response:
    result: Any = None
    status: int = 200
    message: str = "ok"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    raw_body: bytes | None = None
    content_type: bytes = b"application/json"


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(slots=True, frozen=True)
class Route:
    method: str
    path: str  # segments in braces are path parameters, fields of the shape
    handler: Handler
    role: Role
    summary: str
    shape: type[Input] | None = None  # the request; None: the call takes no parameters
    answer: type[msgspec.Struct] | None = None  # the `result` of a 200 answer (None: not JSON)
    errors: tuple[int, ...] = ()  # error statuses beyond those of every route and of the role
    body: Literal["any", "json", "none"] = "any"  # "none": parameters in the query string


class Guard(Protocol):
    async def check_credential(self, role: Role, request: Request) -> None:
        """Before the body is read: find who holds the bearer token (`request.credential`);
        refuse a call without a known token (401) or whose token can never hold the role (403)."""

    async def caller(self, role: Role, request: Request) -> Any:
        """Who is calling, once the request is decoded (its shape names the producer, ...)."""


class Limits(Protocol):
    def check(self, value: Input) -> None:
        """Apply the limits that are settings; raise naming the field."""


def envelope(status: int, message: str, result: Any) -> bytes:
    return _json_encode({"status": status, "message": message, "result": result})


class App:
    """A small ASGI application: every answer is the JSON envelope, every error a 4xx/5xx."""

    def __init__(
        self,
        router: Router[Route],
        guard: Guard,
        limits: Limits,
        *,
        max_body_bytes: int,
        on_startup: Callable[[], Awaitable[None]],
        on_shutdown: Callable[[], Awaitable[None]],
        observe: Callable[[str, float, int], None],
        console: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None,
    ) -> None:
        self.console = console  # the web console (mqgate.console), served under /console
        self.router = router
        self.guard = guard
        self.limits = limits
        self.max_body_bytes = max_body_bytes
        self.on_startup = on_startup
        self.on_shutdown = on_shutdown
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if self.console is not None and (path in ("/", "/console") or path.startswith("/console/")):
                await self.console(scope, receive, send)
                return
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.on_startup()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        route_name = "unmatched"
        try:
            route, path_params = self.router.match(scope["method"], scope["path"])
            route_name = route.path
            client = scope.get("client")
            request = Request(scope["method"], scope["path"], headers_of(scope), client[0] if client else "")
            await self.guard.check_credential(route.role, request)
            body = (
                b""
                if route.body == "none"
                else await read_body(receive, request.headers, self.max_body_bytes)
            )
            request.input = self._decode(route, path_params, scope["query_string"], body, request.headers)
            if route.role != "none":
                request.caller = await self.guard.caller(route.role, request)
            response = await route.handler(request)
        except MqgateError as exc:
            response = Response(
                {"code": exc.code, "field": exc.field}, status=exc.http_status, message=exc.message
            )
            if exc.retry_after_s is not None:
                response.headers.append((b"retry-after", str(math.ceil(exc.retry_after_s)).encode()))
            if isinstance(exc, WrongMethod):
                response.headers.append((b"allow", exc.allow.encode()))
            if isinstance(exc, PayloadTooLarge) and exc.field == "body":
                response.headers.append((b"connection", b"close"))
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            response = Response({"code": "internal", "field": None}, status=500, message="internal error")
        body_bytes = (
            response.raw_body
            if response.raw_body is not None
            else envelope(response.status, response.message, response.result)
        )
        headers_out = (
            [(b"content-type", response.content_type), *response.headers]
            if response.headers or response.content_type != b"application/json"
            else _JSON_HEADERS
        )
        await send({"type": "http.response.start", "status": response.status, "headers": headers_out})
        await send({"type": "http.response.body", "body": body_bytes})
        self.observe(route_name, time.perf_counter() - started, response.status)

    def _decode(
        self,
        route: Route,
        path_params: dict[str, str],
        query: bytes,
        body: bytes,
        headers: dict[bytes, bytes],
    ) -> Input | None:
        content_type = headers.get(b"content-type", b"")
        if route.shape is None:
            extra = {**query_fields(query), **(body_fields(body, content_type, False) if body else {})}
            if extra:
                name = sorted(extra)[0]
                raise BadRequest(f"{name} is not a parameter of this call", field=name)
            return None
        value = None
        if (
            body
            and not query
            and not path_params
            and content_kind(content_type) in (b"application/json", b"")
        ):
            value = decode_json(body, route.shape)  # the fast path: a valid JSON body
        if value is None:
            fields: dict[str, Any] = {**query_fields(query)}
            if body:
                fields.update(body_fields(body, content_type, route.body == "json"))
            elif route.body == "json":
                body_fields(body, content_type, True)  # refuses a form body
            fields.update(path_params)
            value = convert(fields, route.shape)
        self.limits.check(value)
        return value
