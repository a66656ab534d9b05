"""The gateway's API as Python calls: administration (admin token) and the data path the
Spark source and sink and the pipeline use. Results are the `result` of the answer's envelope
(camelCase, as documented in /openapi.json) unless a method says otherwise."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Self
from urllib.parse import quote

import msgspec

from mqgate.client.transport import Transport
from mqgate.errors import MqgateError

TIMEOUT_S: Final = 60.0
# The most items a page of an admin list holds (the gateway's MAX_PAGE_ITEMS); a page also stops
# at the gateway's answer budget, and `listing` follows the pages to the last.
PAGE_LIMIT: Final = 10_000
# The gateway takes at most 1,000 messages and 4 MiB of message text per batch produce, and
# 5 MiB per request body; a batch is cut before its encoded messages pass this.
PRODUCE_MAX_MESSAGES: Final = 1000
PRODUCE_MAX_BYTES: Final = 4 * 1024 * 1024 - 64 * 1024
_encode = msgspec.json.encode


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
    """One gateway, seen with one token (admin, consumer or producer); may be shared by threads.

    `consumer` is added to log reads (a consumer token reads only its group's topic).
    With `retry_for_s`, a call that finds the gateway unreachable or gets a transient status
    (429, 502, 503, 504, 507) is tried again with backoff, not before the answer's Retry-After,
    for that long: a produce repeated after an unanswered attempt may then store its messages
    twice.
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
        self._http = Transport(url, token, timeout_s, retry_for_s)
        self.url = self._http.url
        self.consumer = consumer

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        what: str | None = None,
    ) -> bytes:
        """The raw body of a successful answer; an error answer or no answer raises (its
        message starts with `what`, by default the method and path)."""
        return self._http.request(method, path, params=params, body=body, what=what)

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

    def listing(
        self,
        path: str,
        *lists: str,
        params: Mapping[str, Any] | None = None,
        what: str | None = None,
    ) -> Any:
        """A paged answer whole (docs/PROTOCOL.md, "Paging"): the first page's `result`, with
        the `lists` of every later page appended, following each page's `next` to the last
        (without `next` then)."""
        query = {**(params or {}), "limit": PAGE_LIMIT}
        return self._rest_of(path, self.call("GET", path, params=query, what=what), lists, query, what)

    def _rest_of(
        self, path: str, result: Any, lists: Sequence[str], query: Mapping[str, Any], what: str | None
    ) -> Any:
        """`result` (a first page) with the `lists` of every later page of `path` appended."""
        cursor = result.pop("next", None)
        while cursor:
            page = self.call("GET", path, params={**query, "cursor": cursor}, what=what)
            for name in lists:
                result[name].extend(page.get(name, []))
            after = page.get("next")
            if after == cursor:  # a gateway that does not go on would be asked forever
                raise MqgateError(f"{what or path}: the next page's cursor did not move", field="cursor")
            cursor = after
        return result

    # --- administration (admin token) ---------------------------------------------------

    def create_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        project: str | None = None,
    ) -> Any:
        body = {
            "name": name,
            "queues": queues,
            "retentionMs": retention_ms,
            "retentionBytes": retention_bytes,
            "project": project,
        }
        return self.call("POST", "/admin/topics", _compact(body), what=f"creating topic {name}")

    def topics(self, project: str | None = None) -> Any:
        params = {} if project is None else {"project": project}
        return self.listing("/admin/topics", "topics", params=params, what="listing topics")

    def consumers(self) -> Any:
        return self.listing("/admin/consumers", "consumers", what="listing consumers")

    def projects(self) -> Any:
        return self.listing("/admin/projects", "projects", what="listing projects")

    def project_queues(
        self,
        project: str,
        *,
        topic: str | None = None,
        queue: int | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> Any:
        """The project's queue state intervals (SPEC P1), every page of them."""
        params = _compact({"topic": topic, "queue": queue, "since": since, "until": until})
        path = f"/admin/projects/{_path_part(project)}/queues"
        return self.listing(path, "intervals", params=params, what=f"queue state of project {project}")

    def routers(self, *, project: str | None = None, topic: str | None = None) -> Any:
        params = _compact({"project": project, "topic": topic})
        return self.listing("/admin/routers", "routers", params=params, what="listing routers")

    def trace_policies(self) -> Any:
        return self.listing("/admin/trace-policies", "policies", what="listing trace policies")

    def clusters(self) -> Any:
        return self.listing("/admin/clusters", "clusters", what="listing clusters")

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
        return self.listing(path, "queues", what=f"progress of consumer {consumer}")

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
        first = self._consumer_action(consumer, "reset", _compact(body))
        path = f"/admin/consumers/{_path_part(consumer)}/progress"  # where its `next` goes on
        return self._rest_of(
            path, first, ("queues",), {"limit": PAGE_LIMIT}, f"progress of consumer {consumer}"
        )

    def pause_consumer(self, consumer: str) -> Any:
        return self._consumer_action(consumer, "pause", {})

    def resume_consumer(self, consumer: str) -> Any:
        return self._consumer_action(consumer, "resume", {})

    def set_rate_limit(self, consumer: str, messages_per_second: float) -> Any:
        return self._consumer_action(consumer, "rate-limit", {"messagesPerSecond": messages_per_second})

    def set_alert(self, consumer: str, backlog: int) -> Any:
        return self._consumer_action(consumer, "alert", {"backlog": backlog})

    def alerts(self) -> Any:
        return self.listing("/admin/alerts", "alerts", "active", what="listing alerts")

    def dead_letters(self, consumer: str) -> Any:
        """The consumer's dead-letter topic: its offsets, redrive position and copies so far."""
        path = f"/admin/consumers/{_path_part(consumer)}/dead-letters"
        return self.call("GET", path, what=f"dead letters of consumer {consumer}")

    def redrive(
        self,
        consumer: str,
        *,
        offset: int | None = None,
        message_id: str | None = None,
        reason: str | None = None,
        key: str | None = None,
        since: int | None = None,
        until: int | None = None,
        everything: bool = False,
        scan: int | None = None,
    ) -> Any:
        """Copy dead letters back to their original topic: one (offset or message_id), those
        passing the filters given, or all (`everything`); each at most once."""
        body = {
            "offset": offset,
            "messageId": message_id,
            "reason": reason,
            "key": key,
            "since": since,
            "until": until,
            "all": everything or None,
            "max": scan,
        }
        return self._consumer_action(consumer, "dead-letters/redrive", _compact(body))

    def producers(self) -> Any:
        return self.listing("/admin/producers", "producers", what="listing producers")

    def change_consumer(
        self, consumer: str, *, lock_timeout_s: float | None = None, max_attempts: int | None = None
    ) -> Any:
        body = _compact({"lockTimeoutS": lock_timeout_s, "maxAttempts": max_attempts})
        path = f"/admin/consumers/{_path_part(consumer)}"
        return self.call("PATCH", path, body, what=f"changing consumer {consumer}")

    def new_token(self, kind: str, name: str, *, revoke: bool = False) -> Any:
        """A new token for producer or consumer `name` (the old one stops working), or none
        at all with `revoke`."""
        path = f"/admin/{kind}s/{_path_part(name)}/token"
        what = f"{'revoking the token of' if revoke else 'a new token for'} {kind} {name}"
        return self.call("DELETE" if revoke else "POST", path, {}, what=what)

    def change_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        max_priority: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> Any:
        """Grow a topic or change its retention, live."""
        body = {
            "queues": queues,
            "maxPriority": max_priority,
            "retentionMs": retention_ms,
            "retentionBytes": retention_bytes,
        }
        path = f"/admin/topics/{_path_part(name)}"
        return self.call("PATCH", path, _compact(body), what=f"changing topic {name}")

    def delete(self, kind: str, name: str, *, keep_dead_letters: bool = False) -> Any:
        """Delete topic, producer or consumer `name` (docs/PROTOCOL.md, "Deleting")."""
        params = {"keepDeadLetters": "true"} if keep_dead_letters else None
        path = f"/admin/{kind}s/{_path_part(name)}"
        return self.call("DELETE", path, params=params, what=f"deleting {kind} {name}")

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

    def browse(
        self,
        topic: str,
        queue: int,
        *,
        offset: int | None = None,
        timestamp: int | None = None,
        key: str | None = None,
        message_id: str | None = None,
        max_count: int | None = None,
        scan: int | None = None,
    ) -> Any:
        """Records of one store queue from an offset or a time, or those with a key or a
        message id among at most `scan` records; nothing is consumed."""
        params = {
            "topic": topic,
            "queue": queue,
            "offset": offset,
            "timestamp": timestamp,
            "key": key,
            "messageId": message_id,
            "max": max_count,
            "scan": scan,
        }
        what = f"browsing topic {topic} queue {queue}"
        return self.call("GET", "/mq/browse", params=self._read_params(_compact(params)), what=what)

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
