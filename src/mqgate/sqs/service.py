"""The SQS actions on mqgate's own parts (issue 30).

An SQS queue of an access key's project is three records made together by CreateQueue: the
topic `sqs.<account>.<queue>` (topic names are global in mqgate, queue names are per account),
its `mode=message` consumer `<topic>.c` (SQS's receive, visibility and delete are that mode's)
and its producer `<topic>.p`. VisibilityTimeout is the consumer's lock timeout,
MessageRetentionPeriod the topic's retention; what neither record holds (DelaySeconds,
ReceiveMessageWaitTimeSeconds, MaximumMessageSize, tags, the timestamps) is a row of
`tables.py`.

A queue is only ever found through the calling key: a URL naming another account, or a queue
of another project, is `QueueDoesNotExist`, as for a queue that never was, so a key learns
nothing of other projects.

A message's SQS attributes travel in its properties (`sqs.attr.<name>`: the data type, the
value's kind and the value, as JSON), so they come back exactly as sent, and so does the key
that sent it (`sqs.sender`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec
from sqlalchemy.exc import SQLAlchemyError

from mqgate.accesskeys.service import AccessKey
from mqgate.errors import AlreadyExists, MqgateError, NotFound
from mqgate.model import MODE_MESSAGE, DestinationInput, StoredMessage
from mqgate.registry.records import ConsumerRecord, ProducerRecord, Snapshot, TopicRecord
from mqgate.services.context import now_ms
from mqgate.services.gateway import Gateway
from mqgate.services.messages import Delivery
from mqgate.services.qos import TOPIC_TARGET
from mqgate.sqs import errors as e
from mqgate.sqs.errors import SqsError
from mqgate.sqs.fifo import (
    PROPERTY_DEDUP,
    PROPERTY_GROUP,
    SCOPE_GROUP,
    SCOPE_QUEUE,
    Deduplication,
    Sent,
    content_id,
    dedup_key,
    sequence_number,
)
from mqgate.sqs.md5 import md5_of_body, md5_of_message_attributes, md5_of_message_system_attributes
from mqgate.sqs.protocol import (
    MAX_DELAY_S,
    MAX_LIST_QUEUES_RESULTS,
    MAX_MESSAGE_BYTES,
    MAX_TAGS,
    MAX_VISIBILITY_TIMEOUT_S,
    MAX_WAIT_TIME_S,
    SqsRequest,
    message_bytes,
)
from mqgate.sqs.redrive import (
    MoveTask,
    MoveTasks,
    RedrivePolicy,
    new_task,
    parse_allow_policy,
    parse_redrive_policy,
    queue_of_arn,
)
from mqgate.sqs.tables import QueueRow, QueueTable

log = logging.getLogger(__name__)

TOPIC_PREFIX: Final = "sqs."
CONSUMER_SUFFIX: Final = ".c"
PRODUCER_SUFFIX: Final = ".p"
QUEUES: Final = 4  # store queues per SQS queue: receives take them in turn
# SQS has no receive limit without a redrive policy; the window's dead-letter rule needs one.
MAX_RECEIVES: Final = 2**31 - 1
DEFAULT_REGION: Final = "us-east-1"
DEFAULT_VISIBILITY_S: Final = 30
DEFAULT_RETENTION_S: Final = 4 * 24 * 3600
MIN_RETENTION_S: Final = 60
MAX_RETENTION_S: Final = 14 * 24 * 3600
MIN_MESSAGE_SIZE: Final = 1024
DEFAULT_RECEIVE_COUNT: Final = 1
PROPERTY_ATTR: Final = "sqs.attr."
PROPERTY_SYSTEM_ATTR: Final = "sqs.sysattr."
PROPERTY_SENDER: Final = "sqs.sender"
_NATIVE_ATTRIBUTE_NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,255}")

# Attributes kept in the table, with their range and default.
STORED_ATTRIBUTES: Final[dict[str, tuple[int, int, int]]] = {
    "DelaySeconds": (0, MAX_DELAY_S, 0),
    "MaximumMessageSize": (MIN_MESSAGE_SIZE, MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES),
    "ReceiveMessageWaitTimeSeconds": (0, MAX_WAIT_TIME_S, 0),
}
MAPPED_ATTRIBUTES: Final[dict[str, tuple[int, int, int]]] = {
    "VisibilityTimeout": (0, MAX_VISIBILITY_TIMEOUT_S, DEFAULT_VISIBILITY_S),
    "MessageRetentionPeriod": (MIN_RETENTION_S, MAX_RETENTION_S, DEFAULT_RETENTION_S),
}
RECEIVE_SYSTEM_ATTRIBUTES: Final = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "AWSTraceHeader",
)
# Attributes kept in the table as text, checked by redrive.py or below.
REDRIVE_ATTRIBUTES: Final = ("RedrivePolicy", "RedriveAllowPolicy")
# A FIFO queue's own attributes, each with its values (the first: the default).
FIFO_ATTRIBUTES: Final[dict[str, tuple[str, ...]]] = {
    "FifoQueue": ("true",),
    "ContentBasedDeduplication": ("false", "true"),
    "DeduplicationScope": (SCOPE_QUEUE, SCOPE_GROUP),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
TEXT_ATTRIBUTES: Final = (*REDRIVE_ATTRIBUTES, *FIFO_ATTRIBUTES)
FIFO_SUFFIX: Final = ".fifo"
# Properties the data path adds (the dead-letter marks, the delivery count): not the sender's
# attributes, so never shown as message attributes.
_INTERNAL_PROPERTIES: Final = ("sqs.", "dlq.", "mq.")
NOT_YET: Final[dict[str, str]] = {}
# Look-ups kept for the data path (SendMessage and the like name a queue by URL each time):
# queues by (account, project, name), producers by topic, a URL's path segments by URL.
_QUEUES_KEPT: Final = 4096
_URLS_KEPT: Final = 4096
_URL_CHARS_KEPT: Final = 512  # longer URLs are split each time, never kept


class Caller(msgspec.Struct):
    """Who signed the request, and where they reached the gateway (for queue URLs)."""

    key: AccessKey
    region: str
    base_url: str  # scheme://host, as the client addressed the gateway


class SqsMessage(msgspec.Struct):
    """One SQS message as the data path takes it (`mqgate.model.MessageInput`)."""

    body: str
    properties: dict[str, str]
    delay_ms: int | None
    keys: list[str] = msgspec.field(default_factory=list)
    tags: list[str] = msgspec.field(default_factory=list)
    order_key: str | None = None
    deliver_at: int | None = None
    ttl_ms: int | None = None
    priority: int | None = None
    destinations: Sequence[DestinationInput] | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    topic: TopicRecord
    consumer: ConsumerRecord
    row: QueueRow
    # What every send reads of its attributes, read once.
    max_message_bytes: int = field(init=False)
    delay_s: int = field(init=False)

    def __post_init__(self) -> None:
        attributes = self.row.attributes
        object.__setattr__(
            self, "max_message_bytes", int(attributes.get("MaximumMessageSize", MAX_MESSAGE_BYTES))
        )
        object.__setattr__(self, "delay_s", int(attributes.get("DelaySeconds", 0)))

    @property
    def fifo(self) -> bool:
        return self.name.endswith(FIFO_SUFFIX)


def topic_of(account: str, queue: str) -> str:
    return f"{TOPIC_PREFIX}{account}.{queue}"


def _attr_value(value: dict[str, Any]) -> str:
    """An SQS message attribute as a property value, every kind of value round-tripping."""
    kind, raw = "S", value.get("StringValue")
    if value.get("BinaryValue") is not None:
        kind, raw = "B", base64.b64encode(value["BinaryValue"]).decode()
    elif value.get("StringListValues"):
        kind, raw = "SL", list(value["StringListValues"])
    elif value.get("BinaryListValues"):
        kind, raw = "BL", [base64.b64encode(b).decode() for b in value["BinaryListValues"]]
    return msgspec.json.encode([value["DataType"], kind, raw]).decode()


def _attr_of(text: str) -> dict[str, Any] | None:
    try:
        data_type, kind, raw = msgspec.json.decode(text)
        if kind == "S":
            return {"DataType": data_type, "StringValue": raw}
        if kind == "B":
            return {"DataType": data_type, "BinaryValue": base64.b64decode(raw)}
        if kind == "SL":
            return {"DataType": data_type, "StringListValues": list(raw)}
        if kind == "BL":
            return {"DataType": data_type, "BinaryListValues": [base64.b64decode(b) for b in raw]}
    except (msgspec.DecodeError, ValueError, TypeError, binascii.Error):
        pass
    return None  # a property that only looks like one of ours (set through the native API)


def _int_attribute(name: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    if not text.lstrip("-").isdigit() or not low <= int(text) <= high:
        raise SqsError(e.INVALID_ATTRIBUTE_VALUE, f"Invalid value for the parameter {name}.")
    return int(text)


def _checked_attributes(attributes: dict[str, str]) -> dict[str, int]:
    """CreateQueue's and SetQueueAttributes' attributes, those mqgate serves, as numbers."""
    out: dict[str, int] = {}
    for name, value in attributes.items():
        if name in TEXT_ATTRIBUTES:
            continue
        ranged = STORED_ATTRIBUTES.get(name) or MAPPED_ATTRIBUTES.get(name)
        if ranged is None:
            raise SqsError(
                e.UNSUPPORTED_OPERATION, f"The queue attribute {name} is not supported by mqgate yet."
            )
        out[name] = _int_attribute(name, value, ranged[0], ranged[1])
    return out


def _text_attributes(attributes: dict[str, str], account: str, fifo: bool) -> dict[str, str]:
    """The text attributes asked for, each checked and in the form AWS answers it ("" removes)."""
    out: dict[str, str] = {}
    for name, values in FIFO_ATTRIBUTES.items():
        if name not in attributes:
            continue
        value = attributes[name].strip()
        if name == "FifoQueue":
            if (value.lower() == "true") != fifo:
                raise e.invalid_parameter_value(
                    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
                    "underscores, must end with .fifo suffix and be 1 to 80 in length."
                    if not fifo
                    else "A queue whose name ends in .fifo is a FIFO queue: its FifoQueue attribute is true."
                )
            continue
        if not fifo:
            raise SqsError(e.INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")
        chosen = value.lower() if name == "ContentBasedDeduplication" else value
        if chosen not in values:
            raise SqsError(e.INVALID_ATTRIBUTE_VALUE, f"Invalid value for the parameter {name}.")
        out[name] = chosen
    delay = attributes.get("DelaySeconds", "0").strip()
    if fifo and delay.isdigit() and int(delay) > 0:
        # A delayed message would be stored after the group's later ones: out of order.
        raise SqsError(
            e.INVALID_ATTRIBUTE_VALUE,
            "Invalid value for the parameter DelaySeconds: mqgate's FIFO queues take no delay.",
        )
    if "RedrivePolicy" in attributes:
        policy = parse_redrive_policy(attributes["RedrivePolicy"], account)
        out["RedrivePolicy"] = policy.text() if policy is not None else ""
    if "RedriveAllowPolicy" in attributes:
        allow = parse_allow_policy(attributes["RedriveAllowPolicy"], account)
        out["RedriveAllowPolicy"] = allow.text() if allow is not None else ""
    return out


def _receipt_invalid(handle: str) -> SqsError:
    return SqsError(
        e.RECEIPT_HANDLE_IS_INVALID,
        f'The input receipt handle "{handle[:200]}" is not a valid receipt handle.',
    )


class SqsService:
    def __init__(self, gateway: Gateway, table: QueueTable) -> None:
        self.gw = gateway
        self.table = table
        self._actions: dict[str, Callable[[SqsRequest, Caller], Awaitable[dict[str, Any] | None]]] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "DeleteQueue": self.delete_queue,
            "PurgeQueue": self.purge_queue,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_visibility,
            "ChangeMessageVisibilityBatch": self.change_visibility_batch,
            "GetCallerIdentity": self.get_caller_identity,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
            "StartMessageMoveTask": self.start_message_move_task,
            "ListMessageMoveTasks": self.list_message_move_tasks,
            "CancelMessageMoveTask": self.cancel_message_move_task,
        }
        self._rows_checked = asyncio.Lock()  # one check of the table's version at a time
        # Each kept queue with the registry snapshot and the table generation it was read at:
        # in force while both stay (a registry change replaces the snapshot, a table change
        # moves the generation), and only while the table's copy is not due for its check.
        self._queues: dict[tuple[str, str, str], tuple[Snapshot, int, Queue]] = {}
        self._producers: dict[str, tuple[Snapshot, ProducerRecord]] = {}
        self._url_parts: dict[str, tuple[str, ...]] = {}
        self.move_tasks = MoveTasks()
        self.dedup = Deduplication(gateway.ctx.store)
        gateway.messages.dead_letter_route = self.dead_letter_target

    async def handle(self, request: SqsRequest, caller: Caller) -> dict[str, Any] | None:
        handler = self._actions.get(request.action)
        if handler is None:
            reason = NOT_YET.get(request.action, "it is not supported yet")
            raise SqsError(e.UNSUPPORTED_OPERATION, f"mqgate does not serve {request.action}: {reason}.")
        return await handler(request, caller)

    # --- queues ---------------------------------------------------------------------------

    def url(self, caller: Caller, name: str) -> str:
        return f"{caller.base_url}/{caller.key.account}/{name}"

    def _kept(self, caller: Caller, name: str) -> Queue | None:
        """The queue as `_queue` last found it, while that still holds (see `_queues`)."""
        if self.table.due():
            return None
        key = caller.key
        kept = self._queues.get((key.account, key.project, name))
        if (
            kept is not None
            and kept[0] is self.gw.topology.ctx.registry.snapshot
            and kept[1] == self.table.generation
        ):
            return kept[2]
        return None

    def _kept_at(self, caller: Caller, url: str) -> Queue | None:
        """`_kept` of the queue a URL names as `_queue_at` reads it; None when it is not kept
        (or the URL names none: `_queue_at` answers that)."""
        parts = self._url_parts.get(url)
        if parts is None or len(parts) != 2 or parts[0] != caller.key.account:
            return None
        return self._kept(caller, parts[1])

    async def _queue(self, caller: Caller, name: str) -> Queue:
        kept = self._kept(caller, name)
        if kept is not None:
            return kept
        topology = self.gw.topology
        key = caller.key
        snapshot = topology.ctx.registry.snapshot
        generation = self.table.generation  # before any read: a change meanwhile makes it stale
        try:
            topic = await topology.topic(topic_of(caller.key.account, name))
            if topic.project != caller.key.project:
                raise e.queue_does_not_exist()
            consumer = await topology.consumer(topic.name + CONSUMER_SUFFIX)
        except NotFound as exc:
            raise e.queue_does_not_exist() from exc
        row = await self._row(topic)
        q = Queue(name, topic, consumer, row)
        if len(self._queues) >= _QUEUES_KEPT:
            self._queues.clear()
        self._queues[(key.account, key.project, name)] = (snapshot, generation, q)
        return q

    async def _row(self, topic: TopicRecord) -> QueueRow:
        if self.table.due():
            async with self._rows_checked:
                if self.table.due():  # not checked by another request meanwhile
                    try:
                        await asyncio.to_thread(self.table.check)
                    except SQLAlchemyError as exc:
                        log.warning("sqs queue attributes not checked, keeping this gateway's copy: %s", exc)
        hit, row = self.table.cached(topic.name)
        if not hit:  # the table is read once per queue, then from memory
            row = await asyncio.to_thread(self.table.get, topic.name)
        return row or QueueRow(topic.name, created_ms=topic.created_ms, modified_ms=topic.created_ms)

    async def _queue_at(self, caller: Caller, url: str) -> Queue:
        parts = self._url_parts.get(url)
        if parts is None:
            parts = tuple(p for p in urlsplit(url).path.split("/") if p)
            if len(url) <= _URL_CHARS_KEPT:
                if len(self._url_parts) >= _URLS_KEPT:
                    self._url_parts.clear()
                self._url_parts[url] = parts
        if len(parts) != 2 or parts[0] != caller.key.account:
            raise e.queue_does_not_exist()
        return await self._queue(caller, parts[1])

    def _kept_producer(self, q: Queue) -> ProducerRecord | None:
        kept = self._producers.get(q.topic.name)
        if kept is not None and kept[0] is self.gw.topology.ctx.registry.snapshot:
            return kept[1]
        return None

    async def _producer(self, q: Queue) -> ProducerRecord:
        kept = self._kept_producer(q)
        if kept is not None:
            return kept
        topology = self.gw.topology
        snapshot = topology.ctx.registry.snapshot
        topic = q.topic.name
        try:
            producer = await topology.producer(topic + PRODUCER_SUFFIX)
        except NotFound as exc:
            raise e.queue_does_not_exist() from exc
        if len(self._producers) >= _QUEUES_KEPT:
            self._producers.clear()
        self._producers[topic] = (snapshot, producer)
        return producer

    def _attributes(self, q: Queue) -> dict[str, int]:
        values = {
            name: int(q.row.attributes.get(name, default))
            for name, (_, _, default) in STORED_ATTRIBUTES.items()
        }
        values["VisibilityTimeout"] = int(q.consumer.lock_timeout_s)
        values["MessageRetentionPeriod"] = q.topic.retention_ms // 1000
        return values

    async def create_queue(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        name: str = p["QueueName"]
        fifo = name.endswith(FIFO_SUFFIX)
        wanted = _checked_attributes(p.get("Attributes", {}))
        texts = _text_attributes(p.get("Attributes", {}), caller.key.account, fifo)
        if fifo:
            if p.get("Attributes", {}).get("FifoQueue", "").strip().lower() != "true":
                raise e.invalid_parameter_value(
                    "A FIFO queue is created with the attribute FifoQueue set to true."
                )
            texts = {k: texts.get(k, values[0]) for k, values in FIFO_ATTRIBUTES.items()} | {
                k: v for k, v in texts.items() if k in REDRIVE_ATTRIBUTES
            }
        try:
            q = await self._queue(caller, name)
        except SqsError:
            q = None
        if q is None:
            policy = await self._checked_redrive(caller, name, texts)
            await self._create(caller, name, wanted, texts, p.get("tags", {}), policy)
            return {"QueueUrl": self.url(caller, name)}
        current: dict[str, int | str] = {**self._attributes(q), **self._texts(q)}
        for attr, value in {**wanted, **texts}.items():
            if current.get(attr, "") != value:
                raise SqsError(
                    e.QUEUE_NAME_EXISTS,
                    f"A queue already exists with the same name and a different value for attribute {attr}",
                )
        await self._complete(q.topic, wanted, self._redrive(q))
        return {"QueueUrl": self.url(caller, name)}

    @staticmethod
    def _texts(q: Queue) -> dict[str, str]:
        out = {k: q.row.attributes[k] for k in TEXT_ATTRIBUTES if q.row.attributes.get(k)}
        if q.fifo:
            out = {k: values[0] for k, values in FIFO_ATTRIBUTES.items()} | out
        return out

    @staticmethod
    def _redrive(q: Queue) -> RedrivePolicy | None:
        text = q.row.attributes.get("RedrivePolicy", "")
        return parse_redrive_policy(text, q.topic.name.split(".")[1]) if text else None

    async def _checked_redrive(
        self, caller: Caller, name: str, texts: dict[str, str]
    ) -> RedrivePolicy | None:
        """The redrive policy being set for queue `name`, once its dead-letter queue is known to
        exist, to allow `name` and to be of the same kind."""
        text = texts.get("RedrivePolicy", "")
        if not text:
            return None
        policy = parse_redrive_policy(text, caller.key.account)
        assert policy is not None
        try:
            target = await self._queue(caller, policy.target)
        except SqsError:
            raise e.invalid_value_for("RedrivePolicy", text, "Dead letter target does not exist.") from None
        if target.name == name:
            raise e.invalid_value_for("RedrivePolicy", text, "A queue cannot be its own dead letter queue.")
        if target.name.endswith(".fifo") != name.endswith(".fifo"):
            raise e.invalid_value_for(
                "RedrivePolicy", text, "The dead letter queue must be of the same type as the source queue."
            )
        allow = parse_allow_policy(target.row.attributes.get("RedriveAllowPolicy", ""), caller.key.account)
        if allow is not None and not allow.allows(name):
            raise e.invalid_value_for(
                "RedrivePolicy", text, f"Queue {target.name}'s RedriveAllowPolicy does not allow {name}."
            )
        return policy

    async def dead_letter_target(self, c: ConsumerRecord) -> str | None:
        """Where a queue's messages out of receives go: its redrive policy's dead-letter queue
        (MessageConsuming.dead_letter_route), None for a consumer that is not an SQS queue's."""
        if not (c.name.startswith(TOPIC_PREFIX) and c.name == c.topic + CONSUMER_SUFFIX):
            return None
        topic = self.gw.ctx.registry.topic(c.topic)
        if topic is None:
            return None
        account, name = topic.name.split(".", 2)[1:]
        row = await self._row(topic)
        policy = self._redrive(Queue(name, topic, c, row))
        return topic_of(account, policy.target) if policy is not None else None

    async def _create(
        self,
        caller: Caller,
        name: str,
        wanted: dict[str, int],
        texts: dict[str, str],
        tags: dict[str, str],
        policy: RedrivePolicy | None,
    ) -> None:
        topic_name = topic_of(caller.key.account, name)
        retention_s = wanted.get("MessageRetentionPeriod", DEFAULT_RETENTION_S)
        try:
            topic = await self.gw.topology.create_topic(
                topic_name, QUEUES, retention_s * 1000, None, project=caller.key.project, reserved=True
            )
        except AlreadyExists:  # a CreateQueue alongside made it, or the native API did
            topic = await self.gw.topology.topic(topic_name)
            if topic.project != caller.key.project:  # never a consumer on another project's topic
                raise SqsError(e.QUEUE_NAME_EXISTS, "A queue already exists with the same name.") from None
        now = now_ms()
        stored = {k: str(v) for k, v in wanted.items() if k in STORED_ATTRIBUTES}
        stored.update({k: v for k, v in texts.items() if v})
        await asyncio.to_thread(self.table.put, QueueRow(topic_name, stored, dict(tags), now, now))
        await self._complete(topic, wanted, policy)

    async def _complete(
        self, topic: TopicRecord, wanted: dict[str, int], policy: RedrivePolicy | None
    ) -> None:
        """The queue's consumer and producer, made if a CreateQueue stopped before them."""
        topology = self.gw.topology
        registry = self.gw.ctx.registry
        try:
            if registry.consumer(topic.name + CONSUMER_SUFFIX) is None:
                visibility = wanted.get("VisibilityTimeout", DEFAULT_VISIBILITY_S)
                await topology.register_consumer(
                    topic.name + CONSUMER_SUFFIX,
                    topic.name,
                    MODE_MESSAGE,
                    "earliest",
                    float(visibility),
                    policy.max_receive_count if policy is not None else MAX_RECEIVES,
                    reserved=True,
                )
            if registry.producer(topic.name + PRODUCER_SUFFIX) is None:
                await topology.register_producer(topic.name + PRODUCER_SUFFIX, topic.name, reserved=True)
        except AlreadyExists:
            pass  # made alongside

    async def get_queue_url(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        owner = p.get("QueueOwnerAWSAccountId")
        if owner is not None and owner != caller.key.account:
            raise e.queue_does_not_exist()
        q = await self._queue(caller, p["QueueName"])
        return {"QueueUrl": self.url(caller, q.name)}

    def _url_page(self, caller: Caller, p: dict[str, Any], names: list[str], member: str) -> dict[str, Any]:
        """A page of queue URLs by name (sorted), after `NextToken`, at most `MaxResults`."""
        token = p.get("NextToken")
        if token:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
                raise e.invalid_parameter_value("Invalid NextToken value.") from exc
            names = [n for n in names if n > after]
        limit = p.get("MaxResults")
        page = names[: limit or MAX_LIST_QUEUES_RESULTS]
        out: dict[str, Any] = {member: [self.url(caller, n) for n in page]}
        if limit is not None and len(names) > len(page):
            out["NextToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
        return out

    async def list_queues(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        registry = self.gw.ctx.registry
        stem = topic_of(caller.key.account, "")
        names = sorted(
            t.name[len(stem) :]
            for t in registry.topics_in(caller.key.project)
            if t.name.startswith(stem) and registry.consumer(t.name + CONSUMER_SUFFIX) is not None
        )
        prefix = p.get("QueueNamePrefix", "")
        names = [n for n in names if n.startswith(prefix)]
        return self._url_page(caller, p, names, "QueueUrls")

    async def delete_queue(self, request: SqsRequest, caller: Caller) -> None:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        topology = self.gw.topology
        # Each part tolerates being gone already (a DeleteQueue alongside).
        with contextlib.suppress(NotFound):
            await topology.delete_consumer(q.consumer.name)
        with contextlib.suppress(NotFound):
            await topology.delete_producer(q.topic.name + PRODUCER_SUFFIX)
        with contextlib.suppress(NotFound):
            await topology.delete_topic(q.topic.name)
        await asyncio.to_thread(self.table.delete, q.topic.name)

    async def purge_queue(self, request: SqsRequest, caller: Caller) -> None:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        await self.gw.operations.purge(consumer=q.consumer.name, confirm=q.consumer.name)

    async def _counts(self, q: Queue) -> tuple[int, int]:
        """(visible, in flight) messages of the queue: its backlog less what is received and
        hidden, or deleted out of order."""
        topology = self.gw.topology
        layout = await topology.layout(q.consumer)
        bounds = await topology.bounds(layout)
        offsets = self.gw.ctx.offsets
        table = await offsets.table(q.consumer.name, "") or []
        receipts = await offsets.receipt_counts(q.consumer.name, "", now_ms())
        visible = hidden = 0
        for i, b in enumerate(bounds):
            committed = max(table[i].committed if i < len(table) else b.min, b.min)
            flying, deleted = receipts.get(i, (0, 0))
            hidden += flying
            visible += max(b.max - committed - flying - deleted, 0)
        return visible, hidden

    async def get_queue_attributes(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        asked = set(request.params.get("AttributeNames", []))
        every = "All" in asked
        out: dict[str, str] = {}
        for name, value in {**self._attributes(q), **self._texts(q)}.items():
            if every or name in asked:
                out[name] = str(value)
        if every or asked & {"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"}:
            visible, hidden = await self._counts(q)
            if every or "ApproximateNumberOfMessages" in asked:
                out["ApproximateNumberOfMessages"] = str(visible)
            if every or "ApproximateNumberOfMessagesNotVisible" in asked:
                out["ApproximateNumberOfMessagesNotVisible"] = str(hidden)
        region = caller.region or DEFAULT_REGION
        extra = {
            "CreatedTimestamp": str(q.row.created_ms // 1000),
            "LastModifiedTimestamp": str(q.row.modified_ms // 1000),
            "QueueArn": f"arn:aws:sqs:{region}:{caller.key.account}:{q.name}",
            "SqsManagedSseEnabled": "false",
        }
        for name, text in extra.items():
            if every or name in asked:
                out[name] = text
        if every or "ApproximateNumberOfMessagesDelayed" in asked:  # held by the scheduler until due
            delayed = await self.gw.ctx.scheduler.held_for(TOPIC_TARGET + q.topic.name)
            out["ApproximateNumberOfMessagesDelayed"] = str(delayed)
        return {"Attributes": out} if out else {}

    async def set_queue_attributes(self, request: SqsRequest, caller: Caller) -> None:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        wanted = _checked_attributes(request.params["Attributes"])
        texts = _text_attributes(request.params["Attributes"], caller.key.account, q.fifo)
        if "RedrivePolicy" in texts:
            policy = await self._checked_redrive(caller, q.name, texts)
            await self.gw.topology.update_consumer(
                q.consumer.name, max_attempts=policy.max_receive_count if policy is not None else MAX_RECEIVES
            )
        if "VisibilityTimeout" in wanted:
            await self.gw.topology.update_consumer(
                q.consumer.name, lock_timeout_s=float(wanted["VisibilityTimeout"])
            )
        if "MessageRetentionPeriod" in wanted:
            await self.gw.topology.change_topic(
                q.topic.name, retention_ms=wanted["MessageRetentionPeriod"] * 1000
            )
        row = q.row
        stored = dict(row.attributes)
        stored.update({k: str(v) for k, v in wanted.items() if k in STORED_ATTRIBUTES})
        stored.update(texts)
        stored = {k: v for k, v in stored.items() if v}
        await asyncio.to_thread(
            self.table.put, QueueRow(row.topic, stored, dict(row.tags), row.created_ms, now_ms())
        )

    async def tag_queue(self, request: SqsRequest, caller: Caller) -> None:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        tags = {**q.row.tags, **request.params["Tags"]}
        if len(tags) > MAX_TAGS:
            raise e.invalid_parameter_value(f"Too many tags: a queue has at most {MAX_TAGS}.")
        row = q.row
        await asyncio.to_thread(
            self.table.put, QueueRow(row.topic, dict(row.attributes), tags, row.created_ms, row.modified_ms)
        )

    async def untag_queue(self, request: SqsRequest, caller: Caller) -> None:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        row = q.row
        tags = {k: v for k, v in row.tags.items() if k not in set(request.params["TagKeys"])}
        await asyncio.to_thread(
            self.table.put, QueueRow(row.topic, dict(row.attributes), tags, row.created_ms, row.modified_ms)
        )

    async def list_queue_tags(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        return {"Tags": dict(q.row.tags)} if q.row.tags else {}

    # --- messages ---------------------------------------------------------------------------

    def _message(self, q: Queue, entry: dict[str, Any], caller: Caller) -> SqsMessage:
        limit = q.max_message_bytes
        size = message_bytes(entry)
        if size > limit:
            raise e.invalid_parameter_value(
                f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes."
            )
        properties = {PROPERTY_SENDER: caller.key.access_key_id}
        attributes = entry.get("MessageAttributes")
        if attributes:
            for name, value in attributes.items():
                properties[PROPERTY_ATTR + name] = _attr_value(value)
        attributes = entry.get("MessageSystemAttributes")
        if attributes:
            for name, value in attributes.items():
                properties[PROPERTY_SYSTEM_ATTR + name] = _attr_value(value)
        delay = entry.get("DelaySeconds")
        if q.fifo:
            return self._fifo_message(q, entry, properties)
        if delay is None:
            delay = q.delay_s
        return SqsMessage(entry["MessageBody"], properties, delay * 1000 if delay else None)

    @staticmethod
    def _fifo_message(q: Queue, entry: dict[str, Any], properties: dict[str, str]) -> SqsMessage:
        """A FIFO queue's message: its group as the order key (one store queue, in order) and
        its first key (a dead letter of it stays with its group), its deduplication id kept."""
        if entry.get("DelaySeconds"):
            raise e.invalid_value_for(
                "DelaySeconds",
                entry["DelaySeconds"],
                "The request include parameter that is not valid for this queue type.",
            )
        group = entry.get("MessageGroupId")
        if group is None:
            raise e.missing_parameter("MessageGroupId")
        dedup_id = entry.get("MessageDeduplicationId")
        if dedup_id is None:
            if q.row.attributes.get("ContentBasedDeduplication") != "true":
                raise e.invalid_parameter_value(
                    "The queue should either have ContentBasedDeduplication enabled or "
                    "MessageDeduplicationId provided explicitly"
                )
            dedup_id = content_id(entry["MessageBody"])
        properties[PROPERTY_GROUP] = group
        properties[PROPERTY_DEDUP] = dedup_id
        return SqsMessage(entry["MessageBody"], properties, None, keys=[group], order_key=group)

    @staticmethod
    def _sent(entry: dict[str, Any], message_id: str, sequence: str | None = None) -> dict[str, Any]:
        sent: dict[str, Any] = {"MessageId": message_id}
        if sequence is not None:
            sent["SequenceNumber"] = sequence
        sent["MD5OfMessageBody"] = md5_of_body(entry["MessageBody"])
        attributes = entry.get("MessageAttributes")
        sent["MD5OfMessageAttributes"] = md5_of_message_attributes(attributes) if attributes else None
        attributes = entry.get("MessageSystemAttributes")
        sent["MD5OfMessageSystemAttributes"] = (
            md5_of_message_system_attributes(attributes) if attributes else None
        )
        return sent

    async def send_message(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        url = request.params["QueueUrl"]
        q = self._kept_at(caller, url)
        if q is None:
            q = await self._queue_at(caller, url)
        message = self._message(q, request.params, caller)
        if q.fifo:
            ((_, answer),) = await self._send_fifo(q, [(request.params, message)])
            return answer
        producer = self._kept_producer(q)
        if producer is None:
            producer = await self._producer(q)
        receipts = await self.gw.producing.produce(producer, [message])
        return self._sent(request.params, receipts[0].msg_id)

    async def _send_fifo(
        self, q: Queue, sending: list[tuple[dict[str, Any], SqsMessage]]
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Send to a FIFO queue: an id seen in the last five minutes (in this call too) is
        answered as its first send was, and not stored again."""
        topic = q.topic.name
        scope = q.row.attributes.get("DeduplicationScope", SCOPE_QUEUE)
        async with self.dedup.turn(topic):
            now = now_ms()
            await self.dedup.catch_up(topic, scope, now)
            keys = [
                dedup_key(scope, m.properties[PROPERTY_GROUP], m.properties[PROPERTY_DEDUP])
                for _, m in sending
            ]
            fresh: dict[str, int] = {}  # key → index of the entry that sends it
            for i, key in enumerate(keys):
                if self.dedup.seen(topic, key, now) is None and key not in fresh:
                    fresh[key] = i
            if fresh:
                chosen = list(fresh.values())
                receipts = await self.gw.producing.produce(
                    await self._producer(q), [sending[i][1] for i in chosen]
                )
                for i, r in zip(chosen, receipts, strict=True):
                    sent = Sent(r.msg_id, sequence_number(r.queue, r.offset), now)
                    self.dedup.record(topic, keys[i], sent, r.queue, r.offset)
            out: list[tuple[dict[str, Any], dict[str, Any]]] = []
            for (entry, _), key in zip(sending, keys, strict=True):
                sent_before = self.dedup.seen(topic, key, now)
                assert sent_before is not None
                out.append((entry, self._sent(entry, sent_before.msg_id, sent_before.sequence)))
            return out

    async def send_message_batch(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        failed: list[dict[str, Any]] = []
        sending: list[tuple[dict[str, Any], SqsMessage]] = []
        for entry in request.params["Entries"]:
            problem = request.entry_errors.get(entry["Id"])
            if problem is None:
                try:
                    sending.append((entry, self._message(q, entry, caller)))
                    continue
                except SqsError as exc:
                    problem = exc
            failed.append(_failed(entry["Id"], problem))
        successful: list[dict[str, Any]] = []
        if sending and q.fifo:
            for entry, answer in await self._send_fifo(q, sending):
                successful.append({"Id": entry["Id"], **answer})
        elif sending:
            receipts = await self.gw.producing.produce(await self._producer(q), [m for _, m in sending])
            for (entry, _), receipt in zip(sending, receipts, strict=True):
                successful.append({"Id": entry["Id"], **self._sent(entry, receipt.msg_id)})
        return {"Successful": successful, "Failed": failed}

    async def receive_message(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        q = await self._queue_at(caller, p["QueueUrl"])
        wait = p.get("WaitTimeSeconds")
        if wait is None:
            wait = int(q.row.attributes.get("ReceiveMessageWaitTimeSeconds", 0))
        visibility = p.get("VisibilityTimeout")
        got = await self.gw.messages.receive(
            q.consumer,
            max_count=p.get("MaxNumberOfMessages", DEFAULT_RECEIVE_COUNT),
            wait_s=float(wait),
            visibility_s=None if visibility is None else float(visibility),
            ordered=q.fifo,
            request_id=request.request_id,
        )
        system = set(p.get("AttributeNames", [])) | set(p.get("MessageSystemAttributeNames", []))
        names = p.get("MessageAttributeNames", [])
        messages = [_received(d, system, names) for d in got]
        return {"Messages": messages} if messages else {}

    async def _handle_outcome(self, q: Queue, handle: str, seconds: int | None) -> None:
        """Delete (`seconds` None) or change the visibility of the message a receipt names."""
        messages = self.gw.messages
        try:
            if seconds is None:
                outcome = await messages.delete(q.consumer, handle)  # a stale receipt is success, as AWS
                if q.fifo and outcome == "deleted":  # its group may go on: a waiting receive takes it
                    self.gw.ctx.store.wake(q.topic.name, consumer=q.consumer.name, count=1)
                return
            outcome = await messages.change_visibility(q.consumer, handle, float(seconds))
        except SqsError:
            raise
        except MqgateError as exc:
            if exc.http_status in (400, 403, 404):  # malformed, forged, another queue's
                raise _receipt_invalid(handle) from exc
            raise
        if outcome == "not_in_flight":
            raise SqsError(e.MESSAGE_NOT_INFLIGHT, "The message referred to isn't in flight.")
        if outcome != "changed":
            raise e.invalid_value_for(
                "ReceiptHandle",
                handle[:200],
                "Message does not exist or is not available for visibility timeout change.",
            )

    async def delete_message(self, request: SqsRequest, caller: Caller) -> None:
        q = await self._queue_at(caller, request.params["QueueUrl"])
        await self._handle_outcome(q, request.params["ReceiptHandle"], None)

    async def change_visibility(self, request: SqsRequest, caller: Caller) -> None:
        p = request.params
        q = await self._queue_at(caller, p["QueueUrl"])
        await self._handle_outcome(q, p["ReceiptHandle"], p["VisibilityTimeout"])

    async def _batch(self, request: SqsRequest, caller: Caller, visibility: bool) -> dict[str, Any]:
        q = await self._queue_at(caller, request.params["QueueUrl"])

        async def settle(entry: dict[str, Any]) -> SqsError | None:
            problem = request.entry_errors.get(entry["Id"])
            if problem is None and visibility and entry.get("VisibilityTimeout") is None:
                problem = e.missing_parameter("VisibilityTimeout")
            if problem is not None:
                return problem
            try:
                await self._handle_outcome(
                    q, entry["ReceiptHandle"], entry["VisibilityTimeout"] if visibility else None
                )
            except SqsError as exc:
                return exc
            return None

        # Together: the entries share the store's durable writes (one group commit for the batch).
        entries = request.params["Entries"]
        problems = await asyncio.gather(*(settle(entry) for entry in entries))
        successful = [{"Id": entry["Id"]} for entry, p in zip(entries, problems, strict=True) if p is None]
        failed = [
            _failed(entry["Id"], p) for entry, p in zip(entries, problems, strict=True) if p is not None
        ]
        return {"Successful": successful, "Failed": failed}

    async def delete_message_batch(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        return await self._batch(request, caller, visibility=False)

    async def change_visibility_batch(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        return await self._batch(request, caller, visibility=True)

    # --- dead-letter queues and move tasks (redrive.py) ---------------------------------------

    def _arn(self, caller: Caller, name: str) -> str:
        return f"arn:aws:sqs:{caller.region or DEFAULT_REGION}:{caller.key.account}:{name}"

    async def _sources_of(self, caller: Caller, dlq: str) -> list[str]:
        """The account's queues whose redrive policy names `dlq`, by name."""
        registry = self.gw.ctx.registry
        stem = topic_of(caller.key.account, "")
        names: list[str] = []
        for t in registry.topics_in(caller.key.project):
            consumer = registry.consumer(t.name + CONSUMER_SUFFIX)
            if not t.name.startswith(stem) or consumer is None:
                continue
            q = Queue(t.name[len(stem) :], t, consumer, await self._row(t))
            policy = self._redrive(q)
            if policy is not None and policy.target == dlq:
                names.append(q.name)
        return sorted(names)

    async def list_dead_letter_source_queues(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        q = await self._queue_at(caller, p["QueueUrl"])
        names = await self._sources_of(caller, q.name)
        return self._url_page(caller, p, names, "queueUrls")

    async def _queue_of_arn(self, caller: Caller, arn: str, member: str) -> Queue:
        name = queue_of_arn(arn, caller.key.account)
        if name is None:
            raise e.invalid_value_for(member, arn, "The resource that you specified does not exist.")
        try:
            return await self._queue(caller, name)
        except SqsError:
            raise SqsError(e.RESOURCE_NOT_FOUND, "The resource that you specified for the "
                           f"{member} parameter doesn't exist.") from None  # fmt: skip

    async def start_message_move_task(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        source = await self._queue_of_arn(caller, p["SourceArn"], "SourceArn")
        if not await self._sources_of(caller, source.name):
            raise e.invalid_parameter_value("Source queue must be configured as a Dead Letter Queue.")
        destination: Queue | None = None
        if p.get("DestinationArn"):
            destination = await self._queue_of_arn(caller, p["DestinationArn"], "DestinationArn")
            if destination.name == source.name:
                raise e.invalid_parameter_value("The destination queue cannot be the source queue.")
        visible, _ = await self._counts(source)
        task = new_task(
            source.name,
            p["SourceArn"],
            destination.name if destination is not None else None,
            p.get("DestinationArn"),
            p.get("MaxNumberOfMessagesPerSecond"),
            visible,
            now_ms(),
        )
        self.move_tasks.start(source.topic.name, task, self._move_step(caller, source, destination))
        return {"TaskHandle": task.handle}

    def _move_step(
        self, caller: Caller, source: Queue, destination: Queue | None
    ) -> Callable[[MoveTask, int], Awaitable[int]]:
        async def step(task: MoveTask, want: int) -> int:
            got = await self.gw.messages.receive(source.consumer, max_count=want, wait_s=0.0)
            if not got:
                return 0
            stem = topic_of(caller.key.account, "")
            for d in got:
                back = d.message.properties.get("dlq.topic", "")
                if destination is not None:
                    to = destination.topic.name
                elif back.startswith(stem):
                    to = back
                else:
                    raise e.invalid_parameter_value(
                        f"Message {d.message.msg_id} has no source queue of this account to go back to."
                    )
                topic = self.gw.ctx.registry.topic(to)
                if topic is None or topic.project != caller.key.project:
                    raise e.invalid_parameter_value(
                        f"The queue {to[len(stem) :]} to move messages to does not exist."
                    )
                producer = await self.gw.topology.producer(to + PRODUCER_SUFFIX)
                m = d.message
                properties = {k: v for k, v in m.properties.items() if not k.startswith(("dlq.", "mq."))}
                moved = SqsMessage(
                    m.body, properties, None, keys=list(m.keys), order_key=m.keys[0] if m.keys else None
                )
                await self.gw.producing.produce(producer, [moved])
                await self.gw.messages.delete(source.consumer, d.receipt)  # only once sent on
            return len(got)

        return step

    async def list_message_move_tasks(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        p = request.params
        source = await self._queue_of_arn(caller, p["SourceArn"], "SourceArn")
        tasks = self.move_tasks.listed(source.topic.name, p.get("MaxResults") or 1)
        return {"Results": [t.entry() for t in tasks]}

    async def cancel_message_move_task(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        task = self.move_tasks.find(request.params["TaskHandle"])
        if queue_of_arn(task.source_arn, caller.key.account) is None:
            raise SqsError(e.RESOURCE_NOT_FOUND, "Task does not exist.")  # another account's
        task = await self.move_tasks.cancel(task.handle)
        return {"ApproximateNumberOfMessagesMoved": task.moved}

    async def get_caller_identity(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = caller.key
        return {
            "UserId": key.access_key_id,
            "Account": key.account,
            "Arn": f"arn:aws:iam::{key.account}:user/{key.name}",
        }


def _failed(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.sender_fault,
        "Code": error.query_code,
        "Message": error.message,
    }


def _wanted(name: str, names: list[str]) -> bool:
    for asked in names:
        if asked in ("All", ".*") or asked == name:
            return True
        if asked.endswith(".*") and name.startswith(asked[:-1]):
            return True
    return False


def _received(d: Delivery, system: set[str], names: list[str]) -> dict[str, Any]:
    m: StoredMessage = d.message
    attributes: dict[str, dict[str, Any]] = {}
    system_values: dict[str, str] = {
        "SenderId": m.properties.get(PROPERTY_SENDER, m.producer),
        "SentTimestamp": str(m.timestamp_ms),
        "ApproximateReceiveCount": str(d.receives),
        "ApproximateFirstReceiveTimestamp": str(d.first_ms),
    }
    if PROPERTY_GROUP in m.properties:  # a FIFO queue's
        system_values["MessageGroupId"] = m.properties[PROPERTY_GROUP]
        system_values["MessageDeduplicationId"] = m.properties.get(PROPERTY_DEDUP, "")
        system_values["SequenceNumber"] = sequence_number(d.queue, d.offset)
    for key, text in m.properties.items():
        if key.startswith(PROPERTY_ATTR):
            value = _attr_of(text)
            if value is not None and _wanted(key[len(PROPERTY_ATTR) :], names):
                attributes[key[len(PROPERTY_ATTR) :]] = value
        elif key.startswith(PROPERTY_SYSTEM_ATTR):
            value = _attr_of(text)
            if value is not None and value.get("StringValue") is not None:
                system_values[key[len(PROPERTY_SYSTEM_ATTR) :]] = value["StringValue"]
        elif (
            not key.startswith(_INTERNAL_PROPERTIES)
            and _NATIVE_ATTRIBUTE_NAME.fullmatch(key)
            and text
            and _wanted(key, names)
        ):
            # A message produced through the native API: its properties as String attributes.
            attributes[key] = {"DataType": "String", "StringValue": text}
    every = "All" in system
    out: dict[str, Any] = {
        "MessageId": m.msg_id,
        "ReceiptHandle": d.receipt,
        "MD5OfBody": md5_of_body(m.body),
        "Body": m.body,
    }
    chosen = {k: v for k, v in system_values.items() if every or k in system}
    if chosen:
        out["Attributes"] = chosen
    if attributes:
        out["MessageAttributes"] = attributes
        out["MD5OfMessageAttributes"] = md5_of_message_attributes(attributes)
    return out
