"""Every request and answer of the HTTP API as a msgspec Struct: the one source of decoding,
validation, error messages and the OpenAPI document. Limits that are settings (message size,
batch size, pull size, long-poll time) are in `SETTINGS_LIMITS`, applied and documented from
there; the others are protocol constants, as `Meta` constraints here."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from mqgate.core.scheduling import MAX_PRIORITY
from mqgate.names import INTERNAL_PREFIXES
from mqgate.services.deadletters import MAX_RATE_PER_S

MAX_QUEUES: Final = 256
MAX_DESTINATIONS: Final = 16  # per message
MAX_STORE_QUEUES: Final = MAX_QUEUES * (MAX_PRIORITY + 1)
MAX_LOCK_TIMEOUT_S: Final = 12 * 3600.0
MAX_ATTEMPTS: Final = 1000
MAX_READ_MESSAGES: Final = 10_000
MAX_SCAN_RECORDS: Final = 1_000_000
DEFAULT_SCAN_RECORDS: Final = 10_000
MAX_LIST_ITEMS: Final = 32
MAX_ITEM_CHARS: Final = 256
MAX_PROPERTIES: Final = 64
MAX_PROPERTY_VALUE_CHARS: Final = 4096
DAY_MS: Final = 24 * 3600 * 1000
MAX_DELAY_MS: Final = 365 * DAY_MS  # how far ahead a message may be scheduled
MAX_TTL_MS: Final = 10 * 365 * DAY_MS
MAX_EPOCH_MS: Final = 2**47 - 1
MAX_OFFSET: Final = 2**62
MAX_REDRIVE_RATE: Final = MAX_RATE_PER_S  # dead letters copied back a second (one limit, the service's)
# A page of an admin list (docs/PROTOCOL.md, "Paging"): at most this many items, and never
# more bytes than `max_answer_bytes` (at least one item); `next` is where the next page starts.
MAX_PAGE_ITEMS: Final = 10_000
DEFAULT_PAGE_ITEMS: Final = 1000
MAX_CURSOR_CHARS: Final = 2048
NAME_PATTERN: Final = r"^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$"
# A topic name, or one of the gateway's own topics (a consumer's `%DLQ%…`, a project's `%TRACE%…`).
TOPIC_PATTERN: Final = "^(" + "|".join(INTERNAL_PREFIXES) + r")?(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$"

Name = Annotated[str, Meta(pattern=NAME_PATTERN, description="letters, digits, '.', '_', '-'; 1-128")]
RetentionBytes = Annotated[int, Meta(ge=0, le=2**62, description="per queue; 0 = unlimited")]
TopicName = Annotated[str, Meta(pattern=TOPIC_PATTERN, description="a topic name")]
Item = Annotated[str, Meta(max_length=MAX_ITEM_CHARS)]
Items = Annotated[list[Item], Meta(max_length=MAX_LIST_ITEMS)]
Properties = Annotated[
    dict[
        Annotated[str, Meta(min_length=1, max_length=MAX_ITEM_CHARS)],
        Annotated[str, Meta(max_length=MAX_PROPERTY_VALUE_CHARS)],
    ],
    Meta(max_length=MAX_PROPERTIES, description="string to string map"),
]
EpochMs = Annotated[int, Meta(ge=0, le=MAX_EPOCH_MS, description="epoch milliseconds")]
DelayMs = Annotated[int, Meta(ge=0, le=MAX_DELAY_MS)]
TtlMs = Annotated[int, Meta(ge=1, le=MAX_TTL_MS, description="validity from the start of delivery")]
Priority = Annotated[int, Meta(ge=0, le=MAX_PRIORITY, description="higher is delivered first")]
Offset = Annotated[int, Meta(ge=0, le=MAX_OFFSET)]


class Input(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True, frozen=True):
    """Base of every request shape: unknown fields are refused, wire names are camelCase."""


class PageIn(Input, kw_only=True, frozen=True):
    """A page of a list: at most `limit` items after `cursor` (the `next` of the previous page),
    stopping before `max_answer_bytes` (at least one item). The base of every list's shape."""

    limit: Annotated[
        int,
        Meta(
            ge=1,
            le=MAX_PAGE_ITEMS,
            description="items in this page at most; it also stops at the answer's byte budget",
        ),
    ] = DEFAULT_PAGE_ITEMS
    cursor: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=MAX_CURSOR_CHARS,
                description="the previous page's `next`, with the same other parameters; "
                "none: the first page",
            ),
        ]
        | None
    ) = None


