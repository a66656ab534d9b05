"""The one mapping of failed calls to `mqgate.errors`: an error answer's envelope becomes the
class the gateway raised (its code, field and Retry-After kept); no answer is Unavailable."""

from __future__ import annotations

import http.client
from typing import Final

import msgspec

from mqgate.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    MethodNotAllowed,
    MqgateError,
    NotFound,
    PayloadTooLarge,
    StorageError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)

UNREACHABLE: Final = "unreachable"  # the code of the Unavailable raised when no answer came
# Statuses worth another attempt (for a client made with retry_for_s): the gateway or a server
# it depends on is restarting or overloaded.
TRANSIENT_STATUS: Final = frozenset((429, 502, 503, 504))

_ERROR_CLASSES: Final[tuple[type[MqgateError], ...]] = (
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Conflict,
    AlreadyExists,
    PayloadTooLarge,
    UnsupportedMediaType,
    Unavailable,
    StorageError,
)
_BY_CODE: Final = {cls.code: cls for cls in _ERROR_CLASSES}
# The first class of each status: the one an error with a code of its own (a Conflict's
# refusal reason, NotFound's no_route) belongs to. A proxy's 502 or 504 reads as Unavailable.
_BY_STATUS: Final[dict[int, type[MqgateError]]] = {
    **{cls.http_status: cls for cls in reversed(_ERROR_CLASSES)},
    429: Unavailable,
    502: Unavailable,
    504: Unavailable,
}


def error_from_answer(
    status: int, body: bytes, retry_after: str | None = None, what: str | None = None
) -> MqgateError:
    """The exception for an error answer of the gateway, its message "<what>: HTTP <status>:
    <the gateway's message>" (what: the call, for context)."""
    message = body[:500].decode(errors="replace") or http.client.responses.get(status, "")
    code = field = None
    try:
        envelope = msgspec.json.decode(body)
    except msgspec.DecodeError:
        envelope = None
    if isinstance(envelope, dict):
        message = str(envelope.get("message", message))
        result = envelope.get("result")
        if isinstance(result, dict):
            code, field = result.get("code"), result.get("field")
    named = _BY_CODE.get(code) if isinstance(code, str) else None
    cls = named if named is not None and named.http_status == status else _BY_STATUS.get(status, MqgateError)
    text = f"HTTP {status}: {message}"
    exc = cls(f"{what}: {text}" if what else text, field=field if isinstance(field, str) else None)
    if isinstance(code, str):
        exc.code = code
    exc.http_status = status
    if retry_after is not None and retry_after.strip().isdigit():  # not an HTTP date (proxies)
        exc.retry_after_s = float(retry_after)
    return exc


def unreachable(what: str, url: str, exc: Exception) -> Unavailable:
    return Unavailable(f"{what}: cannot reach the gateway at {url}: {exc}", code=UNREACHABLE)


def is_transient(exc: MqgateError) -> bool:
    """Might the same call succeed a moment later?"""
    return exc.code == UNREACHABLE or exc.http_status in TRANSIENT_STATUS
