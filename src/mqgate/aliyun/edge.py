"""Alibaba Cloud MQ for RocketMQ's HTTP API on the gateway's port (issue 32): an ASGI app the
official SDKs reach unchanged, `Site` hands it the requests `is_aliyun_request` tells apart.

    the signature checked from the headers and the request line alone (the key looked up
    first) → the request line parsed (protocol.py) → the body within the operation's limit,
    its Content-MD5 → the operation on the key's project (service.py) → the answer

Nobody without a key gets a byte of their body read. Every failure is answered as the service
does, an `<Error>` document with its code and status (errors.py) and the request's id in
`x-mq-request-id`; nothing a client sends earns a 500.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Final

from mqgate.accesskeys.service import AccessKeys
from mqgate.aliyun import errors
from mqgate.aliyun import xml as mqxml
from mqgate.aliyun.errors import AliyunError
from mqgate.aliyun.protocol import AliyunRequest, parse_request
from mqgate.aliyun.service import AliyunService
from mqgate.aliyun.signature import (
    MAX_SKEW_S,
    VERSION,
    Verified,
    check_content_md5,
    parse_authorization,
    verify,
)
from mqgate.errors import MqgateError
from mqgate.metrics import Metrics
from mqgate.web.asgi import Receive, Scope, Send, headers_of, read_body

log = logging.getLogger(__name__)

MAX_ACK_BODY_BYTES: Final = mqxml.MAX_ACK_DOCUMENT_BYTES
MAX_CONSUME_BODY_BYTES: Final = 64 * 1024  # a GET has no body; one sent is read and ignored
_METHOD_OPERATIONS: Final = {"POST": "publish", "GET": "consume", "DELETE": "ack"}
ROUTE_PREFIX: Final = "aliyun "  # the metrics' route label: "aliyun publish", "aliyun consume:order", …
_XML_TYPE: Final = mqxml.CONTENT_TYPE.encode()
# The headers the signature covers (with every x-mq-*), and how many verified signatures are kept.
_SIGNED: Final = frozenset({b"authorization", b"content-md5", b"content-type", b"date"})
_VERIFIED_KEPT: Final = 4096
_REQUESTS_KEPT: Final = 4096


def aliyun_error_of(exc: BaseException) -> AliyunError:
    """An error as the service answers it: the gateway's own 4xx as InvalidArgument naming its
    field, a throttle as QpsLimitExceeded, anything else InternalError."""
    if isinstance(exc, AliyunError):
        return exc
    if isinstance(exc, MqgateError):
        if exc.http_status == 429:
            return AliyunError(errors.QPS_LIMIT_EXCEEDED, exc.message)
        if 400 <= exc.http_status < 500:
            return AliyunError(errors.INVALID_ARGUMENT, exc.message, element=exc.field)
    return AliyunError(errors.INTERNAL_ERROR)


class AliyunEdge:
    def __init__(
        self,
        service: AliyunService,
        keys: AccessKeys,
        metrics: Metrics,
        max_publish_bytes: int = mqxml.MAX_DOCUMENT_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self.keys = keys
        self.metrics = metrics
        self.max_publish_bytes = max_publish_bytes
        self.clock = clock
        self._verified: dict[tuple[object, ...], Verified] = {}
        self._requests: dict[tuple[str, bytes, bytes], AliyunRequest] = {}  # request lines parsed

    def _verify(
        self,
        memo: tuple[object, ...],
        kept: Verified | None,
        method: str,
        headers: dict[bytes, bytes],
        path: str,
        query: str,
    ) -> Verified:
        """`signature.verify`, remembered by `memo` (the method, the request line and every
        signed header): the body is not signed, so an SDK's publishes to one topic within one
        second (its Date's resolution) carry the same signature; one that verified is not
        computed again while its Date is in the window. The key's being active is checked on
        every request all the same."""
        now = self.clock()
        if kept is not None and abs(now - kept.signed_at) <= MAX_SKEW_S:
            return kept
        text = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()}
        verified = verify(method, text, f"{path}?{query}" if query else path, self.keys.secret_for, now)
        if len(self._verified) >= _VERIFIED_KEPT:
            self._verified.clear()
        self._verified[memo] = verified
        return verified

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request_id = secrets.token_hex(12).upper()
        method: str = scope["method"]
        # The operation its method names, so a refusal before the request is read (a bad
        # signature) is counted under it too; the request's own label once it is parsed.
        label = _METHOD_OPERATIONS.get(method, "unknown")
        try:
            headers = headers_of(scope)
            raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
            raw_query: bytes = scope.get("query_string", b"")
            query = raw_query.decode("latin-1")
            path = raw_path.decode("latin-1")
            memo = (
                method,
                raw_path,
                raw_query,
                *sorted(i for i in headers.items() if i[0] in _SIGNED or i[0].startswith(b"x-mq-")),
            )
            kept = self._verified.get(memo)
            if kept is not None:
                await self.keys.ready(kept.access_key_id)
            elif (auth := headers.get(b"authorization")) is not None:
                with contextlib.suppress(AliyunError):  # verify answers it
                    await self.keys.ready(parse_authorization(auth.decode("latin-1"))[0])
            verified = self._verify(memo, kept, method, headers, path, query)
            key = self.keys.active(verified.access_key_id)
            if key is None:  # revoked between the two lookups
                raise AliyunError(errors.INVALID_ACCESS_KEY_ID)
            if verified.version not in ("", VERSION):
                raise AliyunError(
                    errors.INVALID_ARGUMENT,
                    f"x-mq-version must be {VERSION}, not {verified.version[:32]!r}.",
                    element="x-mq-version",
                )
            line = (method, raw_path, raw_query)
            request = self._requests.get(line)
            if request is None:
                request = parse_request(method, path, query)
                if len(self._requests) >= _REQUESTS_KEPT:
                    self._requests.clear()
                self._requests[line] = request
            label = request.label
            limit = {"publish": self.max_publish_bytes, "ack": MAX_ACK_BODY_BYTES}.get(
                request.operation, MAX_CONSUME_BODY_BYTES
            )
            body = await read_body(receive, headers, limit)
            md5 = headers.get(b"content-md5")
            if request.operation != "consume":
                check_content_md5(md5.decode("latin-1") if md5 is not None else None, body)
            status, answer = await self.service.handle(request, key, body, request_id)
        except Exception as exc:
            error = aliyun_error_of(exc)
            if error.kind is errors.INTERNAL_ERROR:
                log.error("aliyun %s %s failed", method, label, exc_info=exc)
            status = error.http_status
            scheme = "https" if scope.get("scheme") == "https" else "http"
            host = headers_of_host(scope)
            answer = mqxml.encode_aliyun_error(error, request_id, f"{scheme}://{host}")
        route = ROUTE_PREFIX + label
        metrics = self.metrics
        metrics.child(metrics.latency, route).observe(time.perf_counter() - started)
        if status >= 400:
            metrics.child(metrics.errors, route, str(status)).inc()
        raw_headers = [(b"x-mq-request-id", request_id.encode()), (b"x-mq-version", VERSION.encode())]
        if answer:
            raw_headers.append((b"content-type", _XML_TYPE))
        raw_headers.append((b"content-length", b"%d" % len(answer)))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": answer})


def headers_of_host(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            return str(value.decode("latin-1"))[:256]
    return "localhost"
