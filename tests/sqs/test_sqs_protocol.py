"""`decode_request` reads what botocore sends, in both protocols, as one normalized shape; and
refuses bad input with AWS's errors, never another exception."""

# ruff: noqa: E501  (the case tables read one case a line, wider than the code)
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.awsrequest import AWSRequest
from botocore.model import ServiceModel
from botocore.serialize import create_serializer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqgate.sqs import errors as e
from mqgate.sqs import protocol as p
from mqgate.sqs.errors import SqsError
from mqgate.sqs.protocol import decode_request
from tests.sqs.sqs_wire import json_model, query_model

Q = "http://127.0.0.1:1/000000000000/orders"
ATTRS = {
    "color": {"DataType": "String", "StringValue": "blue"},
    "size": {"DataType": "Number", "StringValue": "42"},
    "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    "kind": {"DataType": "String.custom", "StringValue": "x & <y>"},
}
TRACE = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793"}}

# Each action with params botocore takes: what the decoder must give back, in both protocols.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("CreateQueue", {"QueueName": "orders", "Attributes": {"VisibilityTimeout": "30", "DelaySeconds": "5"},
                     "tags": {"team": "billing", "env": "prod"}}),
    ("CreateQueue", {"QueueName": "orders.fifo", "Attributes": {"FifoQueue": "true"}}),
    ("GetQueueUrl", {"QueueName": "orders", "QueueOwnerAWSAccountId": "000000000000"}),
    ("ListQueues", {"QueueNamePrefix": "ord", "NextToken": "abc", "MaxResults": 5}),
    ("ListQueues", {}),
    ("DeleteQueue", {"QueueUrl": Q}),
    ("PurgeQueue", {"QueueUrl": Q}),
    ("GetQueueAttributes", {"QueueUrl": Q, "AttributeNames": ["All", "QueueArn"]}),
    ("SetQueueAttributes", {"QueueUrl": Q, "Attributes": {"VisibilityTimeout": "60"}}),
    ("TagQueue", {"QueueUrl": Q, "Tags": {"a": "1", "b": ""}}),
    ("UntagQueue", {"QueueUrl": Q, "TagKeys": ["a", "b"]}),
    ("ListQueueTags", {"QueueUrl": Q}),
    ("SendMessage", {"QueueUrl": Q, "MessageBody": "hello wörld\r\n\t✓ 𝄞"}),
    ("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "DelaySeconds": 3, "MessageAttributes": ATTRS,
                     "MessageSystemAttributes": TRACE, "MessageGroupId": "g-1",
                     "MessageDeduplicationId": "d-1"}),
    ("SendMessageBatch", {"QueueUrl": Q, "Entries": [
        {"Id": "a-1", "MessageBody": "one", "MessageAttributes": ATTRS},
        {"Id": "b_2", "MessageBody": "two", "DelaySeconds": 0, "MessageSystemAttributes": TRACE},
    ]}),
    ("ReceiveMessage", {"QueueUrl": Q, "AttributeNames": ["All"], "MessageSystemAttributeNames": ["SenderId"],
                        "MessageAttributeNames": ["All", "color.*"], "MaxNumberOfMessages": 10,
                        "VisibilityTimeout": 0, "WaitTimeSeconds": 20, "ReceiveRequestAttemptId": "r1"}),
    ("ReceiveMessage", {"QueueUrl": Q}),
    ("DeleteMessage", {"QueueUrl": Q, "ReceiptHandle": "rh+/=="}),
    ("DeleteMessageBatch", {"QueueUrl": Q, "Entries": [{"Id": "x", "ReceiptHandle": "r1"},
                                                       {"Id": "y", "ReceiptHandle": "r2"}]}),
    ("ChangeMessageVisibility", {"QueueUrl": Q, "ReceiptHandle": "r1", "VisibilityTimeout": 43200}),
    ("ChangeMessageVisibilityBatch", {"QueueUrl": Q, "Entries": [
        {"Id": "x", "ReceiptHandle": "r1", "VisibilityTimeout": 10}, {"Id": "y", "ReceiptHandle": "r2"}]}),
    ("ListDeadLetterSourceQueues", {"QueueUrl": Q, "MaxResults": 1000, "NextToken": "t"}),
    ("StartMessageMoveTask", {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:dlq",
                              "DestinationArn": "arn:aws:sqs:us-east-1:000000000000:orders",
                              "MaxNumberOfMessagesPerSecond": 50}),
    ("ListMessageMoveTasks", {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "MaxResults": 10}),
    ("CancelMessageMoveTask", {"TaskHandle": "handle-1"}),
]  # fmt: skip

