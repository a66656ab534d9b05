"""ASGI types and reading a request: its headers and its body within a byte limit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from mqgate.errors import BadRequest, PayloadTooLarge

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# How much of a refused body is read (and dropped) so that its sender can read the 413.
DRAIN_BYTES: Final = 64 * 1024 * 1024


def headers_of(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name; two Authorization headers are refused
    rather than one of them silently chosen."""
    raw: list[tuple[bytes, bytes]] = scope["headers"]
    headers = dict(raw)
    if len(headers) < len(raw) and sum(1 for name, _ in raw if name == b"authorization") > 1:
        raise BadRequest("more than one Authorization header", field="Authorization")
    return headers


async def read_body(
    receive: Receive, headers: dict[bytes, bytes], limit: int, what: str = "request body"
) -> bytes:
    """The whole body, refused (413, field `body`) past `limit` bytes, whether its
    Content-Length says so at once or its chunks do on the way."""
    length = headers.get(b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        await drain(receive, DRAIN_BYTES)
        raise PayloadTooLarge(f"{what} is over the {limit}-byte limit", field="body")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("client disconnected", field="body")
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > limit:
            if more:  # the last chunk crossing the limit has nothing after it to drain
                await drain(receive, DRAIN_BYTES)
            raise PayloadTooLarge(f"{what} is over the {limit}-byte limit", field="body")
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


async def drain(receive: Receive, limit: int) -> None:
    """Read and drop the rest of a refused body (up to `limit`), so a client that sends all of
    it before reading the answer gets the 413 rather than a reset connection."""
    drained = 0
    while drained < limit:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return
        drained += len(message.get("body", b""))
