"""SQS answers and errors on the wire, in the protocol the request spoke (issue 30).

The service hands `encode_result` a dict in the JSON protocol's output member names (what
botocore returns to a caller: `{"Messages": [{"MessageId", "ReceiptHandle", "MD5OfBody", "Body",
"Attributes": {name: str}, "MD5OfMessageAttributes", "MessageAttributes": {name: {"DataType",
"StringValue" | "BinaryValue": bytes}}}]}`, `{"Successful": [...], "Failed": [{"Id",
"SenderFault", "Code", "Message"}]}`…). Only the members of the action's output shape are sent.

- JSON: `application/x-amz-json-1.0`, the members as they are, blobs in base64.
- query: `text/xml`, `<XResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><XResult>…
  </XResult><ResponseMetadata><RequestId>…</RequestId></ResponseMetadata></XResponse>`, every
  list flattened (its items repeated under the item's name: `<Message>`, `<QueueUrl>`,
  `<SendMessageBatchResultEntry>`), every map as repeated `<Attribute><Name/><Value/></Attribute>`
  (`<Tag><Key/><Value/></Tag>` for tags), blobs in base64, booleans as `true`/`false`.

Errors: JSON `{"__type": "<namespace>#<name>", "message": …}` with `x-amzn-query-error:
<query code>;Sender|Receiver`; query `<ErrorResponse><Error><Type>Sender</Type><Code>…</Code>
<Message>…</Message><Detail/></Error><RequestId>…</RequestId></ErrorResponse>`. Every answer has
an `x-amzn-RequestId` header, the request id in the XML too.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Final

import msgspec

from mqgate.sqs.errors import SqsError, as_sqs_error
from mqgate.sqs.protocol import (
    ATTRIBUTE_VALUE,
    BOOLEAN,
    INTEGER,
    JSON_CONTENT_TYPE,
    LONG,
    STRING,
    ListOf,
    MapOf,
    Member,
    Protocol,
    Scalar,
    Shape,
    SqsRequest,
    Struct,
    new_request_id,
)

SQS_XML_NAMESPACE: Final = "http://queue.amazonaws.com/doc/2012-11-05/"
STS_XML_NAMESPACE: Final = "https://sts.amazonaws.com/doc/2011-06-15/"
XML_CONTENT_TYPE: Final = "text/xml"
Answer = tuple[int, dict[str, str], bytes]


def _m(shape: Shape, xml_name: str | None = None) -> Member:
    return Member(shape, False, xml_name)


def _batch_result(entry_name: str, entry: dict[str, Member]) -> Struct:
    return Struct(
        {
            "Successful": _m(ListOf(Struct(entry), entry_name)),
            "Failed": _m(ListOf(BATCH_ERROR_ENTRY, "BatchResultErrorEntry")),
        }
    )


BATCH_ERROR_ENTRY: Final = Struct(
    {"Id": _m(STRING), "SenderFault": _m(BOOLEAN), "Code": _m(STRING), "Message": _m(STRING)}
)
MESSAGE: Final = Struct(
    {
        "MessageId": _m(STRING),
        "ReceiptHandle": _m(STRING),
        "MD5OfBody": _m(STRING),
        "Body": _m(STRING),
        "Attributes": _m(MapOf(STRING), "Attribute"),
        "MD5OfMessageAttributes": _m(STRING),
        "MessageAttributes": _m(MapOf(ATTRIBUTE_VALUE), "MessageAttribute"),
    }
)
_SEND_RESULT: Final[dict[str, Member]] = {
    "MD5OfMessageBody": _m(STRING),
    "MD5OfMessageAttributes": _m(STRING),
    "MD5OfMessageSystemAttributes": _m(STRING),
    "MessageId": _m(STRING),
    "SequenceNumber": _m(STRING),
}
QUEUE_URL_RESULT: Final = Struct({"QueueUrl": _m(STRING)})

# Each action's output shape; None: the action answers nothing but its request id.
OUTPUTS: Final[dict[str, Struct | None]] = {
    "CreateQueue": QUEUE_URL_RESULT,
    "GetQueueUrl": QUEUE_URL_RESULT,
    "ListQueues": Struct({"QueueUrls": _m(ListOf(STRING, "QueueUrl")), "NextToken": _m(STRING)}),
    "DeleteQueue": None,
    "PurgeQueue": None,
    "GetQueueAttributes": Struct({"Attributes": _m(MapOf(STRING), "Attribute")}),
    "SetQueueAttributes": None,
    "TagQueue": None,
    "UntagQueue": None,
    "ListQueueTags": Struct({"Tags": _m(MapOf(STRING, "Key", "Value"), "Tag")}),
    "SendMessage": Struct(_SEND_RESULT),
    "SendMessageBatch": _batch_result("SendMessageBatchResultEntry", {"Id": _m(STRING), **_SEND_RESULT}),
    "ReceiveMessage": Struct({"Messages": _m(ListOf(MESSAGE, "Message"))}),
    "DeleteMessage": None,
    "DeleteMessageBatch": _batch_result("DeleteMessageBatchResultEntry", {"Id": _m(STRING)}),
    "ChangeMessageVisibility": None,
    "ChangeMessageVisibilityBatch": _batch_result(
        "ChangeMessageVisibilityBatchResultEntry", {"Id": _m(STRING)}
    ),
    "ListDeadLetterSourceQueues": Struct(
        {"queueUrls": _m(ListOf(STRING, "QueueUrl")), "NextToken": _m(STRING)}
    ),
    "StartMessageMoveTask": Struct({"TaskHandle": _m(STRING)}),
    "ListMessageMoveTasks": Struct(
        {
            "Results": _m(
                ListOf(
                    Struct(
                        {
                            "TaskHandle": _m(STRING),
                            "Status": _m(STRING),
                            "SourceArn": _m(STRING),
                            "DestinationArn": _m(STRING),
                            "MaxNumberOfMessagesPerSecond": _m(INTEGER),
                            "ApproximateNumberOfMessagesMoved": _m(LONG),
                            "ApproximateNumberOfMessagesToMove": _m(LONG),
                            "FailureReason": _m(STRING),
                            "StartedTimestamp": _m(LONG),
                        }
                    ),
                    "ListMessageMoveTasksResultEntry",
                )
            )
        }
    ),
    "CancelMessageMoveTask": Struct({"ApproximateNumberOfMessagesMoved": _m(LONG)}),
    "GetCallerIdentity": Struct({"UserId": _m(STRING), "Account": _m(STRING), "Arn": _m(STRING)}),
}
# Lists that SDKs expect present in JSON even when empty (required members of the output shape).
_REQUIRED_LISTS: Final = frozenset({"Successful", "Failed", "queueUrls"})
# Those of each action's output shape, worked out once.
_REQUIRED_LISTS_OF: Final[dict[str, tuple[str, ...]]] = {
    action: tuple(name for name in shape.members if name in _REQUIRED_LISTS)
    for action, shape in OUTPUTS.items()
    if shape is not None
}


# The output shapes made of strings only (SendMessage's, a queue URL): their members' names.
_FLAT_OUTPUTS: Final[dict[str, tuple[str, ...]]] = {
    action: tuple(shape.members)
    for action, shape in OUTPUTS.items()
    if shape is not None
    and all(isinstance(m.shape, Scalar) and m.shape.kind == "string" for m in shape.members.values())
}


def encode_result(request: SqsRequest, action: str, result: dict[str, Any] | None) -> Answer:
    """The answer to a request that succeeded, in the request's protocol."""
    shape = OUTPUTS.get(action)
    result = result or {}
    if request.protocol == "json":
        flat = _FLAT_OUTPUTS.get(action)
        document: dict[str, Any]
        if flat is not None:  # `_json_struct`'s work without its walk of the shape
            document = {name: _clean(str(v)) for name in flat if (v := result.get(name)) is not None}
        else:
            document = _json_struct(shape, result) if shape is not None else {}
        for name in _REQUIRED_LISTS_OF.get(action, ()):
            document.setdefault(name, [])
        body = msgspec.json.encode(document)
        return 200, _json_headers(request.request_id), body
    namespace = STS_XML_NAMESPACE if request.service == "sts" else SQS_XML_NAMESPACE
    parts = [f'<?xml version="1.0"?><{action}Response xmlns="{namespace}">']
    if shape is not None:
        parts.append(f"<{action}Result>")
        _xml_struct(shape, result, parts)
        parts.append(f"</{action}Result>")
    parts.append(f"<ResponseMetadata><RequestId>{_text(request.request_id)}</RequestId></ResponseMetadata>")
    parts.append(f"</{action}Response>")
    return 200, _xml_headers(request.request_id), "".join(parts).encode("utf-8", "replace")