_MODELS = {"json": ServiceModel(json_model(), "sqs"), "query": ServiceModel(query_model(), "sqs")}


def wire(protocol: str, action: str, params: dict[str, Any]) -> tuple[str, str, str, dict[str, str], bytes]:
    """The request botocore sends for `action`: method, path, query string, headers, body."""
    model = _MODELS[protocol]
    op = model.operation_model(action)
    serialized = create_serializer(protocol).serialize_to_request(params, op)
    request = AWSRequest(
        method=serialized["method"],
        url="http://127.0.0.1:1" + serialized["url_path"],
        data=serialized["body"],
        headers=serialized["headers"],
    ).prepare()
    url = urlsplit(request.url)
    body = request.body if isinstance(request.body, bytes) else (request.body or "").encode()
    return request.method, url.path, url.query, dict(request.headers), body


@pytest.mark.parametrize("protocol", ["json", "query"])
@pytest.mark.parametrize(("action", "params"), CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_decodes_what_botocore_sends(protocol: str, action: str, params: dict[str, Any]) -> None:
    request = decode_request(*wire(protocol, action, params))
    assert request.protocol == protocol
    assert request.action == action
    assert request.params == params
    assert request.entry_errors == {}


def test_the_query_protocol_names_are_the_flattened_ones() -> None:
    _, _, _, _, body = wire("query", "SendMessageBatch", CASES[14][1])
    text = body.decode()
    for name in (
        "Action=SendMessageBatch",
        "SendMessageBatchRequestEntry.1.Id=a-1",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=",
        "SendMessageBatchRequestEntry.1.MessageAttribute.3.Value.BinaryValue=AAH%2F",
        "SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Name=AWSTraceHeader",
    ):
        assert name in text
    _, _, _, _, body = wire("query", "SetQueueAttributes", CASES[8][1])
    assert "Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=60" in body.decode()


def test_a_hand_written_query_request_with_get_and_the_queue_in_the_path() -> None:
    request = decode_request(
        "GET",
        "/000000000000/orders",
        "Action=ReceiveMessage&Version=2012-11-05&AttributeName.1=All&MaxNumberOfMessages=2",
        {b"host": b"sqs.local:9324"},
        b"",
    )
    assert request.params == {
        "QueueUrl": "http://sqs.local:9324/000000000000/orders",
        "AttributeNames": ["All"],
        "MaxNumberOfMessages": 2,
    }


def test_sts_get_caller_identity_in_the_query_protocol() -> None:
    body = b"Action=GetCallerIdentity&Version=2011-06-15"
    request = decode_request("POST", "/", b"", {"Content-Type": "application/x-www-form-urlencoded"}, body)
    assert (request.action, request.service, request.protocol, request.params) == (
        "GetCallerIdentity",
        "sts",
        "query",
        {},
    )


def _json(action: str, document: Any) -> tuple[str, str, str, dict[str, str], bytes]:
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    return "POST", "/", "", headers, json.dumps(document).encode()


def _form(body: str) -> tuple[str, str, str, dict[str, str], bytes]:
    return "POST", "/", "", {"Content-Type": "application/x-www-form-urlencoded"}, body.encode()


def _refused(args: tuple[str, str, str, dict[str, str], bytes]) -> SqsError:
    with pytest.raises(SqsError) as caught:
        decode_request(*args)
    return caught.value


def _entries(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"Id": f"e{i}", "MessageBody": "m", **extra} for i in range(n)]


