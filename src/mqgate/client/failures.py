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
    CorruptRecord,
    Forbidden,
    InsufficientStorage,
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
# it depends on is restarting or overloaded, or the gateway's disk is full or at its free-space
# floor (507: nothing was written, so the attempt after cannot store anything twice).
TRANSIENT_STATUS: Final = frozenset((429, 502, 503, 504, 507))

# Every class the gateway answers with (docs/PROTOCOL.md, "Errors"); the root is code internal.
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
    MqgateError,
    CorruptRecord,
    Unavailable,
    StorageError,
    InsufficientStorage,
)
_BY_CODE: Final = {cls.code: cls for cls in _ERROR_CLASSES}
# The first class of each status: the one an error with a code of its own (a Conflict's
# refusal reason, NotFound's no_route) belongs to. A proxy's 502 or 504 reads as Unavailable;
# headers too slow (408) or too large (431) are a bad request, as their code says.
_BY_STATUS: Final[dict[int, type[MqgateError]]] = {
    **{cls.http_status: cls for cls in reversed(_ERROR_CLASSES)},
    408: BadRequest,
    429: Unavailable,
    431: BadRequest,
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
    # What this answer said: its Retry-After in seconds (an HTTP date, as proxies send, is not
    # read), else None; never the class's default, which no one said.
    exc.retry_after_s = (
        float(retry_after) if retry_after is not None and retry_after.strip().isdigit() else None
    )
    return exc


def unreachable(what: str, url: str, exc: Exception) -> MqgateError:
    """An Unavailable with code `unreachable`."""
    down: MqgateError = Unavailable(f"{what}: cannot reach the gateway at {url}: {exc}", code=UNREACHABLE)
    down.retry_after_s = None  # no answer, so no Retry-After: the client's own backoff applies
    return down


def is_transient(exc: MqgateError) -> bool:
    """Might the same call succeed a moment later?"""
    return exc.code == UNREACHABLE or exc.http_status in TRANSIENT_STATUS