def encode_error(target: SqsRequest | Protocol, error: BaseException) -> Answer:
    """The answer to a refused request, in its protocol: `target` is the request, or only its
    protocol when the request could not be read (`protocol.detect_protocol`). Any exception is
    answered as the SQS error it maps to (an internal error when none)."""
    err: SqsError = as_sqs_error(error)
    if isinstance(target, SqsRequest):
        protocol: Protocol = target.protocol
        request_id = target.request_id
        namespace = STS_XML_NAMESPACE if target.service == "sts" else SQS_XML_NAMESPACE
    else:
        protocol, request_id, namespace = target, new_request_id(), SQS_XML_NAMESPACE
    kind = err.kind
    fault = "Sender" if kind.sender_fault else "Receiver"
    if protocol == "json":
        headers = _json_headers(request_id)
        if kind.query_header:
            headers["x-amzn-query-error"] = f"{kind.query_code};{fault}"
        body = msgspec.json.encode({"__type": kind.json_type, "message": _clean(err.message)})
        return kind.http_status, headers, body
    xml = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{namespace}"><Error><Type>{fault}</Type>'
        f"<Code>{_text(kind.query_code)}</Code><Message>{_text(err.message)}</Message><Detail/></Error>"
        f"<RequestId>{_text(request_id)}</RequestId></ErrorResponse>"
    )
    return kind.http_status, _xml_headers(request_id), xml.encode("utf-8", "replace")