BAD: list[tuple[str, tuple[str, str, str, dict[str, str], bytes], e.ErrorKind]] = [
    ("unknown json action", _json("Frobnicate", {}), e.INVALID_ACTION),
    ("unknown query action", _form("Action=Frobnicate"), e.INVALID_ACTION),
    ("no query action", _form("QueueUrl=x"), e.MISSING_ACTION),
    ("json missing QueueUrl", _json("SendMessage", {"MessageBody": "x"}), e.MISSING_PARAMETER),
    ("query missing QueueUrl", _form("Action=DeleteQueue"), e.MISSING_PARAMETER),
    ("empty body", _json("SendMessage", {"QueueUrl": Q, "MessageBody": ""}), e.MISSING_PARAMETER),
    ("json not json", ("POST", "/", "", {"X-Amz-Target": "AmazonSQS.ListQueues"}, b"{nope"), e.SERIALIZATION),
    ("json not an object", _json("ListQueues", [1]), e.SERIALIZATION),
    ("json string for int", _json("ListQueues", {"MaxResults": "5"}), e.SERIALIZATION),
    ("json bool for int", _json("ListQueues", {"MaxResults": True}), e.SERIALIZATION),
    ("json int32 overflow", _json("ListQueues", {"MaxResults": 2**31}), e.SERIALIZATION),
    ("query not an int", _form("Action=ListQueues&MaxResults=five"), e.INVALID_PARAMETER_VALUE),
    ("bad base64", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        "b": {"DataType": "Binary", "BinaryValue": "***"}}}), e.INVALID_PARAMETER_VALUE),
    ("MaxResults range", _json("ListQueues", {"MaxResults": 1001}), e.INVALID_PARAMETER_VALUE),
    ("receive count", _json("ReceiveMessage", {"QueueUrl": Q, "MaxNumberOfMessages": 11}),
     e.INVALID_PARAMETER_VALUE),
    ("receive wait", _json("ReceiveMessage", {"QueueUrl": Q, "WaitTimeSeconds": 21}), e.INVALID_PARAMETER_VALUE),
    ("visibility", _json("ChangeMessageVisibility", {"QueueUrl": Q, "ReceiptHandle": "r",
                                                     "VisibilityTimeout": 43201}), e.INVALID_PARAMETER_VALUE),
    ("unknown queue attribute", _json("GetQueueAttributes", {"QueueUrl": Q, "AttributeNames": ["Colour"]}),
     e.INVALID_ATTRIBUTE_NAME),
    ("read-only attribute", _json("SetQueueAttributes", {"QueueUrl": Q, "Attributes": {"QueueArn": "x"}}),
     e.INVALID_ATTRIBUTE_NAME),
    ("bad queue name", _json("CreateQueue", {"QueueName": "a b"}), e.INVALID_PARAMETER_VALUE),
    ("long queue name", _json("CreateQueue", {"QueueName": "q" * 81}), e.INVALID_PARAMETER_VALUE),
    ("body chars", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "a\x00b"}), e.INVALID_MESSAGE_CONTENTS),
    ("delay", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "DelaySeconds": 901}),
     e.INVALID_PARAMETER_VALUE),
    ("too many attributes", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}}), e.INVALID_PARAMETER_VALUE),
    ("reserved attribute name", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        "AWS.x": {"DataType": "String", "StringValue": "v"}}}), e.INVALID_PARAMETER_VALUE),
    ("attribute name dots", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        "a..b": {"DataType": "String", "StringValue": "v"}}}), e.INVALID_PARAMETER_VALUE),
    ("attribute type", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        "a": {"DataType": "Text", "StringValue": "v"}}}), e.INVALID_PARAMETER_VALUE),
    ("attribute no value", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        "a": {"DataType": "String"}}}), e.INVALID_PARAMETER_VALUE),
    ("attribute not a number", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m", "MessageAttributes": {
        "a": {"DataType": "Number", "StringValue": "1e"}}}), e.INVALID_PARAMETER_VALUE),
    ("system attribute name", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "m",
                                                    "MessageSystemAttributes": {"SenderId": {
                                                        "DataType": "String", "StringValue": "v"}}}),
     e.INVALID_PARAMETER_VALUE),
    ("message too long", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "x" * p.MAX_MESSAGE_BYTES,
                                               "MessageAttributes": {"a": {"DataType": "String",
                                                                           "StringValue": "v"}}}),
     e.INVALID_PARAMETER_VALUE),
    ("empty batch", _json("SendMessageBatch", {"QueueUrl": Q, "Entries": []}), e.EMPTY_BATCH_REQUEST),
    ("empty query batch", _form(f"Action=DeleteMessageBatch&QueueUrl={Q}&Entries="), e.EMPTY_BATCH_REQUEST),
    ("11 entries", _json("SendMessageBatch", {"QueueUrl": Q, "Entries": _entries(11)}), e.TOO_MANY_ENTRIES),
    ("entry id chars", _json("DeleteMessageBatch", {"QueueUrl": Q, "Entries": [
        {"Id": "a.b", "ReceiptHandle": "r"}]}), e.INVALID_BATCH_ENTRY_ID),
    ("entry id length", _json("DeleteMessageBatch", {"QueueUrl": Q, "Entries": [
        {"Id": "a" * 81, "ReceiptHandle": "r"}]}), e.INVALID_BATCH_ENTRY_ID),
    ("entry ids repeat", _json("ChangeMessageVisibilityBatch", {"QueueUrl": Q, "Entries": [
        {"Id": "a", "ReceiptHandle": "r"}, {"Id": "a", "ReceiptHandle": "s"}]}), e.BATCH_ENTRY_IDS_NOT_DISTINCT),
    ("batch too long", _json("SendMessageBatch", {"QueueUrl": Q, "Entries": [
        {"Id": f"e{i}", "MessageBody": "x" * (p.MAX_BATCH_BYTES // 2)} for i in range(3)]}),
     e.BATCH_REQUEST_TOO_LONG),
    ("body over the request limit", _json("SendMessage", {"QueueUrl": Q, "MessageBody": "x" * p.MAX_REQUEST_BYTES}),
     e.INVALID_PARAMETER_VALUE),
]  # fmt: skip


@pytest.mark.parametrize(("args", "kind"), [(a, k) for _, a, k in BAD], ids=[n for n, _, _ in BAD])
def test_refuses_with_aws_errors(
    args: tuple[str, str, str, dict[str, str], bytes], kind: e.ErrorKind
) -> None:
    assert _refused(args).kind == kind


def test_a_batch_entry_breaking_a_message_rule_fails_alone() -> None:
    entries = [
        {"Id": "ok", "MessageBody": "fine"},
        {"Id": "bad", "MessageBody": "a\x01"},
        {"Id": "late", "MessageBody": "m", "DelaySeconds": 1000},
    ]
    request = decode_request(*_json("SendMessageBatch", {"QueueUrl": Q, "Entries": entries}))
    assert {k: v.kind for k, v in request.entry_errors.items()} == {
        "bad": e.INVALID_MESSAGE_CONTENTS,
        "late": e.INVALID_PARAMETER_VALUE,
    }
    request = decode_request(
        *_json(
            "ChangeMessageVisibilityBatch",
            {"QueueUrl": Q, "Entries": [{"Id": "x", "ReceiptHandle": "r", "VisibilityTimeout": -1}]},
        )
    )
    assert set(request.entry_errors) == {"x"}


def test_one_mib_message_is_accepted() -> None:
    body = "x" * (p.MAX_MESSAGE_BYTES - 10)
    request = decode_request(*_json("SendMessage", {"QueueUrl": Q, "MessageBody": body}))
    assert request.params["MessageBody"] == body


def test_lone_surrogates_in_json_are_invalid_contents() -> None:
    raw = b'{"QueueUrl": "q", "MessageBody": "a\\ud800b"}'
    args = ("POST", "/", "", {"X-Amz-Target": "AmazonSQS.SendMessage"}, raw)
    assert _refused(args).kind in (e.INVALID_MESSAGE_CONTENTS, e.SERIALIZATION)


_PREFIXES = st.sampled_from(
    [
        "",
        "Action=SendMessageBatch&QueueUrl=q&",
        "Action=SendMessage&QueueUrl=q&MessageBody=x&",
        "Action=CreateQueue&QueueName=q&",
        "Action=ReceiveMessage&QueueUrl=q&",
    ]
)
_FIELD_NAMES = st.sampled_from(
    [
        "SendMessageBatchRequestEntry", "MessageAttribute", "Attribute", "Tag", "Entries", "Id", "Name",
        "Value", "StringValue", "BinaryValue", "DataType", "MessageBody", "1", "2", "0", "x", "",
        "AttributeName", "MaxNumberOfMessages", "DelaySeconds", "QueueUrl",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=_PREFIXES,
    fields=st.lists(
        st.tuples(st.lists(_FIELD_NAMES, min_size=1, max_size=7), st.text(max_size=12)), max_size=30
    ),
)
def test_random_query_forms_raise_only_sqs_errors(prefix: str, fields: list[tuple[list[str], str]]) -> None:
    from urllib.parse import quote

    body = prefix + "&".join(f"{'.'.join(name)}={quote(value)}" for name, value in fields)
    with contextlib.suppress(SqsError):
        decode_request("POST", "/", "", {"Content-Type": "application/x-www-form-urlencoded"}, body.encode())


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    action=st.sampled_from([*p.INPUTS, "Nope"]),
    document=st.dictionaries(
        st.sampled_from(["QueueUrl", "QueueName", "Entries", "MessageBody", "MessageAttributes",
                         "Attributes", "tags", "Tags", "TagKeys", "MaxResults", "AttributeNames",
                         "VisibilityTimeout", "MessageSystemAttributes", "DelaySeconds"]),
        _JSON_VALUES,
        max_size=6,
    ),
)  # fmt: skip
def test_random_json_documents_raise_only_sqs_errors(action: str, document: dict[str, Any]) -> None:
    with contextlib.suppress(SqsError):
        decode_request(*_json(action, document))


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200), json_protocol=st.booleans())
def test_random_bytes_raise_only_sqs_errors(body: bytes, json_protocol: bool) -> None:
    headers = {"X-Amz-Target": "AmazonSQS.SendMessage"} if json_protocol else {}
    with contextlib.suppress(SqsError):
        decode_request("POST", "/", body, headers, body)


def test_real_clients_requests_decode(tmp_path: Path) -> None:
    """The bytes a whole botocore client sends (its handlers included) decode alike."""
    from mqgate.sqs.answers import encode_result
    from tests.sqs.sqs_wire import client

    seen: list[Any] = []

    def answer(request: Any) -> tuple[int, dict[str, str], bytes]:
        url = urlsplit(request.url)
        decoded = decode_request(request.method, url.path, url.query, dict(request.headers), request.body)
        seen.append(decoded)
        return encode_result(decoded, decoded.action, {"MessageId": "m-1", "MD5OfMessageBody": "x"})

    for protocol in ("json", "query"):
        sqs = client(protocol, answer, tmp_path / protocol)
        sqs.send_message(QueueUrl=Q, MessageBody="hi", MessageAttributes={"a": ATTRS["raw"]})
        assert seen[-1].protocol == protocol
        assert seen[-1].params == {
            "QueueUrl": Q,
            "MessageBody": "hi",
            "MessageAttributes": {"a": ATTRS["raw"]},
        }