def _one_timing(deliver_at: int | None, delay_ms: int | None) -> None:
    if deliver_at is not None and delay_ms is not None:
        raise ValueError("delayMs: give deliverAt or delayMs, not both")


class DestinationIn(Input, kw_only=True, frozen=True):
    """A topic or a consumer's inbox, with QoS overriding the message's (SPEC S1)."""

    topic: TopicName | None = None
    consumer: Name | None = None
    deliver_at: EpochMs | None = None
    delay_ms: DelayMs | None = None
    ttl_ms: TtlMs | None = None
    priority: Priority | None = None

    def __post_init__(self) -> None:
        if (self.topic is None) == (self.consumer is None):
            raise ValueError("needs exactly one of topic or consumer")
        _one_timing(self.deliver_at, self.delay_ms)


class MessageIn(Input, kw_only=True, frozen=True):
    """One message (SPEC G3, S1): its body, keys, tags, properties and optional QoS."""

    body: str = msgspec.field(name="message")
    keys: Items = []
    tags: Items = []
    properties: Properties = {}
    order_key: str | None = None
    deliver_at: EpochMs | None = None
    delay_ms: DelayMs | None = None
    ttl_ms: TtlMs | None = None
    priority: Priority | None = None
    destinations: Annotated[list[DestinationIn], Meta(min_length=1, max_length=MAX_DESTINATIONS)] | None = (
        None
    )

    def __post_init__(self) -> None:
        # `_one_timing`'s check written out: it runs for each message of a batch.
        if self.deliver_at is not None and self.delay_ms is not None:
            raise ValueError("delayMs: give deliverAt or delayMs, not both")


class ProduceIn(MessageIn, kw_only=True, frozen=True):
    producer: Name


class ProduceBatchIn(Input, kw_only=True, frozen=True):
    producer: Name
    messages: Annotated[list[MessageIn], Meta(min_length=1)]


class PullIn(Input, kw_only=True, frozen=True):
    topic: TopicName
    consumer: Name
    request_id: str | None = None
    client_id: Name | None = None
    max: Annotated[int, Meta(ge=1)] = 32
    wait: Annotated[float, Meta(ge=0.0)] = 0.0


MAX_TICKET_CHARS: Final = 512  # a stream ticket is ~100
MAX_TICKET_S: Final = 3600


class StreamIn(Input, kw_only=True, frozen=True):
    """A stream of a cluster or broadcast consumer's batches (docs/STREAM.md), as Server-Sent
    Events or, with an Upgrade, over a WebSocket: at most `max` messages out in batches not yet
    acked; a heartbeat every `heartbeat` seconds. `ticket`: a stream ticket in place of the
    consumer's token (browsers)."""

    topic: TopicName
    consumer: Name
    client_id: Name | None = None
    max: Annotated[int, Meta(ge=1, le=10_000)] = 100
    heartbeat: Annotated[float, Meta(ge=0.5, le=60.0)] = 15.0
    ticket: Annotated[str, Meta(min_length=1, max_length=MAX_TICKET_CHARS)] | None = None
    # Resume after this batch (acking it), as the Last-Event-ID header does: for a WebSocket,
    # and a browser's new EventSource, which cannot send that header.
    last_event_id: Annotated[str, Meta(min_length=1, max_length=1024)] | None = None
    # End the stream after this many seconds (an `end` event, reason "timeout"): for a proxy or
    # platform that bounds an answer's life; the client reconnects and resumes.
    timeout: Annotated[float, Meta(ge=1.0, le=86_400.0)] | None = None


class StreamTicketIn(Input, kw_only=True, frozen=True):
    """A stream ticket for a browser (docs/STREAM.md): opens this consumer's (and client's)
    stream and acks its batches for `expiresInS` seconds; a rotated token's tickets stop."""

    topic: TopicName
    consumer: Name
    client_id: Name | None = None
    expires_in_s: Annotated[float, Meta(ge=1.0, le=MAX_TICKET_S)] = 300.0


