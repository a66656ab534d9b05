"""The native API as a door of the web layer (mqgate.web): its roles, request decoding, the JSON
envelope and the one error handler.

Each route declares its role and its request shape; the door checks the credential a role needs
(who holds the bearer token) before the body is read, decodes the request into its shape,
applies the limits that are settings, lets the role's guard name who is calling, and only then
is the handler called.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, Protocol, get_args

import msgspec

from mqgate.api.decoding import body_fields, content_kind, convert, decode_json, query_fields
from mqgate.api.shapes import Input
from mqgate.errors import BadRequest, MqgateError, PayloadTooLarge
from mqgate.web.app import Headers
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route
from mqgate.web.router import WrongMethod

_json_encode = msgspec.json.Encoder().encode
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]

# none: anyone; admin: the admin token; producer: the named producer's token (or admin);
# consumer: the named consumer's token; token: the token of the consumer an ack token names;
# reader: the admin token or the named consumer's token (a reader of the log); stream: the
# named consumer's token or a stream ticket of it (api/auth.py; a ticket also acks: `token`).
Role = Literal["none", "admin", "producer", "consumer", "token", "reader", "stream"]
ROLES: Final = frozenset(get_args(Role))


class Guard(Protocol):
    async def check_credential(self, role: str, request: Request) -> None:
        """Before the body is read: find who holds the bearer token (`request.credential`);
        refuse a call without a known token (401) or whose token can never hold the role (403)."""

    async def caller(self, role: str, request: Request) -> Any:
        """Who is calling, once the request is decoded (its shape names the producer, ...)."""


class Limits(Protocol):
    def check(self, value: Input) -> None:
        """Apply the limits that are settings; raise naming the field."""


def envelope(status: int, message: str, result: Any) -> bytes:
    return _json_encode({"status": status, "message": message, "result": result})


class ApiDoor:
    """Every answer is the JSON envelope, every error a 4xx/5xx with its code and field."""

    roles = ROLES

    def __init__(self, guard: Guard, limits: Limits, *, max_body_bytes: int) -> None:
        self.guard = guard
        self.limits = limits
        self.max_body_bytes = max_body_bytes

    async def admit(self, route: Route, request: Request) -> None:
        await self.guard.check_credential(route.role, request)

    async def authorize(self, route: Route, request: Request) -> None:
        if route.role != "none":
            request.caller = await self.guard.caller(route.role, request)

    def failed(self, request: Request, error: MqgateError) -> Response:
        response = Response(
            {"code": error.code, "field": error.field}, status=error.http_status, message=error.message
        )
        if error.retry_after_s is not None:
            response.headers.append((b"retry-after", str(math.ceil(error.retry_after_s)).encode()))
        if isinstance(error, WrongMethod):
            response.headers.append((b"allow", error.allow.encode()))
        if isinstance(error, PayloadTooLarge) and error.field == "body":
            response.headers.append((b"connection", b"close"))
        return response

    def encode(self, response: Response) -> tuple[Headers, bytes]:
        body = response.body
        if body is None:
            body = envelope(response.status, response.message, response.result)
        if response.headers or response.content_type != b"application/json":
            return [(b"content-type", response.content_type), *response.headers], body
        return _JSON_HEADERS, body

    def decode(self, route: Route, request: Request, body: bytes) -> None:
        content_type = request.headers.get(b"content-type", b"")
        query = request.query_string
        if route.shape is None:
            extra = {**query_fields(query), **(body_fields(body, content_type, False) if body else {})}
            if extra:
                name = sorted(extra)[0]
                raise BadRequest(f"{name} is not a parameter of this call", field=name)
            return
        value = None
        if (
            body
            and not query
            and not request.params
            and content_kind(content_type) in (b"application/json", b"")
        ):
            value = decode_json(body, route.shape)  # the fast path: a valid JSON body
        if value is None:
            fields: dict[str, Any] = {**query_fields(query)}
            if body:
                fields.update(body_fields(body, content_type, route.body == "json"))
            elif route.body == "json":
                body_fields(body, content_type, True)  # refuses a form body
            fields.update(request.params)
            value = convert(fields, route.shape)
        self.limits.check(value)
        request.input = value
