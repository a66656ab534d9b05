"""Trace policies (SPEC P2–P4): which messages are traced, at which level, and what is kept.

Pure: no IO. A policy selects messages by one mode (a project, a route = a topic, a queue of a
topic, or a service = a producer or consumer name). Several policies may match one message;
it is then traced once, at the highest level among them, keeping the union of the fields the
matched modes list (P2). Levels order info < error < debug (P4).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable
from enum import IntEnum, StrEnum
from typing import Final

import msgspec

from mqgate.errors import BadRequest


class Mode(StrEnum):
    PROJECT = "project"
    ROUTE = "route"  # a topic (the seed's exchange)
    QUEUE = "queue"  # one queue of a topic
    SERVICE = "service"  # a producer or consumer name


class Level(IntEnum):
    """Ordered: a higher level records everything a lower one does, and more."""

    INFO = 1
    ERROR = 2
    DEBUG = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: object, field: str = "level") -> Level:
        if isinstance(value, Level):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        raise BadRequest(f"{field} must be one of info, error, debug", field=field)


class TracePolicy(msgspec.Struct, frozen=True):
    """One active policy. The selector fields a mode needs: project → `project`; route →
    `topic`; queue → `topic` and `queue`; service → `service`. Others stay None."""

    id: str
    mode: Mode
    level: Level
    project: str | None = None
    topic: str | None = None
    queue: int | None = None
    service: str | None = None

    @classmethod
    def create(
        cls,
        id: str,
        mode: object,
        level: object = "info",
        *,
        project: str | None = None,
        topic: str | None = None,
        queue: int | None = None,
        service: str | None = None,
    ) -> TracePolicy:
        """Validate a policy as an admin request gives it; a 400 names the faulty field.
        Whether the topic or project exists is the caller's check (it needs the registry)."""
        try:
            parsed_mode = Mode(mode) if isinstance(mode, str) else None
        except ValueError:
            parsed_mode = None
        if parsed_mode is None:
            raise BadRequest("mode must be one of project, route, queue, service", field="mode")
        parsed_level = Level.parse(level)
        needed = _SELECTORS[parsed_mode]
        given = {"project": project, "topic": topic, "queue": queue, "service": service}
        for name in needed:
            value = given[name]
            if value is None or value == "":
                raise BadRequest(f"{name} is required for a {parsed_mode.value} policy", field=name)
        if queue is not None and (isinstance(queue, bool) or not isinstance(queue, int) or queue < 0):
            raise BadRequest("queue must be a non-negative integer", field="queue")
        for name, value in given.items():
            if name not in needed and value is not None:
                raise BadRequest(f"{name} is not a selector of a {parsed_mode.value} policy", field=name)
        return cls(id, parsed_mode, parsed_level, project, topic, queue, service)

    def matches(self, project: str, topic: str, queue: int | None, services: Collection[str]) -> bool:
        if self.mode is Mode.PROJECT:
            return self.project == project
        if self.mode is Mode.ROUTE:
            return self.topic == topic
        if self.mode is Mode.QUEUE:
            return self.topic == topic and queue is not None and self.queue == queue
        return self.service is not None and self.service in services


_SELECTORS: Final[dict[Mode, tuple[str, ...]]] = {
    Mode.PROJECT: ("project",),
    Mode.ROUTE: ("topic",),
    Mode.QUEUE: ("topic", "queue"),
    Mode.SERVICE: ("service",),
}


class MatchedTrace(msgspec.Struct, frozen=True):
    """The one trace a message gets: the highest level among the matched policies, the modes
    that matched (their fields are kept together) and which policies they were."""

    level: Level
    modes: frozenset[Mode]
    policy_ids: tuple[str, ...]


def match(
    policies: Iterable[TracePolicy],
    *,
    project: str,
    topic: str,
    queue: int | None = None,
    services: Iterable[str] = (),
) -> MatchedTrace | None:
    """The trace of a message, or None when no policy selects it. `queue` may be None before
    a queue is chosen (queue-mode policies then do not match); `services` are the producer
    and consumer names involved in the hop."""
    names = services if isinstance(services, (set, frozenset)) else frozenset(services)
    level: Level | None = None
    modes: set[Mode] = set()
    ids: list[str] = []
    for policy in policies:
        if policy.matches(project, topic, queue, names):
            level = policy.level if level is None else max(level, policy.level)
            modes.add(policy.mode)
            ids.append(policy.id)
    if level is None:
        return None
    return MatchedTrace(level, frozenset(modes), tuple(ids))


MEMO_SIZE: Final = 10_000


