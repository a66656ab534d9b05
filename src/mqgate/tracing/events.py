"""The trace event (SPEC P3–P6). Pure: no IO.

An event is stored as the body of one message in its project's trace topic, so it encodes to
compact JSON (defaults omitted) with camelCase names a Spark job reads as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import msgspec

from mqgate.names import TRACE_PREFIX
from mqgate.tracing.policy import cut_body

# The trace topic of a project: `%TRACE%<project>`.
TRACE_TOPIC_PREFIX: Final = TRACE_PREFIX

Hop = Literal[
    "accepted",
    "stored",
    "scheduled",
    "spooled",
    "due",
    "delivered",
    "acked",
    "released",
    "lock_expired",
    "redelivered",
    "expired",
    "dead_lettered",
    "redriven",
    "read",
    "committed",
    "failed",
]
# The usual order of a message's hops: breaks ties between events of the same millisecond.
HOP_ORDER: Final[dict[str, int]] = {
    "accepted": 0,
    "scheduled": 1,
    "spooled": 1,
    "due": 2,
    "stored": 3,
    "delivered": 4,
    "read": 4,
    "lock_expired": 5,
    "released": 5,
    "failed": 5,
    "expired": 5,
    "acked": 6,
    "committed": 6,
    "redelivered": 7,
    "dead_lettered": 8,
    "redriven": 9,
}
HOPS: Final = frozenset(HOP_ORDER)
Status = Literal["ok", "error"]
LevelName = Literal["info", "error", "debug"]


class Resource(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """The gateway that handled a hop (P5: resource {id, host, service, port})."""

    gateway_id: str
    host: str = ""
    service: str = ""
    port: int = 0


class TraceEvent(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """One hop of one traced message. Fields a policy does not keep stay at their defaults
    and are not encoded (see `keep_fields`)."""

    msg_id: str
    hop: Hop
    time_ms: int
    project: str
    topic: str
    resource: Resource
    status: Status = "ok"
    level: LevelName = "info"
    request_id: str | None = None
    keys: list[str] = msgspec.field(default_factory=list)
    queue: int | None = None
    # The consumer's retry queue or inbox (`%RETRY%C`, `%INBOX%C`) when the hop happened there
    # (then `queue` is None and `offset` is that topic's).
    source: str | None = None
    offset: int | None = None
    producer: str | None = None
    consumer: str | None = None
    client_id: str | None = None
    client_addr: str | None = None
    attempt: int | None = None
    error_type: str | None = None  # e.g. lock_expired, max_attempts, ttl, storage
    error_node: str | None = None  # the failing node (a gateway id, a store, a consumer)
    detail: str | None = None  # debug: a description, e.g. the dead-letter reason
    body: str | None = None  # content (modes that list it) or debug, cut to the configured size
    # The content kept by reference: the stored message at this hop's queue and offset
    # (core.trace_policy.content_by_reference); the path query reads its body from the store.
    content_ref: bool = False
    traceparent: str | None = None


def _optional_defaults() -> dict[str, object]:
    found: dict[str, object] = {}
    for info in msgspec.structs.fields(TraceEvent):
        if info.default is not msgspec.NODEFAULT:
            found[info.name] = info.default
        elif info.default_factory is not msgspec.NODEFAULT:
            found[info.name] = info.default_factory()
    return found


_DEFAULTS: Final = _optional_defaults()

_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(TraceEvent)


def encode_event(event: TraceEvent) -> bytes:
    return _encoder.encode(event)


def decode_event(raw: bytes | str) -> TraceEvent:
    """Raises msgspec.ValidationError or msgspec.DecodeError on a malformed event."""
    return _decoder.decode(raw)


def keep_fields(event: TraceEvent, fields: frozenset[str], body_max_bytes: int) -> TraceEvent:
    """`event` with every optional field outside `fields` reset (so it is not stored), and the
    body cut to `body_max_bytes` of UTF-8."""
    changes: dict[str, object] = {}
    for name, default in _DEFAULTS.items():
        if name not in fields and getattr(event, name) != default:
            changes[name] = default
    if "body" in fields and event.body is not None:
        cut = cut_body(event.body, body_max_bytes)
        if cut is not event.body:
            changes["body"] = cut
    return msgspec.structs.replace(event, **changes) if changes else event


def trace_topic(project: str) -> str:
    return TRACE_TOPIC_PREFIX + project


def project_of_trace_topic(topic: str) -> str | None:
    return topic[len(TRACE_TOPIC_PREFIX) :] if topic.startswith(TRACE_TOPIC_PREFIX) else None


def is_trace_topic(topic: str) -> bool:
    return topic.startswith(TRACE_TOPIC_PREFIX)


def sort_key(event: TraceEvent) -> tuple[int, int]:
    return (event.time_ms, HOP_ORDER.get(event.hop, 99))


def hops_in_order(events: Iterable[TraceEvent]) -> list[TraceEvent]:
    return sorted(events, key=sort_key)
