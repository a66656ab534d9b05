"""One answer, as every door gives it: either bytes as they are (a page, a file, a pre-encoded
answer) or a value that the door's encoder turns into bytes (the API's JSON envelope)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import msgspec

JSON = b"application/json"
HTML = b"text/html; charset=utf-8"


class Response(msgspec.Struct):
    result: Any = None  # what the door's encoder writes when `body` is None
    status: int = 200
    message: str = "ok"
    headers: list[tuple[bytes, bytes]] = msgspec.field(default_factory=list)
    body: bytes | None = None  # sent as it is
    content_type: bytes = JSON
    # A long answer sent as its chunks come (Server-Sent Events): after the head, each chunk at
    # once, until the iterator ends or the client goes (then it is closed).
    stream: AsyncIterator[bytes] | None = None
    # Called once the answer is over, however it ended (sent, failed, or the client gone first):
    # what the handler took for it is given back here.
    on_close: Callable[[], None] | None = None

    def set_cookie(
        self, name: str, value: str, *, path: str, secure: bool, max_age_s: int | None = None
    ) -> None:
        parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Lax"]
        if max_age_s is not None:
            parts.append(f"Max-Age={max_age_s}")
        if secure:
            parts.append("Secure")
        self.headers.append((b"set-cookie", "; ".join(parts).encode()))


def page(body: bytes, status: int = 200, content_type: bytes = HTML, **kw: Any) -> Response:
    """Bytes as they are: an HTML page unless `content_type` says otherwise."""
    return Response(status=status, body=body, content_type=content_type, **kw)


def redirect(location: str) -> Response:
    """After a form post: 303 so the browser fetches the next page with GET."""
    target = quote(location, safe="/?=&%:#.-_~+").encode()
    return Response(status=303, body=b"", content_type=HTML, headers=[(b"location", target)])


def download(body: bytes, filename: str, content_type: str) -> Response:
    disposition = f'attachment; filename="{filename}"'.encode()
    return page(body, 200, content_type.encode(), headers=[(b"content-disposition", disposition)])
