"""Request and answer shapes of projects, trace policies, traces and project health (SPEC P1-P6)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from msgspec import Meta

from mqgate.api.answers import Output
from mqgate.api.shapes import EpochMs, Input, Name, PageIn, TopicName

Description = Annotated[str, Meta(max_length=1000)]
LookupValue = Annotated[str, Meta(min_length=1, max_length=512)]


class ProjectIn(Input, kw_only=True, frozen=True):
    name: Name
    description: Description = ""


class ProjectNameIn(Input, kw_only=True, frozen=True):
    name: Name


class ProjectHealthIn(PageIn, kw_only=True, frozen=True):
    name: Name


class ProjectQueuesIn(PageIn, kw_only=True, frozen=True):
    name: Name
    topic: TopicName | None = None
    queue: Annotated[int, Meta(ge=0)] | None = None
    since: EpochMs | None = None
    until: EpochMs | None = None


class PolicyIn(Input, kw_only=True, frozen=True):
    mode: Literal["project", "route", "queue", "service"]
    level: Literal["info", "error", "debug"] = "info"
    project: Name | None = None
    topic: TopicName | None = None
    queue: Annotated[int, Meta(ge=0)] | None = None
    service: Name | None = None


class PolicyIdIn(Input, kw_only=True, frozen=True):
    id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_]{1,64}$")]


class RoutersIn(PageIn, kw_only=True, frozen=True):
    project: Name | None = None
    topic: TopicName | None = None


class TraceIn(Input, kw_only=True, frozen=True):
    """Exactly one of the three."""

    msg_id: LookupValue | None = None
    request_id: Annotated[str, Meta(min_length=1, max_length=4096)] | None = None
    key: LookupValue | None = None


# A project's topics named in its answer at most; the rest: `GET /admin/topics?project=<name>`.
PROJECT_TOPICS_NAMED: Final = 100


class ProjectOut(Output, kw_only=True):
    name: str
    description: str
    topics: Annotated[
        list[str],
        Meta(
            max_length=PROJECT_TOPICS_NAMED,
            description=f"its first {PROJECT_TOPICS_NAMED} topics by name; all of them: "
            "GET /admin/topics?project=<name> (paged)",
        ),
    ]
    topic_count: int  # how many topics it has


class ProjectsOut(Output, kw_only=True):
    projects: list[ProjectOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class PolicyOut(Output, kw_only=True):
    id: str
    mode: str
    level: str
    project: str | None = None
    topic: str | None = None
    queue: int | None = None
    service: str | None = None


class PoliciesOut(Output, kw_only=True):
    policies: list[PolicyOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class ResourceOut(Output, kw_only=True):
    gateway_id: str
    host: str
    service: str
    port: int


class FailureOut(Output, kw_only=True):
    node: str
    service: str | None = None
    cause: str
    detail: str | None = None


class HopOut(Output, kw_only=True):
    hop: str
    status: str
    time_ms: int
    latency_ms: int | None = None
    resource: ResourceOut
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
    failure: FailureOut | None = None
    detail: str | None = None
    body: str | None = None
    content_ref: bool = False  # body read from the stored message (info keeps no copy)


class GroupStateOut(Output, kw_only=True):
    consumer: str
    state: str  # consumed | not_consumed | in_delivery | in_retry | dead_lettered | redriven | unknown
    committed: int | None = None


class PathOut(Output, kw_only=True):
    msg_id: str
    project: str
    topic: str
    keys: list[str]
    producer: str | None = None
    traceparent: str | None = None
    level: str
    hops: list[HopOut]
    failures: list[HopOut]
    consumers: list[GroupStateOut]


class TraceOut(Output, kw_only=True):
    paths: list[PathOut]
    may_be_incomplete: bool
    index_lag_events: int
    index_lag_ms: int


class FindingOut(Output, kw_only=True):
    rule: str
    side: str
    project: str
    topic: str | None = None
    queue: int | None = None
    consumer: str | None = None
    since_ms: int | None = None
    summary: str
    evidence: dict[str, int | float | str | list[float] | dict[str, float] | None]


class ProjectHealthOut(Output, kw_only=True):
    """A project's health (SPEC P1); `HealthOut` is the gateway's own (/healthz)."""

    project: str
    verdict: str
    checked_ms: int
    window_since_ms: int
    findings: list[FindingOut]  # a page of them, by side, rule, topic, queue and consumer
    finding_count: int  # all of them, on every page
    next: str | None = None  # the cursor of the next page; absent on the last


class QueueIntervalOut(Output, kw_only=True):
    topic: str
    queue: int
    start_ms: int
    interval_ms: int
    max_length: int | None = None
    avg_length: float | None = None
    dropped: int


class QueueHistoryOut(Output, kw_only=True):
    project: str
    intervals: list[QueueIntervalOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class RouterOut(Output, kw_only=True):
    """The seed's router object (SPEC P5): one queue of a topic of a project."""

    id: str
    project: str
    topic: str
    queue: int
    lane: int


class RoutersOut(Output, kw_only=True):
    routers: list[RouterOut]
    next: str | None = None  # the cursor of the next page; absent on the last