MAX_RECEIPTS: Final = 100  # receipt handles one delete names at most


class ReceiveIn(Input, kw_only=True, frozen=True):
    """A message-level consumer's receive (mode=message): up to `max` visible messages, each
    hidden for `visibility` seconds (the consumer's lock timeout when left out)."""

    topic: TopicName | None = None
    consumer: Name
    max: Annotated[int, Meta(ge=1)] = 10
    wait: Annotated[float, Meta(ge=0.0)] = 0.0
    visibility: Annotated[float, Meta(ge=0.0, le=MAX_LOCK_TIMEOUT_S)] | None = None


class ReceiptsIn(Input, kw_only=True, frozen=True):
    """Delete the messages these receipt handles name."""

    consumer: Name
    receipt_handles: Annotated[list[Annotated[str, Meta(min_length=1, max_length=1024)]],
                               Meta(min_length=1, max_length=MAX_RECEIPTS)]  # fmt: skip


class VisibilityIn(Input, kw_only=True, frozen=True):
    """Hide a received message for `seconds` from now (0: visible again at once)."""

    consumer: Name
    receipt_handle: Annotated[str, Meta(min_length=1, max_length=1024)]
    seconds: Annotated[float, Meta(ge=0.0, le=MAX_LOCK_TIMEOUT_S)]


MAX_HANDLE_CHARS: Final = 1024
MAX_CHECK_AFTER_S: Final = 12 * 3600  # transactions/half.py's, as a protocol constant


class HalfIn(Input, kw_only=True, frozen=True):
    """Half (transactional) messages for the producer's topic (docs/PROTOCOL.md, "Half
    messages"): stored, never delivered until committed; offered to a check after `checkAfterS`.
    A message's QoS applies from its commit; it names no destinations."""

    producer: Name
    check_after_s: Annotated[
        float, Meta(ge=0.0, le=MAX_CHECK_AFTER_S, description="seconds before the first check")
    ] = 60.0
    messages: Annotated[list[MessageIn], Meta(min_length=1)]


class HalfCheckIn(Input, kw_only=True, frozen=True):
    """The producer's topic's half messages due for a check, each with a new handle."""

    producer: Name
    max: Annotated[int, Meta(ge=1)] = 10
    wait: Annotated[float, Meta(ge=0.0)] = 0.0


class HalfDecideIn(Input, kw_only=True, frozen=True):
    """Commit or roll back the half message a handle names (its put's or a check's)."""

    producer: Name
    handle: Annotated[str, Meta(min_length=1, max_length=MAX_HANDLE_CHARS)]


class TokenIn(Input, kw_only=True, frozen=True):
    request_id: Annotated[str, Meta(min_length=1, description="the ack token of a pull")]
    consumer: Annotated[Name, Meta(description="if given, must be the consumer the token names")] | None = (
        None
    )


class ExtendIn(TokenIn, kw_only=True, frozen=True):
    seconds: Annotated[float, Meta(ge=1.0, le=3600.0)] | None = None


class BoundsIn(Input, kw_only=True, frozen=True):
    topic: TopicName
    consumer: Name | None = None


class ReadIn(BoundsIn, kw_only=True, frozen=True):
    queue: Annotated[int, Meta(ge=0, le=MAX_STORE_QUEUES)]
    offset: Offset
    max: Annotated[int, Meta(ge=1, le=MAX_READ_MESSAGES)] = 1000


class CommitIn(Input, kw_only=True, frozen=True):
    consumer: Name
    # Store queue (a decimal string) -> next offset to read; checked in `commit_offsets`.
    offsets: dict[str, Any]


class BrowseIn(BoundsIn, kw_only=True, frozen=True):
    """One store queue from `offset` or `timestamp` (default: its oldest record), optionally
    searching for a `key` or a `messageId` among at most `scan` records."""

    queue: Annotated[int, Meta(ge=0, le=MAX_STORE_QUEUES)]
    offset: Offset | None = None
    timestamp: EpochMs | None = None
    key: Item | None = None
    message_id: Item | None = None
    max: Annotated[int, Meta(ge=1, le=MAX_READ_MESSAGES)] = 100
    scan: Annotated[int, Meta(ge=1, le=MAX_SCAN_RECORDS, description="records a search reads at most")] = (
        DEFAULT_SCAN_RECORDS
    )