def batch_error_entry(entry_id: str, error: SqsError) -> dict[str, Any]:
    """A batch's `Failed` item for an entry refused with `error` (its query-protocol code, as
    AWS's batch answers carry in both protocols)."""
    return {
        "Id": entry_id,
        "SenderFault": error.sender_fault,
        "Code": error.query_code,
        "Message": error.message,
    }


def _json_headers(request_id: str) -> dict[str, str]:
    return {"Content-Type": JSON_CONTENT_TYPE, "x-amzn-RequestId": request_id}


def _xml_headers(request_id: str) -> dict[str, str]:
    return {"Content-Type": XML_CONTENT_TYPE, "x-amzn-RequestId": request_id}


# --- JSON ----------------------------------------------------------------------------------------
def _json_struct(shape: Struct, value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, member in shape.members.items():
        item = value.get(name)
        if item is not None:
            out[name] = _json_value(member.shape, item)
    return out


def _json_value(shape: Shape, value: Any) -> Any:
    if isinstance(shape, Scalar):  # the most common: first
        return _json_scalar(shape, value)
    if isinstance(shape, Struct):
        return _json_struct(shape, value)
    if isinstance(shape, ListOf):
        return [_json_value(shape.member, item) for item in value if item is not None]
    if isinstance(shape, MapOf):
        return {str(k): _json_value(shape.value, v) for k, v in value.items() if v is not None}
    return _json_scalar(shape, value)


def _json_scalar(shape: Scalar, value: Any) -> Any:
    if shape.kind == "blob":
        return base64.b64encode(bytes(value)).decode("ascii")
    if shape.kind == "string":
        return _clean(str(value))
    if shape.kind == "boolean":
        return bool(value)
    return int(value)


# --- XML -----------------------------------------------------------------------------------------
# What XML 1.0 cannot carry at all; the message rules keep it out of bodies and attributes, this
# keeps it out of everything else (names, error messages).
_NOT_XML: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: str) -> str:
    if text.isascii() and text.isprintable():  # ids, digests, URLs: nothing to replace
        return text
    return _NOT_XML.sub("\ufffd", text)


def _text(value: str) -> str:
    # A raw CR would reach the client as LF (XML normalizes line ends), so it goes as a reference.
    return (
        _clean(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#xD;")
    )


def _xml_struct(shape: Struct, value: dict[str, Any], parts: list[str]) -> None:
    for name, member in shape.members.items():
        item = value.get(name)
        if item is None:
            continue
        tag = member.query_name or name
        inner = member.shape
        if isinstance(inner, ListOf):
            item_tag = inner.query_item or tag
            for element in item:
                if element is not None:
                    _xml_element(item_tag, inner.member, element, parts)
        elif isinstance(inner, MapOf):
            for key, element in item.items():
                if element is None:
                    continue
                parts.append(f"<{tag}><{inner.query_key}>{_text(str(key))}</{inner.query_key}>")
                _xml_element(inner.query_value, inner.value, element, parts)
                parts.append(f"</{tag}>")
        else:
            _xml_element(tag, inner, item, parts)


def _xml_element(tag: str, shape: Shape, value: Any, parts: list[str]) -> None:
    if isinstance(shape, Struct):
        parts.append(f"<{tag}>")
        _xml_struct(shape, value, parts)
        parts.append(f"</{tag}>")
        return
    if isinstance(shape, ListOf | MapOf):
        # Only lists and maps that are members of a structure occur in SQS's shapes.
        _xml_struct(Struct({tag: Member(shape)}), {tag: value}, parts)
        return
    parts.append(f"<{tag}>{_text(_xml_scalar(shape, value))}</{tag}>")


def _xml_scalar(shape: Scalar, value: Any) -> str:
    if shape.kind == "blob":
        return base64.b64encode(bytes(value)).decode("ascii")
    if shape.kind == "boolean":
        return "true" if value else "false"
    if shape.kind in ("integer", "long"):
        return str(int(value))
    return str(value)
