"""One request pipeline for every door (the API, the console, the compatibility edges).

    match the route → who holds the credential (before the body is read) → the body within the
    door's limit → decode it into the route's shape → who is calling → the handler → the answer

A door supplies what differs: its guard and decoding, how an error is answered in its protocol
(the API's JSON envelope, the console's error page, SQS's XML ...) and how an answer is encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from mqgate.errors import BadRequest, MqgateError, TooManyRequests
from mqgate.web.asgi import ASGIApp, Receive, Scope, Send, headers_of, read_body
from mqgate.web.request import Networks, Request, client_address
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route
from mqgate.web.router import Router
from mqgate.web.websocket import INTERNAL_ERROR, POLICY_VIOLATION, Disconnected, WebSocket

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]


class Door(Protocol):
    roles: frozenset[str]  # the roles its guard knows
    max_body_bytes: int

    async def admit(self, route: Route, request: Request) -> None:
        """Before the body is read: find who holds the credential (`request.credential`) and
        refuse a call that could never hold the route's role (401, 403)."""

    def decode(self, route: Route, request: Request, body: bytes) -> None:
        """The query string and body into `request.input` (the route's shape) or its form."""

    async def authorize(self, route: Route, request: Request) -> None:
        """Once decoded: who is calling (`request.caller`), refused if they may not."""

    def failed(self, request: Request, error: MqgateError) -> Response:
        """An error as this door's protocol answers it."""

    def encode(self, response: Response) -> tuple[Headers, bytes]:
        """The answer's headers (content type first) and body."""