class TopicIn(Input, kw_only=True, frozen=True):
    name: Name
    queues: Annotated[int, Meta(ge=1, le=MAX_QUEUES)] | None = None
    retention_ms: Annotated[int, Meta(ge=1000, le=2**62)] | None = None
    retention_bytes: RetentionBytes = 0
    max_priority: Annotated[int, Meta(ge=0, le=MAX_PRIORITY)] = 0
    project: (
        Annotated[Name, Meta(description="the project it belongs to (SPEC P1); default: default")] | None
    ) = None


class TopicChangeIn(Input, kw_only=True, frozen=True):
    """What may change on a topic, live: it grows (more queues per lane, more priority lanes)
    and its retention changes; it never shrinks."""

    name: TopicName
    queues: Annotated[int, Meta(ge=1, le=MAX_QUEUES)] | None = None
    max_priority: Annotated[int, Meta(ge=0, le=MAX_PRIORITY)] | None = None
    retention_ms: Annotated[int, Meta(ge=1000, le=2**62)] | None = None
    retention_bytes: RetentionBytes | None = None


class TopicsIn(PageIn, kw_only=True, frozen=True):
    project: (
        Annotated[Name, Meta(description="only this project's topics (its trace topic left out)")] | None
    ) = None


class TopicNameIn(Input, kw_only=True, frozen=True):
    name: TopicName


class ConsumerDeleteIn(Input, kw_only=True, frozen=True):
    name: Name
    keep_dead_letters: Annotated[bool, Meta(description="keep its dead-letter topic")] = False


class ProducerIn(Input, kw_only=True, frozen=True):
    name: Name
    topic: TopicName
    destinations: Annotated[
        list[Annotated[str, Meta(pattern=r"^(inbox:\*|(inbox:)?(?!\.{1,2}$)[A-Za-z0-9._-]{1,128})$")]],
        Meta(max_length=MAX_LIST_ITEMS, description="further topics and inbox:<consumer> or inbox:*"),
    ] = []


PushHeaders = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=1024)]], Meta(max_length=20)
]


class ConsumerIn(Input, kw_only=True, frozen=True):
    name: Name
    topic: TopicName
    # message: each message received, hidden and deleted by its own receipt (POST /mq/receive);
    # push: message by message, POSTed by the gateway to `endpoint` (docs/PUSH.md)
    mode: Literal["cluster", "broadcast", "message", "push"] = "cluster"
    start: Annotated[str, Meta(pattern=r"^(earliest|latest|[0-9]{1,15})$")] = "earliest"
    lock_timeout_s: Annotated[float, Meta(ge=1.0, le=MAX_LOCK_TIMEOUT_S)] | None = None
    max_attempts: Annotated[int, Meta(ge=1, le=MAX_ATTEMPTS)] | None = None
    # mode=push only: where and how the gateway delivers (docs/PUSH.md)
    endpoint: Annotated[str, Meta(max_length=2048, description="http(s) URL of a push consumer")] | None = (
        None
    )
    headers: PushHeaders | None = None
    max_in_flight: Annotated[int, Meta(ge=1, le=1000)] | None = None
    timeout_s: Annotated[float, Meta(ge=0.1, le=60.0)] | None = None
    ordering: Literal["none", "key"] | None = None
    backoff_initial_ms: Annotated[int, Meta(ge=10, le=3_600_000)] | None = None
    backoff_max_ms: Annotated[int, Meta(ge=10, le=3_600_000)] | None = None
    envelope: bool | None = None


class NamedIn(Input, kw_only=True, frozen=True):
    name: Name


class ProgressIn(PageIn, kw_only=True, frozen=True):
    """A consumer's progress; its `queues` are paged (a broadcast consumer has a row per
    clientId and queue)."""

    name: Name


class ConsumerSettingsIn(NamedIn, kw_only=True, frozen=True):
    """The settings of a consumer that may change; its topic, mode and start stay."""

    lock_timeout_s: Annotated[float, Meta(ge=1.0, le=MAX_LOCK_TIMEOUT_S)] | None = None
    max_attempts: Annotated[int, Meta(ge=1, le=MAX_ATTEMPTS)] | None = None


