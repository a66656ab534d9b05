"""Values that travel between the gateway, the stores and the wire."""

from __future__ import annotations

from typing import Final

import msgspec

MODE_CLUSTER: Final = "cluster"
MODE_BROADCAST: Final = "broadcast"


class NewMessage(msgspec.Struct, frozen=True, rename={"body": "message", "order_key": "orderKey"}):
    """What a producer hands in, validated. Its wire names are those of the produce calls,
    so a batch body decodes straight into these."""

    body: str
    keys: list[str] = []
    tags: list[str] = []
    properties: dict[str, str] = {}
    order_key: str | None = None


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


class Receipt(msgspec.Struct, frozen=True):
    msgId: str
    broker: str
    queue: int
    offset: int


class QueueBounds(msgspec.Struct, frozen=True):
    """min: the oldest offset still stored; max: the next offset to be written."""

    queue: int
    min: int
    max: int
