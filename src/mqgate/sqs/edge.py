"""The SQS API on the gateway's port (issue 30): an ASGI app that AWS SDKs reach unchanged.

    the body within MAX_REQUEST_BYTES → the signature checked (the key at hand first) → the
    body decoded (protocol.py) → the action on the key's project (service.py) → the answer in
    the request's protocol (answers.py)

The signature is checked before the body is decoded: nobody without a key gets the decoder's
work. Every failure is answered as AWS would, in the protocol the request spoke; nothing a
client sends earns a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from mqgate.accesskeys.service import AccessKeys
from mqgate.errors import MqgateError
from mqgate.metrics import Metrics
from mqgate.sqs import errors as e
from mqgate.sqs import sigv4
from mqgate.sqs.answers import XML_CONTENT_TYPE, encode_error, encode_result
from mqgate.sqs.detect import JSON_TARGET_PREFIX
from mqgate.sqs.errors import SqsError, as_sqs_error
from mqgate.sqs.protocol import (
    INPUTS,
    JSON_CONTENT_TYPE,
    MAX_REQUEST_BYTES,
    STS_INPUTS,
    Protocol,
    SqsRequest,
    decode_request,
    read_asgi_headers,
)
from mqgate.sqs.service import Caller, SqsService
from mqgate.web.asgi import Receive, Scope, Send, headers_of, read_body

log = logging.getLogger(__name__)

SIGNED_SERVICES: Final = frozenset({"sqs", "sts"})
KNOWN_ACTIONS: Final = frozenset(INPUTS) | frozenset(STS_INPUTS)
UNKNOWN_ACTION: Final = "unknown"  # the metric's label for anything else: its values stay few


def sqs_error_of(exc: BaseException) -> SqsError:
    """An error as SQS answers it: a client's fault the gateway's own errors name (a body too
    long, a malformed request) is InvalidParameterValue, never an internal error."""
    if isinstance(exc, SqsError):
        return exc
    if isinstance(exc, MqgateError) and e.kind_of(exc.code) is None:
        if exc.http_status == 429:
            return SqsError(e.REQUEST_THROTTLED, exc.message)
        if 400 <= exc.http_status < 500:
            return e.invalid_parameter_value(exc.message)
    return as_sqs_error(exc)


_HEADER_NAMES: dict[str, bytes] = {}


def _header_name(name: str) -> bytes:
    """An answer header's name as sent (lower case, latin-1); the few names answers carry kept."""
    found = _HEADER_NAMES.get(name)
    if found is None:
        found = name.lower().encode("latin-1")
        if len(_HEADER_NAMES) < 64:
            _HEADER_NAMES[name] = found
    return found


# Header values every answer of a kind repeats (its content type), kept encoded.
_HEADER_VALUES: Final[dict[str, bytes]] = {
    v: v.encode("latin-1") for v in (JSON_CONTENT_TYPE, XML_CONTENT_TYPE)
}


class SqsEdge:
    def __init__(
        self,
        service: SqsService,
        keys: AccessKeys,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self.keys = keys
        self.metrics = metrics
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        action = UNKNOWN_ACTION
        protocol: Protocol = "query"
        request: SqsRequest | None = None
        try:
            headers = headers_of(scope)
            wanted, protocol = read_asgi_headers(headers)  # the few the decoder reads, as text
            target = headers.get(b"x-amz-target", b"").decode("latin-1")
            named = target.removeprefix(JSON_TARGET_PREFIX)
            if named in KNOWN_ACTIONS:
                action = named
            query: bytes = scope.get("query_string", b"")
            raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
            # Who signs is checked before the body is read: no credential, or a key that is not
            # one of ours, is answered without taking a byte of it (the signature needs the body).
            key_id = sigv4.access_key_id_of(headers, query)
            if key_id is None and b"authorization" not in headers and b"X-Amz-Algorithm" not in query:
                raise sigv4.MissingAuthenticationToken(sigv4.MISSING_TOKEN, field="Authorization")
            if not self.keys.ready_now(key_id):
                await self.keys.ready(key_id)
            if key_id is not None and self.keys.secret_for(key_id) is None:
                raise sigv4.InvalidClientTokenId(sigv4.INVALID_TOKEN, field="Credential")
            body = await read_body(receive, headers, MAX_REQUEST_BYTES)
            verified = sigv4.verify(
                scope["method"], raw_path.decode("latin-1"), query, headers, body,
                self.keys.secret_for, self.clock(), SIGNED_SERVICES,
            )  # fmt: skip
            key = self.keys.active(verified.access_key_id)
            if key is None:  # revoked between the two lookups
                raise SqsError(e.INVALID_CLIENT_TOKEN_ID, sigv4.INVALID_TOKEN)
            request = decode_request(scope["method"], scope["path"], query, wanted, body)
            action = request.action
            if request.service != verified.service:
                raise SqsError(
                    e.SIGNATURE_DOES_NOT_MATCH,
                    f"Credential should be scoped to correct service: '{request.service}'.",
                )
            scheme = "https" if scope.get("scheme") == "https" else "http"
            host = headers.get(b"host", b"localhost").decode("latin-1")
            caller = Caller(key, verified.region, f"{scheme}://{host}")
            result = await self.service.handle(request, caller)
            status, answer_headers, answer = encode_result(request, request.action, result)
            outcome = "ok"
        except Exception as exc:
            error = sqs_error_of(exc)
            if not error.sender_fault and error.kind is e.INTERNAL_ERROR:
                log.error("SQS %s failed", action, exc_info=exc)
            status, answer_headers, answer = encode_error(request or protocol, error)
            outcome = error.kind.code
        self.metrics.child(self.metrics.sqs_requests, action, outcome).inc()
        values = _HEADER_VALUES
        raw_headers = [
            (_header_name(k), values.get(v) or v.encode("latin-1")) for k, v in answer_headers.items()
        ]
        raw_headers.append((b"content-length", b"%d" % len(answer)))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": answer})
