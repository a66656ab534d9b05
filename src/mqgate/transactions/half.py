"""What a topic's half messages are kept in, the handles that name them, and the ledger of
decisions (service.py puts them to use).

A topic `T`'s half messages live in three records its first half message makes, all of `T`'s
project (names under `aliyun.`, reserved for the gateway: the Aliyun API brought them first, and
the native routes share them, so a half message is `T`'s whichever door it came through):

- the half topic `aliyun.half.T`: a half message is appended there at once (durable as any
  message), with the time of its first check in the property `mq.half.checkAt`;
- its `mode=message` consumer `aliyun.half.T`: what a check receives. A half message received
  before its check time is hidden until then (its visibility changed) and not handed out; one
  due is handed out with the receive's receipt as its handle, hidden for the consumer's lock
  timeout (the check interval), then offered again; after `max_attempts` receives it goes to the
  consumer's dead-letter topic `%DLQ%aliyun.half.T` (never delivered, kept for a look);
- the op topic `aliyun.op.T` (one queue): one small record per commit or rollback, body the
  half message's id, tag `commit` or `rollback`. It is the decision's durable trace: a gateway
  reads it (from where it last read, the whole retained log after a start) before it decides
  anything about a half message, so a message resolved on any gateway is never offered again.

The publish handle (`H1.…`) names the half message's place (queue, offset) and id, signed with
the gateway's secret; a check's handle is the half consumer's own receipt.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
from collections import OrderedDict
from typing import Final, Protocol

import msgspec

from mqgate.errors import BadRequest, Conflict, NotFound
from mqgate.model import QueueBounds, StoredMessage

HALF_PREFIX: Final = "aliyun.half."
OP_PREFIX: Final = "aliyun.op."
# A half message's own properties: never a committed message's, never answered as the user's.
PROPERTY_PREFIX: Final = "mq.half."
PROPERTY_CHECK_AT: Final = PROPERTY_PREFIX + "checkAt"  # epoch ms of a half message's first check
PROPERTY_TOPIC: Final = PROPERTY_PREFIX + "topic"  # the topic a half message is for
OP_COMMIT: Final = "commit"
OP_ROLLBACK: Final = "rollback"
PUBLISH_HANDLE_PREFIX: Final = "H1."
HALF_QUEUES: Final = 4
MAX_TOPIC_CHARS: Final = 128 - len(HALF_PREFIX)  # the half topic's name within a name's 128
MAX_CHECK_AFTER_S: Final = 12 * 3600  # at most a message-level visibility
DEFAULT_CHECK_INTERVAL_S: Final = 30.0  # the half consumer's lock timeout: how often it is offered
DEFAULT_MAX_CHECKS: Final = 16  # receives of a half message before its dead-letter topic
READ_CHUNK: Final = 512
_SIG_BYTES: Final = 16
_MAX_RESOLVED: Final = 1_000_000  # per topic: the oldest forgotten past it

# What a refused handle or decision is: BadHandle (400), HalfGone (404), AlreadyDecided (409).
BAD_HANDLE: Final = "bad_handle"
HALF_GONE: Final = "half_message_gone"
ALREADY_DECIDED: Final = "already_decided"


class BadHandle(BadRequest):
    """Not a handle of this topic's half messages (malformed, forged, another topic's)."""

    code = BAD_HANDLE


class HalfGone(NotFound):
    """The half message a handle names is not there (rolled back and deleted, expired)."""

    code = HALF_GONE


class AlreadyDecided(Conflict):
    code = ALREADY_DECIDED


def half_topic(topic: str) -> str:
    return HALF_PREFIX + topic


def op_topic(topic: str) -> str:
    return OP_PREFIX + topic


class LogReader(Protocol):
    """What the ledger reads of the message store."""

    async def bounds(self, topic: str) -> list[QueueBounds]: ...

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]: ...


class PublishHandle(msgspec.Struct, frozen=True):
    topic: str  # the message's topic (not the half topic)
    msg_id: str
    queue: int
    offset: int


_encode_handle = msgspec.json.Encoder().encode
_decode_handle = msgspec.json.Decoder(tuple[str, str, int, int]).decode


def _sign(secret: bytes, payload: bytes) -> bytes:
    # The domain string is the first door's: handles signed before the native routes stay valid.
    return hmac.new(secret, b"aliyun-half\n" + payload, hashlib.sha256).digest()[:_SIG_BYTES]


def encode_publish_handle(h: PublishHandle, secret: bytes) -> str:
    payload = _encode_handle((h.topic, h.msg_id, h.queue, h.offset))
    b64 = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    sig = base64.urlsafe_b64encode(_sign(secret, payload)).rstrip(b"=").decode()
    return f"{PUBLISH_HANDLE_PREFIX}{b64}.{sig}"


def decode_publish_handle(handle: str, secret: bytes, field: str = "handle") -> PublishHandle:
    """A publish handle this gateway cluster signed, or BadHandle naming `field`."""
    body = handle[len(PUBLISH_HANDLE_PREFIX) :]
    b64, _, sig = body.partition(".")
    try:
        payload = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        presented = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
        if not hmac.compare_digest(presented, _sign(secret, payload)):
            raise ValueError("signature")
        topic, msg_id, queue, offset = _decode_handle(payload)
    except (ValueError, msgspec.DecodeError):
        raise BadHandle("the handle is not a half message's handle", field=field) from None
    return PublishHandle(topic, msg_id, queue, offset)


class _TopicState(msgspec.Struct):
    resolved: OrderedDict[str, str] = msgspec.field(default_factory=OrderedDict)  # half id -> op
    scanned: dict[int, int] = msgspec.field(default_factory=dict)  # op queue -> next offset to read
    turn: asyncio.Lock = msgspec.field(default_factory=asyncio.Lock)


class Ledger:
    """Which half messages were committed or rolled back, per topic, read from the op topics."""

    def __init__(self, store: LogReader) -> None:
        self.store = store
        self._topics: dict[str, _TopicState] = {}

    def _state(self, topic: str) -> _TopicState:
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _TopicState()
        return state

    def turn(self, topic: str) -> asyncio.Lock:
        """Held around a decision and its op record: one at a time on this gateway."""
        return self._state(topic).turn

    async def catch_up(self, topic: str) -> None:
        """Read the op records appended since this gateway last looked (all retained, the first
        time)."""
        state = self._state(topic)
        ops = op_topic(topic)
        try:
            bounds = await self.store.bounds(ops)
        except NotFound:
            return  # no transaction was ever decided on this topic
        for b in bounds:
            start = max(state.scanned.get(b.queue, b.min), b.min)
            while start < b.max:
                msgs = await self.store.read(ops, b.queue, start, min(READ_CHUNK, b.max - start))
                if not msgs:
                    break
                for _, m in msgs:
                    self._remember(state, m.body, m.tags[0] if m.tags else OP_ROLLBACK)
                start = msgs[-1][0] + 1
            state.scanned[b.queue] = start

    @staticmethod
    def _remember(state: _TopicState, half_id: str, op: str) -> None:
        state.resolved.setdefault(half_id, op)
        while len(state.resolved) > _MAX_RESOLVED:
            state.resolved.popitem(last=False)

    def resolved(self, topic: str, half_id: str) -> str | None:
        """`commit` or `rollback` once decided, else None."""
        return self._state(topic).resolved.get(half_id)

    def record(self, topic: str, half_id: str, op: str, queue: int | None, offset: int | None) -> None:
        """An op record stored by this gateway: known now, and not read back."""
        state = self._state(topic)
        self._remember(state, half_id, op)
        if queue is not None and offset is not None and state.scanned.get(queue) == offset:
            state.scanned[queue] = offset + 1
