"""Values that travel between the gateway, the stores and the wire."""

from __future__ import annotations

from typing import Final

import msgspec

MODE_CLUSTER: Final = "cluster"
MODE_BROADCAST: Final = "broadcast"


class DestinationSpec(msgspec.Struct, frozen=True, rename="camel"):
    """One destination a producer names (SPEC S1): a topic or a registered consumer's inbox,
    with QoS that overrides the message's own."""

    topic: str | None = None
    consumer: str | None = None  # point-to-point: this consumer's inbox
    deliver_at: int | None = None  # epoch ms
    delay_ms: int | None = None
    ttl_ms: int | None = None
    priority: int | None = None


class NewMessage(
    msgspec.Struct,
    frozen=True,
    rename={
        "body": "message",
        "order_key": "orderKey",
        "deliver_at": "deliverAt",
        "delay_ms": "delayMs",
        "ttl_ms": "ttlMs",
    },
):
    """What a producer hands in, validated. Its wire names are those of the produce calls,
    so a batch body decodes straight into these."""

    body: str
    keys: list[str] = []
    tags: list[str] = []
    properties: dict[str, str] = {}
    order_key: str | None = None
    # QoS (SPEC S1, S2); None everywhere means: the producer's topic, now, no deadline, priority 0.
    deliver_at: int | None = None  # epoch ms
    delay_ms: int | None = None
    ttl_ms: int | None = None
    priority: int | None = None
    destinations: list[DestinationSpec] | None = None

    @property
    def plain(self) -> bool:
        """No QoS asked: the fast path."""
        return (
            self.deliver_at is None
            and self.delay_ms is None
            and self.ttl_ms is None
            and self.priority is None
            and self.destinations is None
        )


class StoredMessage(
    msgspec.Struct,
    frozen=True,
    omit_defaults=True,
    rename={
        "msg_id": "messageId",
        "body": "message",
        "timestamp_ms": "timestamp",
        "deliver_at_ms": "deliverAt",
        "deadline_ms": "deadline",
    },
):
    """One record of a queue log, stored as the JSON object a consumer receives (minus the
    delivery fields), so a pull is assembled from stored bytes without decoding them.
    The QoS fields are reserved for scheduling (SPEC S1)."""

    msg_id: str
    timestamp_ms: int
    producer: str
    body: str
    keys: list[str]
    tags: list[str]
    properties: dict[str, str]
    priority: int | None = None
    deliver_at_ms: int | None = None
    deadline_ms: int | None = None


class Receipt(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where one destination of a message went: "stored" at a queue and offset, or
    "scheduled" (held until `deliverAt`, then stored)."""

    msgId: str
    broker: str
    status: str  # "stored" | "scheduled"
    queue: int | None = None
    offset: int | None = None
    destination: str | None = None  # set when the producer named destinations
    deliverAt: int | None = None
    deadline: int | None = None


class QueueBounds(msgspec.Struct, frozen=True):
    """min: the oldest offset still stored; max: the next offset to be written."""

    queue: int
    min: int
    max: int
    # Priority lane of the queue (higher is served first); the gateway sets it, stores leave 0.
    lane: int = 0
