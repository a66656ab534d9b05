"""SQS requests off the wire, in either protocol SQS speaks, as one normalized shape (issue 30).

Current AWS SDKs (boto3 and botocore 1.34 on, the AWS CLI, JS v3, Java v2, Go v2) speak the AWS
JSON 1.0 protocol: `POST /`, `X-Amz-Target: AmazonSQS.<Action>`, a JSON body of the action's input
members. Older SDKs speak the query protocol: form fields `Action=…&Version=2012-11-05&…`, in the
body or the query string, lists and maps flattened into numbered fields (`Attribute.1.Name`,
`MessageAttribute.1.Value.StringValue`, `SendMessageBatchRequestEntry.2.Id`). `decode_request`
reads either into the JSON protocol's member names and types, so the service sees one shape:

- strings as `str`, integers as `int`, booleans as `bool`, blobs (`BinaryValue`) as `bytes`;
- lists as `list` (`AttributeNames`, `MessageAttributeNames`, `MessageSystemAttributeNames`,
  `TagKeys`, batch `Entries` as a list of dicts);
- maps as `dict` (`Attributes`: name → str; `MessageAttributes`: name → {"DataType": str,
  "StringValue": str | "BinaryValue": bytes | "StringListValues" | "BinaryListValues"};
  `MessageSystemAttributes` alike; `Tags` / CreateQueue's `tags`: key → value);
- members absent from the request absent from `params` (a JSON `null` is absent too).

It checks what AWS checks before looking at a queue, with AWS's errors (`errors.py`): the action,
each member's type, the required members, the batch rules (1 to 10 entries, ids of 1 to 80 of
`[A-Za-z0-9_-]`, distinct, a batch within `MAX_BATCH_BYTES`), each message (a body of allowed
characters within `MAX_MESSAGE_BYTES` with its attributes, at most `MAX_MESSAGE_ATTRIBUTES`
attributes of valid names and types, a delay within 0 to 900 s) and the ranges of the numbers.
A batch entry that breaks a per-message rule does not fail the batch: AWS answers it in the
batch's `Failed` list, so its error is left in `SqsRequest.entry_errors` by entry id.

STS `GetCallerIdentity` (query protocol only, as STS speaks) is read here too: SDKs call it to
learn the account behind a key, at the endpoint they were given.

Nothing here raises anything but `SqsError`; everything is bounded by the constants below.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal
from urllib.parse import parse_qsl

import msgspec

from mqgate.sqs import errors as e
from mqgate.sqs.detect import JSON_TARGET_PREFIX
from mqgate.sqs.errors import SqsError

Protocol = Literal["json", "query"]

# --- limits (AWS's, where AWS has one) ---------------------------------------------------------
# AWS raised SQS's largest message from 256 KiB (262,144 bytes) to 1 MiB in August 2025: a message
# (its body and its attributes) and a whole batch are both within it.
MAX_MESSAGE_BYTES: Final = 1_048_576
MAX_BATCH_BYTES: Final = 1_048_576
MAX_BATCH_ENTRIES: Final = 10
MAX_BATCH_ENTRY_ID_CHARS: Final = 80
MAX_MESSAGE_ATTRIBUTES: Final = 10
MAX_ATTRIBUTE_NAME_CHARS: Final = 256
MAX_DATA_TYPE_CHARS: Final = 256
MAX_NUMBER_DIGITS: Final = 38  # a Number attribute's precision
MAX_DELAY_S: Final = 900
MAX_VISIBILITY_TIMEOUT_S: Final = 43_200  # 12 hours
MAX_WAIT_TIME_S: Final = 20
MAX_RECEIVE_MESSAGES: Final = 10
MAX_LIST_QUEUES_RESULTS: Final = 1000
MAX_MOVE_TASKS_RESULTS: Final = 10
MAX_MOVE_RATE_PER_S: Final = 500
MAX_TAGS: Final = 50
MAX_QUEUE_NAME_CHARS: Final = 80
MAX_DEDUP_ID_CHARS: Final = 128  # MessageDeduplicationId, MessageGroupId, ReceiveRequestAttemptId
# The request body: a 1 MiB batch grows on the wire (a form's %XX triples non-ASCII bytes, JSON's
# escapes and base64 grow it too), so the body may be a few times the message limit, no more.
MAX_REQUEST_BYTES: Final = 3 * MAX_MESSAGE_BYTES + 64 * 1024
MAX_FORM_FIELDS: Final = 2000  # 10 entries x (10 attributes x 4 fields + their own): about 500
MAX_FIELD_NAME_SEGMENTS: Final = 6  # SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.X
MAX_INT32: Final = 2**31 - 1
MAX_INT64: Final = 2**63 - 1

SQS_API_VERSION: Final = "2012-11-05"
STS_API_VERSION: Final = "2011-06-15"
JSON_CONTENT_TYPE: Final = "application/x-amz-json-1.0"


# --- the input shapes --------------------------------------------------------------------------
class Scalar(msgspec.Struct, frozen=True):
    kind: Literal["string", "integer", "long", "boolean", "blob"]


class ListOf(msgspec.Struct, frozen=True):
    member: Shape
    # The query protocol's name of each item of a flattened list: it replaces the member's own
    # name (`AttributeNames` → `AttributeName.1`); None keeps the member's name.
    query_item: str | None = None


class MapOf(msgspec.Struct, frozen=True):
    value: Shape
    query_key: str = "Name"
    query_value: str = "Value"


class Member(msgspec.Struct, frozen=True):
    shape: Shape
    required: bool = False
    query_name: str | None = None  # the query protocol's name, when not the JSON one


class Struct(msgspec.Struct, frozen=True):
    members: dict[str, Member]


Shape = Scalar | ListOf | MapOf | Struct

STRING: Final = Scalar("string")
INTEGER: Final = Scalar("integer")
LONG: Final = Scalar("long")
BOOLEAN: Final = Scalar("boolean")
BLOB: Final = Scalar("blob")


def _m(shape: Shape, query_name: str | None = None) -> Member:
    return Member(shape, False, query_name)


def _req(shape: Shape, query_name: str | None = None) -> Member:
    return Member(shape, True, query_name)


ATTRIBUTE_VALUE: Final = Struct(
    {
        "StringValue": _m(STRING),
        "BinaryValue": _m(BLOB),
        "StringListValues": _m(ListOf(STRING, "StringListValue")),
        "BinaryListValues": _m(ListOf(BLOB, "BinaryListValue")),
        "DataType": _req(STRING),
    }
)
MESSAGE_ATTRIBUTES: Final = MapOf(ATTRIBUTE_VALUE)
STRING_MAP: Final = MapOf(STRING)
TAG_MAP: Final = MapOf(STRING, "Key", "Value")


def _message_members() -> dict[str, Member]:
    return {
        "DelaySeconds": _m(INTEGER),
        "MessageAttributes": _m(MESSAGE_ATTRIBUTES, "MessageAttribute"),
        "MessageSystemAttributes": _m(MESSAGE_ATTRIBUTES, "MessageSystemAttribute"),
        "MessageDeduplicationId": _m(STRING),
        "MessageGroupId": _m(STRING),
    }


def _batch(entry_name: str, entry: dict[str, Member]) -> Struct:
    return Struct({"QueueUrl": _req(STRING), "Entries": _req(ListOf(Struct(entry), entry_name))})


QUEUE_URL_ONLY: Final = Struct({"QueueUrl": _req(STRING)})

INPUTS: Final[dict[str, Struct]] = {
    "CreateQueue": Struct(
        {
            "QueueName": _req(STRING),
            "Attributes": _m(STRING_MAP, "Attribute"),
            "tags": _m(TAG_MAP, "Tag"),
        }
    ),
    "GetQueueUrl": Struct({"QueueName": _req(STRING), "QueueOwnerAWSAccountId": _m(STRING)}),
    "ListQueues": Struct({"QueueNamePrefix": _m(STRING), "NextToken": _m(STRING), "MaxResults": _m(INTEGER)}),
    "DeleteQueue": QUEUE_URL_ONLY,
    "PurgeQueue": QUEUE_URL_ONLY,
    "GetQueueAttributes": Struct(
        {"QueueUrl": _req(STRING), "AttributeNames": _m(ListOf(STRING, "AttributeName"))}
    ),
    "SetQueueAttributes": Struct({"QueueUrl": _req(STRING), "Attributes": _req(STRING_MAP, "Attribute")}),
    "TagQueue": Struct({"QueueUrl": _req(STRING), "Tags": _req(TAG_MAP, "Tag")}),
    "UntagQueue": Struct({"QueueUrl": _req(STRING), "TagKeys": _req(ListOf(STRING, "TagKey"))}),
    "ListQueueTags": QUEUE_URL_ONLY,
    "SendMessage": Struct({"QueueUrl": _req(STRING), "MessageBody": _req(STRING), **_message_members()}),
    "SendMessageBatch": _batch(
        "SendMessageBatchRequestEntry",
        {"Id": _req(STRING), "MessageBody": _req(STRING), **_message_members()},
    ),
    "ReceiveMessage": Struct(
        {
            "QueueUrl": _req(STRING),
            "AttributeNames": _m(ListOf(STRING, "AttributeName")),
            "MessageSystemAttributeNames": _m(ListOf(STRING, "MessageSystemAttributeName")),
            "MessageAttributeNames": _m(ListOf(STRING, "MessageAttributeName")),
            "MaxNumberOfMessages": _m(INTEGER),
            "VisibilityTimeout": _m(INTEGER),
            "WaitTimeSeconds": _m(INTEGER),
            "ReceiveRequestAttemptId": _m(STRING),
        }
    ),
    "DeleteMessage": Struct({"QueueUrl": _req(STRING), "ReceiptHandle": _req(STRING)}),
    "DeleteMessageBatch": _batch(
        "DeleteMessageBatchRequestEntry", {"Id": _req(STRING), "ReceiptHandle": _req(STRING)}
    ),
    "ChangeMessageVisibility": Struct(
        {"QueueUrl": _req(STRING), "ReceiptHandle": _req(STRING), "VisibilityTimeout": _req(INTEGER)}
    ),
    "ChangeMessageVisibilityBatch": _batch(
        "ChangeMessageVisibilityBatchRequestEntry",
        {"Id": _req(STRING), "ReceiptHandle": _req(STRING), "VisibilityTimeout": _m(INTEGER)},
    ),
    "ListDeadLetterSourceQueues": Struct(
        {"QueueUrl": _req(STRING), "NextToken": _m(STRING), "MaxResults": _m(INTEGER)}
    ),
    "StartMessageMoveTask": Struct(
        {"SourceArn": _req(STRING), "DestinationArn": _m(STRING), "MaxNumberOfMessagesPerSecond": _m(INTEGER)}
    ),
    "ListMessageMoveTasks": Struct({"SourceArn": _req(STRING), "MaxResults": _m(INTEGER)}),
    "CancelMessageMoveTask": Struct({"TaskHandle": _req(STRING)}),
}
STS_INPUTS: Final[dict[str, Struct]] = {"GetCallerIdentity": Struct({})}
BATCH_ACTIONS: Final = frozenset({"SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"})

# The queue attributes GetQueueAttributes names (QueueAttributeName in the service model) and
# those CreateQueue and SetQueueAttributes take (the others are read-only).
QUEUE_ATTRIBUTE_NAMES: Final = frozenset(
    {
        "All", "Policy", "VisibilityTimeout", "MaximumMessageSize", "MessageRetentionPeriod",
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "CreatedTimestamp",
        "LastModifiedTimestamp", "QueueArn", "ApproximateNumberOfMessagesDelayed", "DelaySeconds",
        "ReceiveMessageWaitTimeSeconds", "RedrivePolicy", "FifoQueue", "ContentBasedDeduplication",
        "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "DeduplicationScope", "FifoThroughputLimit",
        "RedriveAllowPolicy", "SqsManagedSseEnabled",
    }
)  # fmt: skip
SETTABLE_QUEUE_ATTRIBUTES: Final = frozenset(
    {
        "DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod", "Policy",
        "ReceiveMessageWaitTimeSeconds", "VisibilityTimeout", "RedrivePolicy", "RedriveAllowPolicy",
        "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled", "FifoQueue",
        "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit",
    }
)  # fmt: skip
MESSAGE_SYSTEM_ATTRIBUTE_NAMES: Final = frozenset(
    {
        "All", "SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
        "SequenceNumber", "MessageDeduplicationId", "MessageGroupId", "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    }
)  # fmt: skip
SENDABLE_SYSTEM_ATTRIBUTES: Final = frozenset({"AWSTraceHeader"})

_ENTRY_ID: Final = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_BATCH_ENTRY_ID_CHARS}}}")
_QUEUE_NAME: Final = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_QUEUE_NAME_CHARS}}}")
_ATTRIBUTE_NAME: Final = re.compile(r"[A-Za-z0-9_.-]+")
_DATA_TYPE: Final = re.compile(r"(String|Number|Binary)(\..+)?", re.DOTALL)
_NUMBER: Final = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGER_TEXT: Final = re.compile(r"[+-]?\d{1,20}")
# What SQS accepts in a message: #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF.
_FORBIDDEN_CHAR: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DEDUP_ID: Final = re.compile(rf"[!-~]{{1,{MAX_DEDUP_ID_CHARS}}}")
_ALLOWED_CHARS: Final = "#x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF"


class SqsRequest(msgspec.Struct):
    action: str
    params: dict[str, Any]
    protocol: Protocol
    service: Literal["sqs", "sts"] = "sqs"
    request_id: str = msgspec.field(default_factory=lambda: new_request_id())
    # Batch entries AWS answers as failed while the rest of the batch goes on: id → error.
    entry_errors: dict[str, SqsError] = msgspec.field(default_factory=dict)


class _RequestIds:
    """Request ids shaped like random (version 4) UUIDs, unique without asking the OS for
    randomness per request: 122 random bits drawn per process (and again in a forked child),
    the low 62 of them advanced by a counter. Two processes share no prefix but by chance
    (1 in 2^60); one process repeats an id only after 2^62 requests."""

    __slots__ = ("count", "low", "prefix")

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        bits = int.from_bytes(os.urandom(16), "big")
        high = (bits >> 64) & ~(0xF << 12) | (0x4 << 12)  # the version nibble: 4
        self.prefix = f"{high >> 32:08x}-{(high >> 16) & 0xFFFF:04x}-{high & 0xFFFF:04x}-"
        self.low = bits & (2**62 - 1)
        self.count = itertools.count()

    def next(self) -> str:
        low = (self.low + next(self.count)) & (2**62 - 1) | (0b10 << 62)  # the variant: RFC 4122
        text = f"{low:016x}"
        return f"{self.prefix}{text[:4]}-{text[4:]}"


_REQUEST_IDS: Final = _RequestIds()
os.register_at_fork(after_in_child=_REQUEST_IDS.reseed)


def new_request_id() -> str:
    """A request id: unique, in a UUID's form (`x-amzn-RequestId`, `<RequestId>`)."""
    return _REQUEST_IDS.next()


