"""A message's path (SPEC P6) from its trace events. Pure: no IO.

Hops in time order (ties broken by the usual hop order), each with the latency since the
previous hop, and for a failed hop the failing node, service and cause.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from mqgate.core.trace_context import context_of
from mqgate.tracing.events import Resource, TraceEvent, hops_in_order


class Failure(msgspec.Struct, frozen=True):
    node: str  # the failing node: the event's error_node, else the gateway that saw it
    service: str | None  # the consumer or producer at fault, else the gateway's service
    cause: str  # the error type (or "error" when the level kept none)
    detail: str | None = None  # debug level only


class HopView(msgspec.Struct, frozen=True):
    hop: str
    status: str
    time_ms: int
    latency_ms: int | None  # since the previous hop; None for the first
    resource: Resource
    topic: str
    queue: int | None = None
    source: str | None = None  # the consumer's retry queue or inbox, where the hop happened there
    offset: int | None = None
    producer: str | None = None
    consumer: str | None = None
    client_id: str | None = None
    client_addr: str | None = None
    request_id: str | None = None
    attempt: int | None = None
    failure: Failure | None = None
    detail: str | None = None
    body: str | None = None
    # The content was kept by reference: `body` is the stored message's, read by the query
    # (None once the message is no longer stored).
    content_ref: bool = False


class MessagePath(msgspec.Struct, frozen=True):
    msg_id: str
    project: str
    topic: str
    keys: list[str]
    producer: str | None
    traceparent: str  # W3C: the producer's, else derived from the id (core/trace_context.py)
    level: str  # the highest level any hop was recorded at
    hops: list[HopView]
    failures: list[HopView] = msgspec.field(default_factory=list)  # the hops that failed, in order

    @property
    def last_hop(self) -> str:
        return self.hops[-1].hop if self.hops else ""


_LEVEL_RANK = {"info": 1, "error": 2, "debug": 3}


def _failure(event: TraceEvent) -> Failure | None:
    if event.status != "error":
        return None
    service = event.consumer or event.producer or event.resource.service or None
    return Failure(
        node=event.error_node or event.resource.gateway_id,
        service=service,
        cause=event.error_type or "error",
        detail=event.detail,
    )


def build_path(msg_id: str, events: Iterable[TraceEvent]) -> MessagePath:
    """The path of `msg_id` from its events (any order; duplicates are kept, as stored)."""
    ordered = hops_in_order(events)
    hops: list[HopView] = []
    previous: int | None = None
    for e in ordered:
        hops.append(
            HopView(
                hop=e.hop,
                status=e.status,
                time_ms=e.time_ms,
                latency_ms=None if previous is None else e.time_ms - previous,
                resource=e.resource,
                topic=e.topic,
                queue=e.queue,
                source=e.source,
                offset=e.offset,
                producer=e.producer,
                consumer=e.consumer,
                client_id=e.client_id,
                client_addr=e.client_addr,
                request_id=e.request_id,
                attempt=e.attempt,
                failure=_failure(e),
                detail=e.detail,
                body=e.body,
                content_ref=e.content_ref,
            )
        )
        previous = e.time_ms
    first = ordered[0] if ordered else None
    keys: list[str] = []
    for e in ordered:
        keys.extend(k for k in e.keys if k not in keys)
    producer = next((e.producer for e in ordered if e.producer), None)
    # The producer's context where a hop recorded it, else the one derived from the id (what
    # the consumer was given).
    traceparent = context_of(msg_id, next((e.traceparent for e in ordered if e.traceparent), None))
    level = max((e.level for e in ordered), key=_LEVEL_RANK.__getitem__, default="info")
    return MessagePath(
        msg_id=msg_id,
        project=first.project if first else "",
        topic=first.topic if first else "",
        keys=keys,
        producer=producer,
        traceparent=traceparent,
        level=level,
        hops=hops,
        failures=[h for h in hops if h.failure is not None],
    )
