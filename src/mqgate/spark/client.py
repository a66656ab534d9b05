"""The gateway calls the Spark source and sink make: bounds, read, commit, batch produce.

Synchronous: each Spark task is one thread reading its queue range page by page. Pages
(/mq/read, megabytes each) go through the standard library's http.client on a kept-alive
connection, which costs a quarter of what httpx does per byte; the rest uses httpx.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import httpx
import msgspec

from mqgate.errors import MqgateError
from mqgate.spark.offsets import Bounds

TIMEOUT_S: Final = 60.0
# The gateway takes at most 1,000 messages and 4 MiB of message text per batch produce, and
# 5 MiB per request body; a batch is cut before its encoded messages pass this.
PRODUCE_MAX_MESSAGES: Final = 1000
PRODUCE_MAX_BYTES: Final = 4 * 1024 * 1024 - 64 * 1024


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


class GatewayError(MqgateError):
    """A gateway call failed; `http_status` and `code` are the gateway's."""

    def __init__(self, what: str, status: int, message: str, code: str | None, field: str | None) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}", field=field, code=code)
        self.http_status = status


class _Bounds(msgspec.Struct):
    queue: int
    min: int
    max: int


class _BoundsResult(msgspec.Struct):
    broker: str
    queues: list[_Bounds]


class _BoundsAnswer(msgspec.Struct):
    result: _BoundsResult


_decode_bounds = msgspec.json.Decoder(_BoundsAnswer).decode


def _failure(what: str, status: int, text: bytes) -> GatewayError:
    message, code, field = text[:500].decode(errors="replace"), None, None
    try:
        body: Any = msgspec.json.decode(text)
        message = str(body.get("message", message))
        result = body.get("result")
        if isinstance(result, dict):
            code, field = result.get("code"), result.get("field")
        field = field or body.get("field")
    except (msgspec.DecodeError, AttributeError):
        pass
    return GatewayError(what, status, message, code, field)


class Gateway:
    """One gateway, seen with one token (admin, consumer or producer)."""

    def __init__(self, url: str, token: str, consumer: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.consumer = consumer
        self._token = token
        self._client: httpx.Client | None = None
        self._pages: http.client.HTTPConnection | None = None

    @property
    def _http(self) -> httpx.Client:
        # Made on first use: an httpx client builds an SSL context (reads the CA bundle),
        # a large cost for a Spark task that only reads pages.
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.url, timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {self._token}"}
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._pages is not None:
            self._pages.close()

    def _page_connection(self) -> http.client.HTTPConnection:
        if self._pages is None:
            parts = urlsplit(self.url)
            host, port = parts.hostname or "localhost", parts.port
            if parts.scheme == "https":
                self._pages = http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S)
            else:
                self._pages = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
        return self._pages

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, what: str, path: str, params: dict[str, Any]) -> bytes:
        if self.consumer is not None:
            params["consumer"] = self.consumer
        try:
            r = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise MqgateError(f"{what}: cannot reach the gateway at {self.url}: {exc}") from exc
        if r.status_code != 200:
            raise _failure(what, r.status_code, r.content)
        return r.content

    def _post(self, what: str, path: str, body: bytes) -> Any:
        try:
            r = self._http.post(path, content=body, headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            raise MqgateError(f"{what}: cannot reach the gateway at {self.url}: {exc}") from exc
        if r.status_code != 200:
            raise _failure(what, r.status_code, r.content)
        return r.json()["result"]

    def bounds(self, topic: str) -> tuple[str, list[Bounds]]:
        """(broker, each store queue's bounds, by queue)."""
        answer = _decode_bounds(self._get(f"bounds of topic {topic}", "/mq/bounds", {"topic": topic}))
        queues = sorted(answer.result.queues, key=lambda b: b.queue)
        return answer.result.broker, [Bounds(b.queue, b.min, b.max) for b in queues]

    def read(self, topic: str, queue: int, offset: int, max_count: int) -> bytes:
        """The raw /mq/read answer (decoded by mqgate.spark.arrow.decode_read)."""
        what = f"reading topic {topic} queue {queue}"
        params: dict[str, Any] = {"topic": topic, "queue": queue, "offset": offset, "max": max_count}
        if self.consumer is not None:
            params["consumer"] = self.consumer
        path = urlsplit(self.url).path + "/mq/read?" + urlencode(params)
        headers = {"Authorization": f"Bearer {self._token}"}
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile: once more
            conn = self._page_connection()
            try:
                conn.request("GET", path, headers=headers)
                r = conn.getresponse()
                body = r.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._pages = None
                if attempt == 2:
                    raise MqgateError(f"{what}: cannot reach the gateway at {self.url}: {exc}") from exc
        if r.status != 200:
            raise _failure(what, r.status, body)
        return body

    def commit(self, consumer: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """Raise `consumer`'s committed offsets (never lowers them); the committed values."""
        body = msgspec.json.encode(
            {"consumer": consumer, "offsets": {str(q): offsets[q] for q in sorted(offsets)}}
        )
        result = self._post(f"committing consumer {consumer}", "/mq/commit", body)
        return {int(q["queue"]): int(q["committed"]) for q in result["queues"]}

    def produce_encoded(self, producer: str, messages: list[bytes]) -> int:
        """Produce messages already encoded as JSON objects, in batches within the gateway's
        limits; the number produced."""
        head = b'{"producer":' + msgspec.json.encode(producer) + b',"messages":['
        sizes = [len(m) + 1 for m in messages]
        for i, j in batch_ranges(sizes, PRODUCE_MAX_MESSAGES, PRODUCE_MAX_BYTES):
            body = head + b",".join(messages[i:j]) + b"]}"
            self._post(f"producing as {producer}", "/mq/produce/batch", body)
        return len(messages)