# The only headers the decoder reads, and the one prefix of a JSON content type.
_WANTED_HEADERS: Final = frozenset({"x-amz-target", "content-type", "host"})
_WANTED_HEADER_BYTES: Final = {name.encode(): name for name in _WANTED_HEADERS}
_JSON_CONTENT_PREFIX: Final = "application/x-amz-json"


class _HeaderMap(dict[str, str]):
    """What `_header_map` made: read again as it is."""

    __slots__ = ()


def _header_map(headers: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[str, str]:
    """The headers the decoder reads (`_WANTED_HEADERS`), by lower-case name, as text; a name
    given twice in different cases: the last one."""
    if type(headers) is _HeaderMap:
        return headers
    out = _HeaderMap()
    wanted = _WANTED_HEADER_BYTES
    for key, value in headers.items():
        if isinstance(key, bytes):
            name = wanted.get(key)
            if name is None:
                name = wanted.get(key.lower())
                if name is None:
                    continue
        else:
            name = key.lower()
            if name not in _WANTED_HEADERS:
                continue
        out[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    return out


def detect_protocol(headers: Mapping[bytes, bytes] | Mapping[str, str]) -> Protocol:
    """The protocol a request speaks, from its headers alone (so an error can be answered in it
    even when the body cannot be read)."""
    return _protocol_of(_header_map(headers))


def read_headers(headers: Mapping[bytes, bytes] | Mapping[str, str]) -> tuple[dict[str, str], Protocol]:
    """The headers the decoder reads, as text by lower-case name (`decode_request` takes them in
    place of all the request's headers, and reads them the same), and the protocol they tell."""
    h = _header_map(headers)
    return h, _protocol_of(h)


def read_asgi_headers(headers: Mapping[bytes, bytes]) -> tuple[dict[str, str], Protocol]:
    """`read_headers` of an ASGI request's headers (their names are lower case: the three are
    taken, not looked for)."""
    out = _HeaderMap()
    for raw, name in _WANTED_HEADER_BYTES.items():
        value = headers.get(raw)
        if value is not None:
            out[name] = value.decode("latin-1")
    return out, _protocol_of(out)


def _protocol_of(h: dict[str, str]) -> Protocol:
    if "x-amz-target" in h or h.get("content-type", "").lower().startswith(_JSON_CONTENT_PREFIX):
        return "json"
    return "query"


def decode_request(
    method: str,
    path: str,
    query_string: bytes | str,
    headers: Mapping[bytes, bytes] | Mapping[str, str],
    body: bytes,
) -> SqsRequest:
    """The request as an action and its normalized params; `SqsError` when AWS would refuse it."""
    h = _header_map(headers)
    if len(body) > MAX_REQUEST_BYTES:
        raise e.invalid_parameter_value(f"The request body must be at most {MAX_REQUEST_BYTES} bytes.")
    if _protocol_of(h) == "json":
        action, params = _decode_json(method, h, body)
        request = SqsRequest(action, params, "json")
    else:
        request = _decode_query(method, path, query_string, h, body)
    if request.service == "sqs":
        _check(request)
    return request


# --- JSON ----------------------------------------------------------------------------------------
def _decode_json(method: str, h: dict[str, str], body: bytes) -> tuple[str, dict[str, Any]]:
    target = h.get("x-amz-target", "")
    action = target[len(JSON_TARGET_PREFIX) :] if target.startswith(JSON_TARGET_PREFIX) else ""
    shape = INPUTS.get(action)
    if shape is None or method.upper() != "POST":
        raise SqsError(e.INVALID_ACTION, f"The action or operation {target or '(none)'} is not supported.")
    if action == "SendMessage":
        plain = _plain_send(body)
        if plain is not None:
            return action, plain
    try:
        document = msgspec.json.decode(body) if body.strip() else {}
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise SqsError(e.SERIALIZATION, "The request body is not valid JSON.") from exc
    if not isinstance(document, dict):
        raise SqsError(e.SERIALIZATION, "The request body must be a JSON object.")
    return action, _json_struct(shape, document, "")


class _PlainSend(msgspec.Struct, forbid_unknown_fields=True):
    """A SendMessage of the plain, most frequent kind: no attributes, every member of its
    type. Whatever does not decode as this is read by `_json_struct`, which says why."""

    QueueUrl: str
    MessageBody: str
    DelaySeconds: Annotated[int, msgspec.Meta(ge=-MAX_INT32 - 1, le=MAX_INT32)] | None = None
    MessageDeduplicationId: str | None = None
    MessageGroupId: str | None = None


_PLAIN_SEND: Final = msgspec.json.Decoder(_PlainSend)


def _plain_send(body: bytes) -> dict[str, Any] | None:
    """SendMessage's params as `_json_struct` reads them, for a plain send; None otherwise."""
    try:
        plain = _PLAIN_SEND.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    params: dict[str, Any] = {"QueueUrl": plain.QueueUrl, "MessageBody": plain.MessageBody}
    if plain.DelaySeconds is not None:
        params["DelaySeconds"] = plain.DelaySeconds
    if plain.MessageDeduplicationId is not None:
        params["MessageDeduplicationId"] = plain.MessageDeduplicationId
    if plain.MessageGroupId is not None:
        params["MessageGroupId"] = plain.MessageGroupId
    return params


def _json_struct(shape: Struct, value: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, member in shape.members.items():
        raw = value.get(name)
        if raw is None:
            if member.required:
                raise e.missing_parameter(where + name)
            continue
        out[name] = _json_value(member.shape, raw, where + name)
    return out


def _json_value(shape: Shape, raw: Any, where: str) -> Any:
    if isinstance(shape, Scalar):
        return _json_scalar(shape, raw, where)
    if isinstance(shape, Struct):
        if not isinstance(raw, dict):
            raise _json_type(where, "a structure")
        return _json_struct(shape, raw, where + ".")
    if isinstance(shape, ListOf):
        if not isinstance(raw, list):
            raise _json_type(where, "a list")
        return [_json_value(shape.member, item, f"{where}.{i}") for i, item in enumerate(raw, 1)]
    if not isinstance(raw, dict):
        raise _json_type(where, "a map")
    return {key: _json_value(shape.value, item, f"{where}.{key}") for key, item in raw.items()}


def _json_scalar(shape: Scalar, raw: Any, where: str) -> Any:
    kind = shape.kind
    if kind == "string":
        if not isinstance(raw, str):
            raise _json_type(where, "a string")
        return raw
    if kind == "boolean":
        if not isinstance(raw, bool):
            raise _json_type(where, "a boolean")
        return raw
    if kind == "blob":
        if not isinstance(raw, str):
            raise _json_type(where, "a base64 string")
        return _base64(raw, where)
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise _json_type(where, "an integer")
    limit = MAX_INT32 if kind == "integer" else MAX_INT64
    if not -limit - 1 <= raw <= limit:
        raise _json_type(where, f"an integer of {32 if kind == 'integer' else 64} bits")
    return raw


def _json_type(where: str, what: str) -> SqsError:
    return SqsError(e.SERIALIZATION, f"{where} must be {what}.")


def _base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise e.invalid_value_for(where, "(binary)", "Not valid base64.") from exc


# --- query -----------------------------------------------------------------------------------
class _Node:
    """The form's fields as a tree of their dotted names: `A.1.Name` is A → 1 → Name."""

    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.value: str | None = None
        self.children: dict[str, _Node] = {}


def _decode_query(
    method: str, path: str, query_string: bytes | str, h: dict[str, str], body: bytes
) -> SqsRequest:
    if method.upper() not in ("GET", "POST"):
        raise SqsError(e.INVALID_ACTION, f"The HTTP method {method} is not supported.")
    fields = _form_fields(query_string)
    if body and method.upper() == "POST":
        fields += _form_fields(body)
    if len(fields) > MAX_FORM_FIELDS:
        raise e.invalid_parameter_value(f"A request may carry at most {MAX_FORM_FIELDS} parameters.")
    flat = dict(fields)  # a field given twice: the last one, as AWS's form reader keeps it
    action = flat.get("Action", "")
    if not action:
        raise SqsError(e.MISSING_ACTION, "The request must contain the parameter Action.")
    service: Literal["sqs", "sts"] = "sqs"
    shape = INPUTS.get(action)
    if shape is None:
        shape = STS_INPUTS.get(action)
        service = "sts"
    if shape is None:
        raise SqsError(e.INVALID_ACTION, f"The action {action} is not valid for this endpoint.")
    root = _Node()
    for name, value in flat.items():
        parts = name.split(".")
        if len(parts) > MAX_FIELD_NAME_SEGMENTS:
            continue  # deeper than any member: a field SQS does not read, ignored as AWS does
        node = root
        for part in parts:
            node = node.children.setdefault(part, _Node())
        node.value = value
    if service == "sqs" and "QueueUrl" in shape.members and "QueueUrl" not in root.children:
        # Older SDKs (Java v1) post to the queue's URL and leave QueueUrl out of the form.
        queue_path = path.strip("/")
        if queue_path:
            host = h.get("host", "")
            queue_url = f"http://{host}/{queue_path}" if host else f"/{queue_path}"
            root.children.setdefault("QueueUrl", _Node()).value = queue_url
    params = _query_struct(shape, root, "")
    return SqsRequest(action, params, "query", service)


def _form_fields(raw: bytes | str) -> list[tuple[str, str]]:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return parse_qsl(
            text, keep_blank_values=True, strict_parsing=False, encoding="utf-8", errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )  # fmt: skip
    except (UnicodeDecodeError, ValueError) as exc:
        raise e.invalid_parameter_value("The request's parameters are not valid form encoding.") from exc


def _query_struct(shape: Struct, node: _Node, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, member in shape.members.items():
        qname = member.query_name or name
        value = _query_member(member.shape, node, qname, name, where)
        if value is None:
            if member.required:
                raise e.missing_parameter(where + qname)
            continue
        out[name] = value
    return out


def _query_member(shape: Shape, node: _Node, qname: str, name: str, where: str) -> Any:
    if isinstance(shape, ListOf):
        # A flattened list's items are named by the list's item name (`AttributeName.1`); the
        # member's own name is read too, as SDKs without the item name send it (and an empty
        # list is sent as `Entries=`).
        for key in (shape.query_item, qname, name):
            if key is not None and key in node.children:
                return _query_list(shape, node.children[key], where + key)
        return None
    child = node.children.get(qname)
    if child is None and isinstance(shape, MapOf):
        child = node.children.get(name)  # a map sent under its member's name (`Tags.1.Key`)
    if child is None:
        return None
    if isinstance(shape, MapOf):
        return _query_map(shape, child, where + qname)
    if isinstance(shape, Struct):
        return _query_struct(shape, child, where + qname + ".")
    if child.value is None:
        return None
    return _query_scalar(shape, child.value, where + qname)


def _indexed(node: _Node, where: str) -> list[_Node]:
    items: list[tuple[int, _Node]] = []
    for key, child in node.children.items():
        if not key.isdigit() or len(key) > 6 or int(key) < 1:
            raise e.invalid_parameter_value(f"{where}.{key} is not a valid parameter name.")
        items.append((int(key), child))
    items.sort(key=lambda item: item[0])
    return [child for _, child in items]


def _query_list(shape: ListOf, node: _Node, where: str) -> list[Any]:
    out: list[Any] = []
    for i, child in enumerate(_indexed(node, where), 1):
        if isinstance(shape.member, Struct):
            out.append(_query_struct(shape.member, child, f"{where}.{i}."))
        elif isinstance(shape.member, Scalar) and child.value is not None:
            out.append(_query_scalar(shape.member, child.value, f"{where}.{i}"))
    return out


def _query_map(shape: MapOf, node: _Node, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, entry in enumerate(_indexed(node, where), 1):
        key_node = entry.children.get(shape.query_key)
        if key_node is None or key_node.value is None:
            raise e.missing_parameter(f"{where}.{i}.{shape.query_key}")
        value_node = entry.children.get(shape.query_value)
        if value_node is None:
            raise e.missing_parameter(f"{where}.{i}.{shape.query_value}")
        if isinstance(shape.value, Struct):
            out[key_node.value] = _query_struct(shape.value, value_node, f"{where}.{i}.{shape.query_value}.")
        elif value_node.value is not None and isinstance(shape.value, Scalar):
            out[key_node.value] = _query_scalar(shape.value, value_node.value, f"{where}.{i}.Value")
        else:
            raise e.missing_parameter(f"{where}.{i}.{shape.query_value}")
    return out


def _query_scalar(shape: Scalar, text: str, where: str) -> Any:
    kind = shape.kind
    if kind == "string":
        return text
    if kind == "blob":
        return _base64(text, where)
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise e.invalid_value_for(where, text, "Must be true or false.")
        return text.lower() == "true"
    if not _INTEGER_TEXT.fullmatch(text):
        raise e.invalid_value_for(where, text[:64], "Must be an integer.")
    number = int(text)
    limit = MAX_INT32 if kind == "integer" else MAX_INT64
    if not -limit - 1 <= number <= limit:
        raise e.invalid_value_for(where, text, "The value is out of range.")
    return number


# --- what AWS checks before it looks at a queue ------------------------------------------------
def _check(request: SqsRequest) -> None:
    p = request.params
    action = request.action
    if action == "SendMessage":  # the most frequent action, and only this check is its
        problem = message_error(p)
        if problem is not None:
            raise problem
        return
    if action == "CreateQueue":
        name = p["QueueName"]
        base = name[: -len(".fifo")] if name.endswith(".fifo") else name
        if not _QUEUE_NAME.fullmatch(base):
            raise e.invalid_parameter_value(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
            )
    if action in ("CreateQueue", "SetQueueAttributes"):
        _check_attribute_names(p.get("Attributes", {}), SETTABLE_QUEUE_ATTRIBUTES)
    if action == "GetQueueAttributes":
        _check_attribute_names(p.get("AttributeNames", []), QUEUE_ATTRIBUTE_NAMES)
    tags = p.get("tags") if action == "CreateQueue" else p.get("Tags") if action == "TagQueue" else None
    if tags is not None and len(tags) > MAX_TAGS:
        raise e.invalid_parameter_value(f"Too many tags: a queue has at most {MAX_TAGS}.")
    if action == "UntagQueue" and len(p["TagKeys"]) > MAX_TAGS:
        raise e.invalid_parameter_value(f"Too many tag keys: a queue has at most {MAX_TAGS} tags.")
    if action in ("ListQueues", "ListDeadLetterSourceQueues"):
        _check_range(p, "MaxResults", 1, MAX_LIST_QUEUES_RESULTS)
    if action == "ListMessageMoveTasks":
        _check_range(p, "MaxResults", 1, MAX_MOVE_TASKS_RESULTS)
    if action == "StartMessageMoveTask":
        _check_range(p, "MaxNumberOfMessagesPerSecond", 1, MAX_MOVE_RATE_PER_S)
    if action == "ReceiveMessage":
        _check_receive(p)
    if action == "ChangeMessageVisibility":
        _check_range(p, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT_S)
    if action in BATCH_ACTIONS:
        _check_batch(request)


def _check_attribute_names(names: Any, allowed: frozenset[str]) -> None:
    for name in names:
        if name not in allowed:
            raise SqsError(e.INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")


def _check_range(p: dict[str, Any], name: str, low: int, high: int) -> None:
    value = p.get(name)
    if value is not None and not low <= value <= high:
        raise e.invalid_value_for(name, value, f"Must be between {low} and {high}, if provided.")


def _check_receive(p: dict[str, Any]) -> None:
    _check_range(p, "MaxNumberOfMessages", 1, MAX_RECEIVE_MESSAGES)
    _check_range(p, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT_S)
    _check_range(p, "WaitTimeSeconds", 0, MAX_WAIT_TIME_S)
    for key in ("AttributeNames", "MessageSystemAttributeNames"):
        _check_attribute_names(p.get(key, []), MESSAGE_SYSTEM_ATTRIBUTE_NAMES)
    for name in p.get("MessageAttributeNames", []):
        if not 1 <= len(name) <= MAX_ATTRIBUTE_NAME_CHARS:
            raise e.invalid_value_for("MessageAttributeName", name[:64], "Not a valid attribute name.")
    attempt = p.get("ReceiveRequestAttemptId")
    if attempt is not None and not _DEDUP_ID.fullmatch(attempt):
        raise e.invalid_value_for("ReceiveRequestAttemptId", attempt[:64], "Not a valid attempt id.")


def _check_batch(request: SqsRequest) -> None:
    entries: list[dict[str, Any]] = request.params["Entries"]
    entry_name = {
        "SendMessageBatch": "SendMessageBatchRequestEntry",
        "DeleteMessageBatch": "DeleteMessageBatchRequestEntry",
        "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchRequestEntry",
    }[request.action]
    if not entries:
        raise SqsError(e.EMPTY_BATCH_REQUEST, f"There should be at least one {entry_name} in the request.")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise SqsError(
            e.TOO_MANY_ENTRIES,
            f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry["Id"]
        if not _ENTRY_ID.fullmatch(entry_id):
            raise SqsError(
                e.INVALID_BATCH_ENTRY_ID,
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                f"It can be at most {MAX_BATCH_ENTRY_ID_CHARS} letters long.",
            )
        if entry_id in seen:
            raise SqsError(e.BATCH_ENTRY_IDS_NOT_DISTINCT, f"Id {entry_id} repeated.")
        seen.add(entry_id)
    if request.action == "SendMessageBatch":
        total = sum(message_bytes(entry) for entry in entries)
        if total > MAX_BATCH_BYTES:
            raise SqsError(
                e.BATCH_REQUEST_TOO_LONG,
                f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. You have sent {total} bytes.",
            )
        for entry in entries:
            problem = message_error(entry)
            if problem is not None:
                request.entry_errors[entry["Id"]] = problem
    elif request.action == "ChangeMessageVisibilityBatch":
        for entry in entries:
            timeout = entry.get("VisibilityTimeout")
            if timeout is not None and not 0 <= timeout <= MAX_VISIBILITY_TIMEOUT_S:
                request.entry_errors[entry["Id"]] = e.invalid_value_for(
                    "VisibilityTimeout", timeout, f"Must be between 0 and {MAX_VISIBILITY_TIMEOUT_S}."
                )


def message_bytes(message: Mapping[str, Any]) -> int:
    """A message's size as SQS counts it against its limit: the body and each attribute's name,
    data type and value, in bytes."""
    size = len(str(message.get("MessageBody", "")).encode("utf-8", "surrogatepass"))
    for name, value in (message.get("MessageAttributes") or {}).items():
        size += len(name.encode("utf-8", "surrogatepass"))
        size += len(str(value.get("DataType", "")).encode("utf-8", "surrogatepass"))
        if value.get("StringValue") is not None:
            size += len(str(value["StringValue"]).encode("utf-8", "surrogatepass"))
        if value.get("BinaryValue") is not None:
            size += len(value["BinaryValue"])
    return size


def _has_forbidden(text: str) -> bool:
    """Whether `text` has a character SQS refuses; printable ASCII (the usual text) has none."""
    if text.isascii() and text.isprintable():
        return False
    return _FORBIDDEN_CHAR.search(text) is not None


def message_error(message: Mapping[str, Any]) -> SqsError | None:
    """What AWS refuses in one message to send (SendMessage's params or a batch entry), or None."""
    body = message.get("MessageBody", "")
    if not body:
        return e.missing_parameter("MessageBody")
    if _has_forbidden(body):
        return SqsError(
            e.INVALID_MESSAGE_CONTENTS,
            f"Invalid characters found. Valid unicode characters are {_ALLOWED_CHARS}",
        )
    delay = message.get("DelaySeconds")
    if delay is not None and not 0 <= delay <= MAX_DELAY_S:
        return e.invalid_value_for(
            "DelaySeconds", delay, f"DelaySeconds must be >= 0 and <= {MAX_DELAY_S}, if provided."
        )
    attributes = message.get("MessageAttributes") or {}
    if len(attributes) > MAX_MESSAGE_ATTRIBUTES:
        return e.invalid_parameter_value(
            f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum "
            f"[{MAX_MESSAGE_ATTRIBUTES}]."
        )
    for name, value in attributes.items():
        problem = _attribute_error(name, value, "Message (user)")
        if problem is not None:
            return problem
    for name, value in (message.get("MessageSystemAttributes") or {}).items():
        if name not in SENDABLE_SYSTEM_ATTRIBUTES:
            return e.invalid_parameter_value(f"Message system attribute name '{name[:256]}' is invalid.")
        if value.get("DataType") != "String":
            return e.invalid_parameter_value(
                f"Message system attribute '{name}' has an invalid data type; it must be String."
            )
        problem = _attribute_error(name, value, "Message system")
        if problem is not None:
            return problem
    for key in ("MessageDeduplicationId", "MessageGroupId"):
        ident = message.get(key)
        if ident is not None and not _DEDUP_ID.fullmatch(ident):
            return e.invalid_value_for(key, ident[:128], f"{key} can contain up to {MAX_DEDUP_ID_CHARS} "
                                       "alphanumeric and punctuation characters.")  # fmt: skip
    size = message_bytes(message)
    if size > MAX_MESSAGE_BYTES:
        return e.invalid_parameter_value(
            "One or more parameters are invalid. "
            f"Reason: Message must be shorter than {MAX_MESSAGE_BYTES} bytes."
        )
    return None


def _attribute_error(name: str, value: Mapping[str, Any], kind: str) -> SqsError | None:
    lowered = name.lower()
    if (
        not 1 <= len(name) <= MAX_ATTRIBUTE_NAME_CHARS
        or not _ATTRIBUTE_NAME.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or (kind == "Message (user)" and (lowered.startswith("aws.") or lowered.startswith("amazon.")))
    ):
        return e.invalid_parameter_value(f"{kind} attribute name '{name[:256]}' is invalid.")
    data_type = value.get("DataType", "")
    if len(data_type) > MAX_DATA_TYPE_CHARS or not _DATA_TYPE.fullmatch(data_type):
        return e.invalid_parameter_value(
            f"The type of {kind.lower()} attribute '{name}' is invalid. You must use only the following "
            "supported type prefixes: Binary, Number, String."
        )
    base = data_type.split(".", 1)[0]
    string_value = value.get("StringValue")
    binary_value = value.get("BinaryValue")
    if base == "Binary":
        if not binary_value:
            return e.invalid_parameter_value(
                f"{kind} attribute '{name}' must contain a non-empty value of type '{base}'."
            )
        return None
    if not string_value:
        return e.invalid_parameter_value(
            f"{kind} attribute '{name}' must contain a non-empty value of type '{base}'."
        )
    if _has_forbidden(string_value):
        return SqsError(
            e.INVALID_MESSAGE_CONTENTS,
            f"{kind} attribute '{name}' must contain only valid characters: {_ALLOWED_CHARS}.",
        )
    if base == "Number":
        digits = sum(ch.isdigit() for ch in string_value)
        if not _NUMBER.fullmatch(string_value.strip()) or digits > MAX_NUMBER_DIGITS:
            return e.invalid_parameter_value(
                f"Can't cast the value of message (user) attribute '{name}' to a number."
            )
    return None
