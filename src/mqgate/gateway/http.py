"""The ASGI edge: request parsing, routing, the JSON envelope and the one error handler."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl

import msgspec

from mqgate.errors import (
    BadRequest,
    MethodNotAllowed,
    MqgateError,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
)

log = logging.getLogger(__name__)

JSON_TYPE: Final = b"application/json"
FORM_TYPE: Final = b"application/x-www-form-urlencoded"
_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class Request:
    method: str
    path: str
    params: dict[str, Any]
    path_params: dict[str, str]
    headers: dict[bytes, bytes]
    client_host: str
    body: bytes = b""

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
    path: str  # segments in braces are path parameters
    handler: Handler
    auth: str  # "producer" | "consumer" | "admin" | "none"
    summary: str
    params: tuple[tuple[str, str, bool, str], ...] = ()  # (name, type, required, description)
    body: str = "any"  # "json", "any" (JSON or form), "raw" (JSON the handler decodes) or "none"


def envelope(status: int, message: str, result: Any) -> bytes:
    return _json_encode({"status": status, "message": message, "result": result})


class Router:
    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: list[tuple[list[str], dict[str, Route]]] = []
        for r in routes:
            if "{" in r.path:
                segs = r.path.strip("/").split("/")
                for existing, methods in self._patterns:
                    if existing == segs:
                        methods[r.method] = r
                        break
                else:
                    self._patterns.append((segs, {r.method: r}))
            else:
                self._exact.setdefault(r.path, {})[r.method] = r

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        methods = self._exact.get(path)
        params: dict[str, str] = {}
        if methods is None:
            parts = path.strip("/").split("/")
            for segs, candidate in self._patterns:
                if len(segs) == len(parts) and all(
                    s == p or (s.startswith("{") and p) for s, p in zip(segs, parts, strict=True)
                ):
                    methods = candidate
                    params = {s[1:-1]: p for s, p in zip(segs, parts, strict=True) if s.startswith("{")}
                    break
        if methods is None:
            raise NotFound(f"no route {path}", field="path", code="no_route")
        route = methods.get(method)
        if route is None:
            raise MethodNotAllowed(f"{path} accepts {', '.join(sorted(methods))}", field="method")
        return route, params


class App:
    """A small ASGI application: every answer is the JSON envelope, every error a 4xx/5xx."""

    def __init__(
        self,
        router: Router,
        *,
        max_body_bytes: int,
        on_startup: Callable[[], Awaitable[None]],
        on_shutdown: Callable[[], Awaitable[None]],
        observe: Callable[[str, float, int], None],
    ) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.on_startup = on_startup
        self.on_shutdown = on_shutdown
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
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
            headers = dict(scope["headers"])
            params: dict[str, Any] = (
                dict(parse_qsl(scope["query_string"].decode("latin-1"))) if scope["query_string"] else {}
            )
            body = b""
            if route.body != "none":
                body = await self._read_body(headers, receive)
                if body and route.body != "raw":
                    params.update(parse_body(body, headers.get(b"content-type", b""), route.body))
            client = scope.get("client")
            request = Request(
                scope["method"],
                scope["path"],
                params,
                path_params,
                headers,
                client[0] if client else "",
                body,
            )
            response = await route.handler(request)
        except MqgateError as exc:
            response = Response(
                {"code": exc.code, "field": exc.field}, status=exc.http_status, message=exc.message
            )
            if exc.retry_after_s is not None:
                response.headers.append((b"retry-after", str(math.ceil(exc.retry_after_s)).encode()))
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

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise PayloadTooLarge(f"request body is over the {self.max_body_bytes}-byte limit", field="body")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise BadRequest("client disconnected", field="body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise PayloadTooLarge(
                    f"request body is over the {self.max_body_bytes}-byte limit", field="body"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def parse_body(body: bytes, content_type: bytes, accepts: str) -> dict[str, Any]:
    kind = content_type.split(b";", 1)[0].strip().lower()
    if kind == JSON_TYPE or (not kind and body[:1] in (b"{", b"[")):
        try:
            data = _json_decode(body)
        except msgspec.DecodeError as exc:
            raise BadRequest(f"body is not valid JSON: {exc}", field="body") from exc
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object", field="body")
        return data
    if accepts == "json":
        raise UnsupportedMediaType(
            "this call takes a JSON body (Content-Type: application/json)", field="body"
        )
    if kind in (FORM_TYPE, b""):
        try:
            return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError as exc:
            raise BadRequest("form body is not UTF-8", field="body") from exc
    raise UnsupportedMediaType(
        "body must be application/json or application/x-www-form-urlencoded", field="body"
    )