class PolicySet:
    """Policies indexed by selector, so the hot path looks up a handful of dict keys instead of
    scanning every policy; `match` gives the same answer as the module's `match`."""

    __slots__ = ("_by_project", "_by_queue", "_by_service", "_by_topic", "_memo", "policies")

    def __init__(self, policies: Iterable[TracePolicy]) -> None:
        self.policies = tuple(policies)
        self._by_project: dict[str, list[TracePolicy]] = {}
        self._by_topic: dict[str, list[TracePolicy]] = {}
        self._by_queue: dict[tuple[str, int], list[TracePolicy]] = {}
        self._by_service: dict[str, list[TracePolicy]] = {}
        # Answers by (project, topic, queue, services): a set never changes, and the hot path
        # asks the same few questions again and again. Bounded: cleared when full.
        self._memo: dict[tuple[str, str, int | None, tuple[str, ...]], MatchedTrace | None] = {}
        for p in self.policies:
            if p.mode is Mode.PROJECT and p.project is not None:
                self._by_project.setdefault(p.project, []).append(p)
            elif p.mode is Mode.ROUTE and p.topic is not None:
                self._by_topic.setdefault(p.topic, []).append(p)
            elif p.mode is Mode.QUEUE and p.topic is not None and p.queue is not None:
                self._by_queue.setdefault((p.topic, p.queue), []).append(p)
            elif p.mode is Mode.SERVICE and p.service is not None:
                self._by_service.setdefault(p.service, []).append(p)

    def __bool__(self) -> bool:
        return bool(self.policies)

    def match(
        self, project: str, topic: str, queue: int | None = None, services: Iterable[str] = ()
    ) -> MatchedTrace | None:
        if not self.policies:
            return None
        key = (project, topic, queue, tuple(services))
        try:
            return self._memo[key]
        except KeyError:
            pass
        if len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
        answer = self._memo[key] = self._match(project, topic, queue, key[3])
        return answer

    def _match(
        self, project: str, topic: str, queue: int | None, services: tuple[str, ...]
    ) -> MatchedTrace | None:
        found: list[TracePolicy] = []
        found += self._by_project.get(project, ())
        found += self._by_topic.get(topic, ())
        if queue is not None:
            found += self._by_queue.get((topic, queue), ())
        for name in services:
            found += self._by_service.get(name, ())
        if not found:
            return None
        # A service named twice (producer and consumer) must not list its policy twice.
        unique = list({p.id: p for p in found}.values())
        return match(unique, project=project, topic=topic, queue=queue, services=services)


# --- what is recorded (P3, P4) ----------------------------------------------------------------

# Kept at every level in every mode: what identifies the event and lets a query find and order
# it (the message id, request id and keys are the lookup keys of P6), the hop's status and time,
# and the handling gateway's resource (P3: "plus the handling middleware's id and resources").
IDENTITY_FIELDS: Final = frozenset(
    {"msg_id", "request_id", "keys", "project", "topic", "hop", "status", "time_ms", "resource",
     "traceparent", "level", "attempt"}
)  # fmt: skip
# The general fields each mode lists (P3). Routing key → keys (always kept); content → body.
MODE_FIELDS: Final[dict[Mode, frozenset[str]]] = {
    # route, queue, routing key, content, producer, receiver, send/receive status and times
    Mode.PROJECT: frozenset(
        {"queue", "source", "offset", "body", "producer", "consumer", "client_id", "client_addr"}
    ),
    # sender, receiver, content, status
    Mode.ROUTE: frozenset({"body", "producer", "consumer", "client_id"}),
    # content, producer, receiver, status, project
    Mode.QUEUE: frozenset({"queue", "source", "offset", "body", "producer", "consumer", "client_id"}),
    # P3 lists nothing for a service: who sent and received where, without content
    Mode.SERVICE: frozenset(
        {"queue", "source", "offset", "producer", "consumer", "client_id", "client_addr"}
    ),
}
ERROR_FIELDS: Final = frozenset({"error_type", "error_node"})
DEBUG_FIELDS: Final = frozenset({"detail", "body", "client_addr"})


def recorded_fields(modes: Iterable[Mode], level: Level) -> frozenset[str]:
    """The event fields kept for a message traced by `modes` at `level`: the identity fields,
    the union of the modes' general fields; from error on the failing node and error type;
    at debug the detail text and the body (cut to the configured size by the recorder) in
    every mode."""
    kept = set(IDENTITY_FIELDS)
    for mode in modes:
        kept |= MODE_FIELDS[mode]
    if level >= Level.ERROR:
        kept |= ERROR_FIELDS
    if level >= Level.DEBUG:
        kept |= DEBUG_FIELDS
    return frozenset(kept)


CONTENT_REF: Final = "content_ref"
_ADDRESS_AND_CONTENT: Final = frozenset({"body", "queue", "offset"})


def content_by_reference(fields: frozenset[str], level: Level) -> frozenset[str]:
    """`fields` (of `recorded_fields`) with the content kept by reference where it can be.

    Below debug, a record that holds the message's queue and offset addresses the stored
    message instead of copying its body (`content_ref`): the path query reads the body from
    the store while the message is retained, and the trace costs no copy of every message.
    Debug keeps a copy (cut to the configured size), which outlives the message; a mode that
    records no queue (route) keeps a copy too, as it has no address to point at."""
    if level < Level.DEBUG and fields >= _ADDRESS_AND_CONTENT:
        return (fields - {"body"}) | {CONTENT_REF}
    return fields


@functools.cache  # looked up for every traced message; modes x levels is a few dozen entries
def kept_fields(modes: frozenset[Mode], level: Level) -> frozenset[str]:
    """What a trace of `modes` at `level` keeps: `recorded_fields`, the content by reference
    where it can be."""
    return content_by_reference(recorded_fields(modes, level), level)


def cut_body(body: str, max_bytes: int) -> str:
    """`body` cut to at most `max_bytes` of UTF-8, never in the middle of a character."""
    if max_bytes <= 0:
        return ""
    if len(body) * 4 <= max_bytes:
        return body  # cannot be over: a character is at most 4 bytes
    raw = body.encode()
    if len(raw) <= max_bytes:
        return body
    return raw[:max_bytes].decode(errors="ignore")