class WebApp:
    """A door as an ASGI app answering under `mount`."""

    def __init__(
        self,
        door: Door,
        routes: list[Route],
        *,
        mount: str = "",
        missing: str = "no route",
        trusted_proxies: Networks = (),
        observe: Callable[[str, float, int], None] | None = None,
        timing_header: bool = False,
        role_limits: dict[str, int] | None = None,
    ) -> None:
        """`role_limits`: the most requests of a role in progress at once (0: no limit); one
        more is answered 429 with Retry-After, so no role can take the process down."""
        unknown = sorted({f"{r.method} {r.path}: {r.role}" for r in routes if r.role not in door.roles})
        if unknown:
            raise ValueError(f"routes with a role the door does not know: {', '.join(unknown)}")
        self.door = door
        self.router = Router(routes, missing=missing)
        self.mount = mount
        self.trusted_proxies = trusted_proxies
        self.observe = observe
        self.timing_header = timing_header  # Server-Timing: the server's time, for benchmarks
        self.role_limits = {role: n for role, n in (role_limits or {}).items() if n > 0}
        self._busy = dict.fromkeys(self.role_limits, 0)

    def request_of(self, scope: Scope) -> Request:
        client = scope.get("client")
        peer = client[0] if client else ""
        if self.trusted_proxies:
            # Every X-Forwarded-For line, in order (a proxy may add a line of its own).
            forwarded = b",".join(v for n, v in scope["headers"] if n == b"x-forwarded-for")
            peer = client_address(peer, forwarded.decode("latin-1"), self.trusted_proxies)
        return Request(
            scope["method"],
            scope["path"][len(self.mount) :] or "/",
            {},
            peer,
            scope.get("query_string", b""),
            scope.get("scheme") == "https",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            return await self._socket(scope, receive, send)
        started = time.perf_counter()
        door = self.door
        request = self.request_of(scope)
        route_name = "unmatched"
        try:
            request.headers = headers_of(scope)
            route, request.params = self.router.match(request.method, request.path)
            route_name = route.path
            await door.admit(route, request)
            limit = self.role_limits.get(route.role)
            if limit is None:
                response = await self._serve(route, request, receive)
            else:  # after the credential: nobody without one can use up a role's budget
                busy = self._busy[route.role]
                if busy >= limit:
                    raise TooManyRequests(
                        f"{busy} {route.role} requests are in progress, the most at once: try again",
                        field="role",
                    )
                self._busy[route.role] = busy + 1
                try:
                    response = await self._serve(route, request, receive)
                finally:
                    self._busy[route.role] -= 1
        except MqgateError as exc:
            response = door.failed(request, exc)
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            response = door.failed(request, MqgateError("internal error"))
        headers, body_bytes = door.encode(response)
        seconds = time.perf_counter() - started
        if self.timing_header:  # (not appended: an encoder may answer with a shared list)
            headers = [*headers, (b"server-timing", b"app;dur=%.2f" % (seconds * 1000))]
        try:
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            if response.stream is not None:
                await stream_body(response.stream, receive, send)
            else:
                await send({"type": "http.response.body", "body": body_bytes})
        finally:
            if response.on_close is not None:
                response.on_close()
        if self.observe is not None:
            self.observe(route_name, seconds, response.status)

    async def _socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket: the same guard and decoding as the GET route of its path (its query
        string only), then the route's socket handler; refused with the door's error answer."""
        door = self.door
        ws = WebSocket(scope, receive, send)
        if not await ws.connected():
            return
        started = time.perf_counter()
        request = self.request_of({**scope, "method": "GET"})
        status = 101  # its latency is a stream's whole life: only refusals are observed
        route_name = "unmatched"
        try:
            request.headers = headers_of(scope)
            route, request.params = self.router.match("GET", request.path)
            route_name = route.path
            if route.websocket is None:
                raise BadRequest(f"{route.path} does not take a WebSocket", field="Upgrade")
            await door.admit(route, request)
            door.decode(route, request, b"")
            await door.authorize(route, request)
            await route.websocket(request, ws)
        except MqgateError as exc:
            status = exc.http_status
            if ws.accepted:
                if status >= 500:  # the gateway's fault (a store down): said, and the socket ends
                    log.warning("WebSocket of %s ended by a fault: %s", scope["path"], exc.message)
                await ws.close(INTERNAL_ERROR if status >= 500 else POLICY_VIOLATION, exc.message)
            else:
                headers, body = door.encode(door.failed(request, exc))
                await ws.refuse(exc.http_status, headers, body, exc.message)
        except Disconnected:
            pass
        except Exception:
            status = 500
            log.exception("unexpected error on a WebSocket of %s", scope["path"])
            await ws.close(INTERNAL_ERROR, "internal error")
        if self.observe is not None and status >= 400:
            self.observe("websocket " + route_name, time.perf_counter() - started, status)

    async def _serve(self, route: Route, request: Request, receive: Receive) -> Response:
        door = self.door
        body = b""
        if route.body != "none":
            body = await read_body(receive, request.headers, door.max_body_bytes)
        door.decode(route, request, body)
        await door.authorize(route, request)
        return await route.handler(request)


class Site:
    """The gateway's one ASGI app: the lifespan events, and each request to its door: a
    request one of `edges` matches (from its scope: a compatibility edge reads its own body) to
    the first such edge, a path under a mount point to the door mounted there, `/` to `home`,
    the rest (WebSocket streams too) to `default`."""

    def __init__(
        self,
        default: ASGIApp,
        *,
        mounts: dict[str, ASGIApp] | None = None,
        home: str | None = None,
        on_startup: Callable[[], Awaitable[None]] | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        edges: Sequence[tuple[Callable[[Scope], bool], ASGIApp]] = (),
    ) -> None:
        self.default = default
        self.edges = tuple(edges)
        self.mounts = mounts or {}
        self.home = home
        self.on_startup = on_startup
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            for matches, edge in self.edges:
                if matches(scope):
                    return await edge(scope, receive, send)
            if path == "/" and self.home is not None:
                return await send_redirect(send, self.home)
            for mount, app in self.mounts.items():
                if path == mount or path.startswith(mount + "/"):
                    return await app(scope, receive, send)
            await self.default(scope, receive, send)
        elif kind == "websocket":
            await self.default(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.on_startup is not None:
                        await self.on_startup()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.on_shutdown is not None:
                    await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def stream_body(chunks: AsyncIterator[bytes], receive: Receive, send: Send) -> None:
    """Each chunk as it comes, until the iterator ends or the client goes away (then the
    iterator is closed where it waits: no work goes on for nobody)."""
    gone = asyncio.ensure_future(_disconnected(receive))
    it = chunks.__aiter__()
    try:
        while True:
            following = asyncio.ensure_future(it.__anext__())
            await asyncio.wait({following, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
                return
            try:
                chunk = following.result()
            except StopAsyncIteration:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except OSError:
        pass  # the connection went while writing
    finally:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):  # closed already, or running
                await aclose()


async def send_redirect(send: Send, location: str) -> None:
    answer = redirect(location)
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": b""})
