"""A route of any door: method, path, handler, the role its caller needs, and what it takes and
answers (the request shape, the answer shape and its error statuses, which /openapi.json shows)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from mqgate.web.request import Request
from mqgate.web.response import Response

if TYPE_CHECKING:
    from mqgate.web.websocket import WebSocket

Handler = Callable[[Request], Awaitable[Response]]
# What takes a WebSocket on a GET route (an Upgrade request; web/websocket.py): called once the
# guard let the caller in, before the socket is accepted.
SocketHandler = Callable[[Request, "WebSocket"], Awaitable[None]]


class Route(msgspec.Struct, frozen=True):
    method: str
    path: str  # segments in braces are path parameters (and fields of the shape)
    handler: Handler
    # A role the door's guard knows (mqgate.api.auth's, mqgate.console.app's): the guard, never
    # the handler, checks it; a door refuses to start with a route whose role it does not know.
    role: str
    summary: str = ""
    shape: type[Any] | None = None  # the request; None: the call takes no parameters
    answer: type[msgspec.Struct] | None = None  # the `result` of a 200 answer (None: not JSON)
    errors: tuple[int, ...] = ()  # error statuses beyond those of every route and of the role
    # "none": parameters in the query string, the body is not read; "form": a browser's form
    body: Literal["any", "json", "none", "form"] = "any"
    websocket: SocketHandler | None = None  # a GET route that also takes a WebSocket
