"""The one Python client of the gateway's HTTP API, used by the CLI, the Spark source and sink
and the pipeline.

Every failure is a `mqgate.errors` exception: an error answer's JSON envelope
{status, message, result: {code, field}} becomes the matching class (BadRequest, NotFound,
Conflict, Unavailable with the answer's Retry-After ...), and a gateway that cannot be reached
is `Unavailable` with code `unreachable`.

The transport is the standard library's http.client on kept-alive connections, so a plain
install needs no HTTP library, and Spark tasks reading megabyte pages of /mq/read pay a
quarter of what httpx costs per byte. A client may be shared by threads: each request takes
an idle connection of its own (or opens one) and puts it back once the answer is read.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Self
from urllib.parse import quote, urlencode, urlsplit

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

TIMEOUT_S: Final = 60.0
UNREACHABLE: Final = "unreachable"  # the code of the Unavailable raised when no answer came
# Statuses worth another attempt (when the client was made with retry_for_s): the gateway or a
# server it depends on is restarting or overloaded.
TRANSIENT_STATUS: Final = frozenset((429, 502, 503, 504))
# The gateway takes at most 1,000 messages and 4 MiB of message text per batch produce, and
# 5 MiB per request body; a batch is cut before its encoded messages pass this.
PRODUCE_MAX_MESSAGES: Final = 1000
PRODUCE_MAX_BYTES: Final = 4 * 1024 * 1024 - 64 * 1024

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
_encode = msgspec.json.encode


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


def batch_ranges(sizes: Sequence[int], max_messages: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """Cut messages of these encoded sizes into [start, end) runs for /mq/produce/batch:
    at most `max_messages` each, and under `max_bytes` unless one message alone is larger."""
    i = 0
    while i < len(sizes):
        size = 0
        j = i
        while j < len(sizes) and j - i < max_messages:
            size += sizes[j]
            if size > max_bytes and j > i:
                break
            j += 1
        yield i, j
        i = j


class QueueBounds(msgspec.Struct, frozen=True):
    """One store queue: `min` the oldest stored offset, `max` the next offset to be written."""

    queue: int
    min: int
    max: int


class _BoundsResult(msgspec.Struct):
    broker: str
    queues: list[QueueBounds]


class _BoundsAnswer(msgspec.Struct):
    result: _BoundsResult


_decode_bounds = msgspec.json.Decoder(_BoundsAnswer).decode


def _compact(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A request body without the fields left out (None): the gateway applies its defaults."""
    return {k: v for k, v in fields.items() if v is not None}


def _path_part(name: str) -> str:
    return quote(name, safe="")


