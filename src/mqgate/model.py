"""Values that travel between the gateway, the stores and the wire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, Protocol

import msgspec

MODE_CLUSTER: Final = "cluster"
MODE_BROADCAST: Final = "broadcast"
# Each message received, hidden and deleted by its own receipt (issue 30; services/messages.py).
MODE_MESSAGE: Final = "message"
# Message by message too, delivered by the gateway to an HTTP endpoint (issue 31; push/).
MODE_PUSH: Final = "push"
MESSAGE_LEVEL_MODES: Final = (MODE_MESSAGE, MODE_PUSH)


class DestinationInput(Protocol):
    """One destination a producer names (SPEC S1): a topic or a registered consumer's inbox,
    with QoS that overrides the message's own. The HTTP edge's request shape provides it."""

    @property
    def topic(self) -> str | None: ...
    @property
    def consumer(self) -> str | None: ...  # point-to-point: this consumer's inbox
    @property
    def deliver_at(self) -> int | None: ...  # epoch ms
    @property
    def delay_ms(self) -> int | None: ...
    @property
    def ttl_ms(self) -> int | None: ...
    @property
    def priority(self) -> int | None: ...


class MessageInput(Protocol):
    """What a producer hands in, validated by the edge that received it. QoS (SPEC S1, S2):
    None everywhere means the producer's topic, now, no deadline, priority 0."""

    @property
    def body(self) -> str: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def tags(self) -> list[str]: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def order_key(self) -> str | None: ...
    @property
    def deliver_at(self) -> int | None: ...
    @property
    def delay_ms(self) -> int | None: ...
    @property
    def ttl_ms(self) -> int | None: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def destinations(self) -> Sequence[DestinationInput] | None: ...


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


# The one decoder of a stored record (the JSON object `StoredMessage` encodes), and an encoder.
decode_stored: Final = msgspec.json.Decoder(StoredMessage).decode
encode_stored: Final = msgspec.json.Encoder().encode


class Receipt(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """Where one destination of a message went: "stored" at a queue and offset, "scheduled"
    (held until `deliver_at`, then stored), or "spooled" (kept on the gateway's disk while the
    project's clusters cannot take it, then stored; SPEC P8, E7). The produce answers encode it
    as is.

    `possible_duplicate` (only ever on a spooled receipt): the send that failed before it was
    spooled may have stored it already, so it may be delivered twice (with the same id);
    omitted when false."""

    msg_id: str
    broker: str
    status: Literal["stored", "scheduled", "spooled"]
    queue: int | None = None
    offset: int | None = None
    destination: str | None = None  # set when the producer named destinations
    deliver_at: int | None = None
    deadline: int | None = None
    possible_duplicate: bool = False


class QueueBounds(msgspec.Struct, frozen=True):
    """min: the oldest offset still stored; max: the next offset to be written."""

    queue: int
    min: int
    max: int
    # Priority lane of the queue (higher is served first); the gateway sets it, stores leave 0.
    lane: int = 0