class ResetIn(NamedIn, kw_only=True, frozen=True):
    to: Literal["earliest", "latest", "offset", "timestamp"]
    offset: Offset | None = None
    timestamp: EpochMs | None = None
    queue: Annotated[int, Meta(ge=0, le=MAX_STORE_QUEUES)] | None = None
    client_id: Name | None = None


class RedriveIn(NamedIn, kw_only=True, frozen=True):
    """Which dead letters go back to their topic: one (`offset` or `messageId`), those that
    pass every filter given, or all; at most `max` records are scanned from the position."""

    offset: Offset | None = None
    message_id: Item | None = None
    reason: Item | None = None
    key: Item | None = None
    since: EpochMs | None = None
    until: EpochMs | None = None
    source: (
        Annotated[TopicName, Meta(description="read from this store topic (dlq.source, else dlq.topic)")]
        | None
    ) = None
    queue: (
        Annotated[int, Meta(ge=0, le=MAX_STORE_QUEUES, description="read from this store queue")] | None
    ) = None
    everything: bool = msgspec.field(name="all", default=False)
    max: Annotated[int, Meta(ge=1, le=MAX_READ_MESSAGES, description="dead letters scanned at most")] = 1000
    start: Annotated[Offset, Meta(description="scan from this offset, not the redrive position")] | None = (
        None
    )
    copy: Annotated[bool, Meta(description="copy back, leaving them waiting (nothing recorded)")] = False
    messages_per_second: (
        Annotated[
            float, Meta(gt=0.0, le=MAX_REDRIVE_RATE, description="copies a second at most; none: at once")
        ]
        | None
    ) = None


class PurgePlanIn(NamedIn, kw_only=True, frozen=True):
    """A purge's scope: the topic (every consumer of it) or consumer `name`, on one store queue
    of the topic (none: every queue; a consumer's retry queue and inbox too)."""

    queue: Annotated[int, Meta(ge=0, le=MAX_STORE_QUEUES)] | None = None


class PurgeIn(PurgePlanIn, kw_only=True, frozen=True):
    confirm: Annotated[
        str, Meta(min_length=1, max_length=MAX_ITEM_CHARS, description="the name purged, again")
    ]


class RateLimitIn(NamedIn, kw_only=True, frozen=True):
    messages_per_second: Annotated[float, Meta(ge=0.0, le=1e9, description="0 = unlimited")]


class AlertIn(NamedIn, kw_only=True, frozen=True):
    backlog: Annotated[int, Meta(ge=0, le=2**62, description="0 = off")]


# (shape, field) -> (Settings attribute, how it limits the field). "max": a number's maximum;
# "max_items": a list's length; "max_bytes": a string's UTF-8 size (413 when over).
SETTINGS_LIMITS: Final[dict[tuple[type[Input], str], tuple[str, str]]] = {
    (PullIn, "max"): ("max_pull_messages", "max"),
    (PullIn, "wait"): ("max_wait_s", "max"),
    (ReceiveIn, "max"): ("max_pull_messages", "max"),
    (ReceiveIn, "wait"): ("max_wait_s", "max"),
    (ProduceIn, "body"): ("max_message_bytes", "max_bytes"),
    (MessageIn, "body"): ("max_message_bytes", "max_bytes"),
    (ProduceBatchIn, "messages"): ("max_batch_messages", "max_items"),
    (HalfIn, "messages"): ("max_batch_messages", "max_items"),
    (HalfCheckIn, "max"): ("max_pull_messages", "max"),
    (HalfCheckIn, "wait"): ("max_wait_s", "max"),
}
# (shape, field) -> the Settings attribute that is its default when it is left out.
SETTINGS_DEFAULTS: Final[dict[tuple[type[Input], str], str]] = {
    (TopicIn, "queues"): "default_queues",
    (TopicIn, "retention_ms"): "default_retention_ms",
    (ConsumerIn, "lock_timeout_s"): "default_lock_timeout_s",
    (ConsumerIn, "max_attempts"): "default_max_attempts",
}