class Client:
    """One gateway, seen with one token (admin, consumer or producer).

    `consumer` is added to log reads (a consumer token reads only its group's topic).
    With `retry_for_s`, a call that finds the gateway unreachable or gets a transient status
    is tried again with backoff for that long: a produce repeated after an unanswered
    attempt may then store its messages twice.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        consumer: str | None = None,
        timeout_s: float = TIMEOUT_S,
        retry_for_s: float = 0.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.consumer = consumer
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadRequest(f"gateway URL {url!r} is not an http:// or https:// URL", field="url")
        self._https = parts.scheme == "https"
        self._host, self._port, self._base = parts.hostname, parts.port, parts.path
        self._auth = f"Bearer {token}"
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------

    def _connect(self) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        if self._ssl is None:  # once per client: building one reads the CA bundle
            self._ssl = ssl.create_default_context()
        return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s, context=self._ssl)

    def _exchange(
        self, method: str, target: str, body: bytes | None, what: str
    ) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After) of one request on an idle or new connection. A kept-alive
        connection the server closed meanwhile fails at once: then once more on a new one."""
        headers = {"Authorization": self._auth}
        if body is not None:
            headers["Content-Type"] = "application/json"
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            if conn is None:
                conn = self._connect()
            try:
                conn.request(method, target, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and not isinstance(exc, TimeoutError):
                    continue
                raise Unavailable(
                    f"{what}: cannot reach the gateway at {self.url}: {exc}", code=UNREACHABLE
                ) from exc
            if r.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return r.status, data, r.getheader("Retry-After")

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        what: str | None = None,
    ) -> bytes:
        """The raw body of a successful answer; an error answer or no answer raises."""
        what = what or f"{method} {path}"
        target = self._base + path + ("?" + urlencode(params) if params else "")
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.1
        while True:
            try:
                status, data, retry_after = self._exchange(method, target, body, what)
                if status == 200:
                    return data
                raise error_from_answer(status, data, retry_after, what)
            except MqgateError as exc:
                transient = exc.code == UNREACHABLE or exc.http_status in TRANSIENT_STATUS
                if not transient or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        what: str | None = None,
    ) -> Any:
        """The `result` of the answer's envelope; `body` is sent as JSON."""
        content = None if body is None else _encode(body)
        data = self.request(method, path, params=params, body=content, what=what)
        return msgspec.json.decode(data).get("result") if data else None

    # --- administration (admin token) ---------------------------------------------------

    def create_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> Any:
        body = {
            "name": name,
            "queues": queues,
            "retentionMs": retention_ms,
            "retentionBytes": retention_bytes,
        }
        return self.call("POST", "/admin/topics", _compact(body), what=f"creating topic {name}")

    def topics(self) -> Any:
        return self.call("GET", "/admin/topics", what="listing topics")

    def register_producer(self, name: str, topic: str) -> Any:
        body = {"name": name, "topic": topic}
        return self.call("POST", "/admin/producers", body, what=f"registering producer {name}")

    def register_consumer(
        self,
        name: str,
        topic: str,
        *,
        mode: str | None = None,
        start: str | None = None,
        lock_timeout_s: float | None = None,
        max_attempts: int | None = None,
    ) -> Any:
        body = {
            "name": name,
            "topic": topic,
            "mode": mode,
            "start": start,
            "lockTimeoutS": lock_timeout_s,
            "maxAttempts": max_attempts,
        }
        return self.call("POST", "/admin/consumers", _compact(body), what=f"registering consumer {name}")

    def progress(self, consumer: str) -> Any:
        path = f"/admin/consumers/{_path_part(consumer)}/progress"
        return self.call("GET", path, what=f"progress of consumer {consumer}")

    def reset_consumer(
        self,
        consumer: str,
        to: str,
        *,
        offset: int | None = None,
        timestamp: int | None = None,
        queue: int | None = None,
        client_id: str | None = None,
    ) -> Any:
        body = {"to": to, "offset": offset, "timestamp": timestamp, "queue": queue, "clientId": client_id}
        return self._consumer_action(consumer, "reset", _compact(body))

    def pause_consumer(self, consumer: str) -> Any:
        return self._consumer_action(consumer, "pause", {})

    def resume_consumer(self, consumer: str) -> Any:
        return self._consumer_action(consumer, "resume", {})

    def set_rate_limit(self, consumer: str, messages_per_second: float) -> Any:
        return self._consumer_action(consumer, "rate-limit", {"messagesPerSecond": messages_per_second})

    def set_alert(self, consumer: str, backlog: int) -> Any:
        return self._consumer_action(consumer, "alert", {"backlog": backlog})

    def alerts(self) -> Any:
        return self.call("GET", "/admin/alerts", what="listing alerts")

    def _consumer_action(self, consumer: str, action: str, body: dict[str, Any]) -> Any:
        path = f"/admin/consumers/{_path_part(consumer)}/{action}"
        return self.call("POST", path, body, what=f"{action} consumer {consumer}")

    # --- data path ----------------------------------------------------------------------

    def _read_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.consumer is not None:
            params["consumer"] = self.consumer
        return params

    def bounds(self, topic: str) -> tuple[str, list[QueueBounds]]:
        """(broker, each store queue's bounds, by queue)."""
        params = self._read_params({"topic": topic})
        answer = _decode_bounds(
            self.request("GET", "/mq/bounds", params=params, what=f"bounds of topic {topic}")
        )
        return answer.result.broker, sorted(answer.result.queues, key=lambda b: b.queue)

    def read(self, topic: str, queue: int, offset: int, max_count: int) -> bytes:
        """The raw /mq/read answer: up to `max_count` records of one queue from `offset`."""
        params = self._read_params({"topic": topic, "queue": queue, "offset": offset, "max": max_count})
        return self.request("GET", "/mq/read", params=params, what=f"reading topic {topic} queue {queue}")

    def commit(self, consumer: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """Raise `consumer`'s committed offsets (never lowers them); the committed values."""
        body = {"consumer": consumer, "offsets": {str(q): offsets[q] for q in sorted(offsets)}}
        result = self.call("POST", "/mq/commit", body, what=f"committing consumer {consumer}")
        return {int(q["queue"]): int(q["committed"]) for q in result["queues"]}

    def produce(self, producer: str, messages: Sequence[Mapping[str, Any]]) -> int:
        """Produce `messages` (produce-API objects: message, keys, delayMs ...) in batches
        within the gateway's limits; returns once every batch is acknowledged (durable)."""
        return self.produce_encoded(producer, [_encode(m) for m in messages])

    def produce_encoded(self, producer: str, messages: Sequence[bytes]) -> int:
        """`produce` of messages already encoded as JSON objects; the number produced."""
        head = b'{"producer":' + _encode(producer) + b',"messages":['
        sizes = [len(m) + 1 for m in messages]
        for i, j in batch_ranges(sizes, PRODUCE_MAX_MESSAGES, PRODUCE_MAX_BYTES):
            body = head + b",".join(messages[i:j]) + b"]}"
            self.request("POST", "/mq/produce/batch", body=body, what=f"producing as {producer}")
        return len(messages)
