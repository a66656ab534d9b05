"""Every answer of the HTTP API as a msgspec Struct (the `result` of the envelope): encoded
with camelCase names, and the source of the answer schemas in `/openapi.json`."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from mqgate.model import Receipt


class Output(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    pass


class ReceiptsOut(Output, kw_only=True):
    receipts: list[Receipt]


class ReadMessageOut(Output, kw_only=True):
    """A stored message as a read returns it: its stored fields, then where it is."""

    message_id: str
    timestamp: int
    producer: str
    message: str
    keys: list[str]
    tags: list[str]
    properties: dict[str, str]
    priority: int | None = None
    deliver_at: int | None = None
    deadline: int | None = None
    broker: str
    source: str | None = None  # the consumer's retry or inbox topic, when the message came from it
    queue: int
    offset: int


class DeliveredOut(ReadMessageOut, kw_only=True):
    """A message as a pull delivers it."""

    reconsume_times: int
    # When the gateway took the batch (epoch ms, its clock): a message is handed out only if its
    # deadline had not passed at this time.
    pop_time: int


class PullOut(Output, kw_only=True):
    status: Literal["FOUND", "NO_NEW_MSG", "PAUSED", "RATE_LIMITED"]
    request_id: str | None
    ack: str | None = None  # outcome of the ack the pull carried: ok or the refusal
    msg_list: list[DeliveredOut]


class StreamTicketOut(Output, kw_only=True):
    ticket: str
    expires_at_ms: int


class ReceivedOut(ReadMessageOut, kw_only=True):
    """A message as a receive hands it out (mode=message)."""

    receipt_handle: str  # deletes it, or changes its visibility, until it is received again
    receive_count: int  # this receive included
    first_receive_time: int  # epoch ms


class ReceiveOut(Output, kw_only=True):
    messages: list[ReceivedOut]


class MessagesDeletedOut(Output, kw_only=True):
    # Per receipt, in order: deleted, already_deleted, or stale_receipt (received again since:
    # not deleted).
    outcomes: list[str]


class VisibilityOut(Output, kw_only=True):
    outcome: Literal["changed", "not_in_flight", "stale_receipt", "already_deleted"]


class HalfPutOut(Output, kw_only=True):
    message_id: str
    handle: str  # commits or rolls it back (POST /mq/half/commit, /mq/half/rollback)
    check_at: int  # epoch ms: when it is first offered to a check, if still open


class HalvesOut(Output, kw_only=True):
    messages: list[HalfPutOut]  # in the request's order


class HalfCheckedOut(Output, kw_only=True):
    """A half message due for a check: decide it with `handle`."""

    message_id: str
    handle: str  # the check's: commits or rolls it back, until it is offered again
    timestamp: int  # when it was put (epoch ms)
    producer: str
    message: str
    keys: list[str]
    tags: list[str]
    properties: dict[str, str]
    receive_count: int  # times the gateway took it for a check, this time included


class HalfCheckOut(Output, kw_only=True):
    messages: list[HalfCheckedOut]


class HalfDecidedOut(Output, kw_only=True):
    message_id: str  # the half message's id
    outcome: Literal["committed", "rolled_back"]
    receipts: list[Receipt] = []  # a commit's: where the message went (a new id)


class AckOut(Output, kw_only=True):
    queue: int
    source: str | None = None
    committed: int


class ExtendOut(Output, kw_only=True):
    queue: int
    source: str | None = None
    extended_by_seconds: float


class BoundOut(Output, kw_only=True):
    queue: int
    min: int
    max: int


class BoundsOut(Output, kw_only=True):
    topic: str
    broker: str
    queues: list[BoundOut]


class ReadOut(Output, kw_only=True):
    topic: str
    broker: str
    queue: int
    offset: int
    next: int
    msg_list: list[ReadMessageOut]


class BrowseOut(ReadOut, kw_only=True):
    scanned: int
    scan_limit: int | None = None  # a key or messageId search: how many records it could read


class CommittedOut(Output, kw_only=True):
    queue: int
    committed: int


class CommitOut(Output, kw_only=True):
    consumer: str
    queues: list[CommittedOut]


class TopicOut(Output, kw_only=True):
    name: str
    queues: int
    retention_ms: int
    retention_bytes: int | None
    max_priority: int
    project: str


class DeletedOut(Output, kw_only=True):
    name: str
    deleted: bool


class TopicsOut(Output, kw_only=True):
    topics: list[TopicOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class ProducerOut(Output, kw_only=True):
    name: str
    topic: str
    destinations: list[str]
    token: str


class ConsumerRegisteredOut(Output, kw_only=True):
    name: str
    topic: str
    mode: str
    start: str
    token: str
    signing_secret: str | None = None  # a push consumer's, shown once (docs/PUSH.md)


class ConsumerOut(Output, kw_only=True):
    name: str
    topic: str
    mode: str
    paused: bool
    rate_limit: float
    alert_backlog: int
    lock_timeout_s: float
    max_attempts: int
    token_revoked: bool


class ProducerListedOut(Output, kw_only=True):
    name: str
    topic: str
    destinations: list[str]
    token_revoked: bool


class ProducersOut(Output, kw_only=True):
    producers: list[ProducerListedOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class TokenOut(Output, kw_only=True):
    name: str
    token: str | None  # None: revoked


class ConsumersOut(Output, kw_only=True):
    consumers: list[ConsumerOut]
    next: str | None = None  # the cursor of the next page; absent on the last


class QueueProgressOut(Output, kw_only=True):
    client_id: str | None
    broker: str
    queue: int
    source: str
    lane: int
    min: int
    max: int
    committed: int
    lag: int
    locked: bool
    lock_age_ms: int | None
    lock_owner: str | None
    last_access_ms: int | None
    attempts: int
    dead_lettered: int


class StrandedOut(Output, kw_only=True):
    """Messages of the consumer left on a cluster its project moved away from, not drained yet
    (not in `lag` until the drain moves them to its inbox): docs/FAILOVER.md."""

    cluster: str
    state: str  # the cluster's state now
    messages: int | None  # None: never measured there
    measured_ms: int  # when (0: never)
    live: bool  # measured just now; else the last figure from before the cluster failed


class ProgressOut(Output, kw_only=True):
    consumer: str
    topic: str
    mode: str
    paused: bool
    rate_limit: float
    alert_backlog: int
    lag: int
    dead_lettered: int
    queues: list[QueueProgressOut]
    stranded: list[StrandedOut] = []
    next: str | None = None  # the cursor of the next page of `queues`; absent on the last


class ClampedOut(Output, kw_only=True):
    client_id: str | None
    queue: int
    source: str
    requested: int
    offset: int


CLAMPED_NAMED: Final = 100  # clamped offsets a reset's answer names at most


class ResetOut(ProgressOut, kw_only=True):
    """The progress after a reset (the first page of its `queues`: `next` goes on with
    `GET /admin/consumers/{name}/progress`), and the queues whose requested offset was outside
    [min, max] and went to the nearest bound instead (the first 100 within the answer's budget;
    `clampedCount`: all)."""

    clamped: Annotated[list[ClampedOut], Meta(max_length=CLAMPED_NAMED)]
    clamped_count: int


class PurgeMoveOut(Output, kw_only=True):
    consumer: str
    client_id: str | None = None
    source: str
    queue: int
    committed: int
    end: int
    skipped: int


PURGE_MOVES_NAMED: Final = 1000  # moves a purge's answer names at most


class PurgeOut(Output, kw_only=True):
    """A purge's plan (GET) or what it did (POST): per consumer (and broadcast client) and
    queue, the committed offset, the queue's end it moves to and the messages that skips (the
    first 1,000 within the answer's budget; `movesCount`: all)."""

    topic: str
    consumer: str | None = None
    queue: int | None = None
    purged: bool
    skipped: int
    consumers: list[str]
    moves: Annotated[list[PurgeMoveOut], Meta(max_length=PURGE_MOVES_NAMED)]
    moves_count: int


class PausedOut(Output, kw_only=True):
    name: str
    paused: bool


class RateLimitOut(Output, kw_only=True):
    name: str
    messages_per_second: float


class AlertSetOut(Output, kw_only=True):
    name: str
    backlog: int


class AlertOut(Output, kw_only=True):
    consumer: str
    topic: str
    lag: int
    threshold: int


class AlertsOut(Output, kw_only=True):
    alerts: list[AlertOut]


class FaultOut(Output, kw_only=True):
    """Storage faults of one kind since the gateway started (details in its log)."""

    component: str
    kind: str
    count: int
    last: str


class RedrivenOut(Output, kw_only=True):
    dlq_offset: int
    message_id: str
    topic: str
    queue: int
    offset: int


class RedriveOut(Output, kw_only=True):
    consumer: str
    dead_letters: str
    position: int
    scanned: int
    next: int
    scan_limit: int
    already_redriven: int
    redriven: list[RedrivenOut]
    copied: bool = False  # copies only: the dead letters stay waiting
    left: int = 0  # chosen but left for the next redrive (a paced one takes what fits its time)


class DeadLettersOut(Output, kw_only=True):
    consumer: str
    dead_letters: str
    min: int
    max: int
    position: int
    redriven: int


class HealthOut(Output, kw_only=True):
    healthy: bool
    broker: str
    pid: int
    status: Literal["ok", "degraded"]
    degraded: dict[str, str]  # condition -> what it means, e.g. disk_below_floor
    faults: list[FaultOut]


class ErrorOut(Output, kw_only=True):
    code: str
    field: str | None


class PushAttemptOut(Output, kw_only=True):
    at: int  # epoch ms
    message_id: str
    attempt: int
    outcome: str
    latency_ms: float
    error: str = ""


class PushStatusOut(Output, kw_only=True):
    """A push consumer's settings (no secret) and this gateway's latest attempts, newest first."""

    name: str
    endpoint: str
    headers: list[str]  # their names only: values may be credentials
    max_in_flight: int
    timeout_s: float
    ordering: str
    backoff_initial_ms: int
    backoff_max_ms: int
    envelope: bool
    previous_secret_until: int = 0
    state: str  # "ok", "failing" (the latest attempt failed) or "idle" (none yet here)
    attempts: list[PushAttemptOut]


class PushSecretOut(Output, kw_only=True):
    name: str
    signing_secret: str
    previous_secret_until: int
