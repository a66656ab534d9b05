"""What `encode_result` and `encode_error` send, read back by botocore's own clients (its
parsers and error handling) in both protocols, exactly as the service gave it."""

# ruff: noqa: E501  (the case tables read one case a line, wider than the code)
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import botocore.session
import pytest
from botocore.exceptions import ClientError

from mqgate.errors import Unavailable
from mqgate.sqs import errors as e
from mqgate.sqs.answers import batch_error_entry, encode_error, encode_result
from mqgate.sqs.errors import SqsError
from mqgate.sqs.protocol import decode_request
from mqgate.sqs.sigv4 import SignatureDoesNotMatch
from tests.sqs.sqs_wire import client

Q = "http://127.0.0.1:1/000000000000/orders"
MESSAGE = {
    "MessageId": "5fea7756-0ea4-451a-a703-a558b933e274",
    "ReceiptHandle": "AQEB+/=&<>",
    "MD5OfBody": "fafb00f5732ab283681e124bf8747ed1",
    "Body": "line 1\r\nline 2 <&> ✓ 𝄞 \"quoted\" 'single'",
    "Attributes": {
        "SenderId": "AIDAEXAMPLE",
        "SentTimestamp": "1700000000000",
        "ApproximateReceiveCount": "1",
    },
    "MD5OfMessageAttributes": "d25a6aea97eb8f585bfa92d314504a92",
    "MessageAttributes": {
        "color": {"DataType": "String", "StringValue": "blue & green"},
        "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "n": {"DataType": "Number", "StringValue": "1.5"},
    },
}
RESULTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("CreateQueue", {"QueueName": "orders"}, {"QueueUrl": Q}),
    ("GetQueueUrl", {"QueueName": "orders"}, {"QueueUrl": Q}),
    ("ListQueues", {}, {"QueueUrls": [Q, Q + "2"], "NextToken": "next"}),
    ("ListQueues", {}, {}),
    ("GetQueueAttributes", {"QueueUrl": Q, "AttributeNames": ["All"]},
     {"Attributes": {"VisibilityTimeout": "30", "QueueArn": "arn:aws:sqs:us-east-1:000000000000:orders"}}),
    ("ListQueueTags", {"QueueUrl": Q}, {"Tags": {"team": "billing", "env": "prod & <test>"}}),
    ("SendMessage", {"QueueUrl": Q, "MessageBody": "m"},
     {"MD5OfMessageBody": "6f8db599de986fab7a21625b7916589c", "MD5OfMessageAttributes": "a" * 32,
      "MD5OfMessageSystemAttributes": "b" * 32, "MessageId": "id-1", "SequenceNumber": "18849496460467696128"}),
    ("SendMessageBatch", {"QueueUrl": Q, "Entries": [{"Id": "a", "MessageBody": "m"}]},
     {"Successful": [{"Id": "a", "MessageId": "id-1", "MD5OfMessageBody": "6f8db599de986fab7a21625b7916589c"}],
      "Failed": [{"Id": "b", "SenderFault": True, "Code": "InvalidMessageContents", "Message": "bad <chars>"}]}),
    ("ReceiveMessage", {"QueueUrl": Q}, {"Messages": [MESSAGE, {**MESSAGE, "MessageId": "second"}]}),
    ("ReceiveMessage", {"QueueUrl": Q}, {}),
    ("DeleteMessageBatch", {"QueueUrl": Q, "Entries": [{"Id": "a", "ReceiptHandle": "r"}]},
     {"Successful": [{"Id": "a"}], "Failed": []}),
    ("ChangeMessageVisibilityBatch", {"QueueUrl": Q, "Entries": [{"Id": "a", "ReceiptHandle": "r"}]},
     {"Successful": [], "Failed": [{"Id": "a", "SenderFault": False, "Code": "InternalError", "Message": "x"}]}),
    ("ListDeadLetterSourceQueues", {"QueueUrl": Q}, {"queueUrls": [Q], "NextToken": "t"}),
    ("StartMessageMoveTask", {"SourceArn": "arn:aws:sqs:us-east-1:0:dlq"}, {"TaskHandle": "h-1"}),
    ("ListMessageMoveTasks", {"SourceArn": "arn:aws:sqs:us-east-1:0:dlq"},
     {"Results": [{"TaskHandle": "h-1", "Status": "RUNNING", "SourceArn": "arn:aws:sqs:us-east-1:0:dlq",
                   "DestinationArn": "arn:aws:sqs:us-east-1:0:q", "MaxNumberOfMessagesPerSecond": 5,
                   "ApproximateNumberOfMessagesMoved": 2**40, "ApproximateNumberOfMessagesToMove": 7,
                   "StartedTimestamp": 1700000000000}]}),
    ("CancelMessageMoveTask", {"TaskHandle": "h-1"}, {"ApproximateNumberOfMessagesMoved": 12}),
    ("DeleteQueue", {"QueueUrl": Q}, {}),
    ("PurgeQueue", {"QueueUrl": Q}, {}),
    ("SetQueueAttributes", {"QueueUrl": Q, "Attributes": {"DelaySeconds": "1"}}, {}),
    ("TagQueue", {"QueueUrl": Q, "Tags": {"a": "b"}}, {}),
    ("UntagQueue", {"QueueUrl": Q, "TagKeys": ["a"]}, {}),
    ("DeleteMessage", {"QueueUrl": Q, "ReceiptHandle": "r"}, {}),
    ("ChangeMessageVisibility", {"QueueUrl": Q, "ReceiptHandle": "r", "VisibilityTimeout": 1}, {}),
]  # fmt: skip
_METHODS = {
    name: botocore.session.get_session().get_service_model("sqs").operation_model(name)
    for name, _, _ in RESULTS
}


def _snake(action: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")


def _serving(result: dict[str, Any] | None = None, error: BaseException | None = None) -> Any:
    def answer(request: Any) -> tuple[int, dict[str, str], bytes]:
        url = urlsplit(request.url)
        decoded = decode_request(request.method, url.path, url.query, dict(request.headers), request.body)
        if error is not None:
            return encode_error(decoded, error)
        return encode_result(decoded, decoded.action, result)

    return answer


@pytest.mark.parametrize("protocol", ["json", "query"])
@pytest.mark.parametrize(
    ("action", "params", "result"), RESULTS, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(RESULTS)]
)
def test_botocore_reads_the_result_back(
    protocol: str, action: str, params: dict[str, Any], result: dict[str, Any], tmp_path: Path
) -> None:
    sqs = client(protocol, _serving(result), tmp_path)
    got = getattr(sqs, _snake(action))(**params)
    metadata = got.pop("ResponseMetadata")
    assert metadata["HTTPStatusCode"] == 200
    assert metadata["RequestId"]
    if action in ("DeleteMessageBatch", "ChangeMessageVisibilityBatch", "SendMessageBatch"):
        got = {k: v for k, v in got.items() if v}  # the query parser leaves an empty list out
        result = {k: v for k, v in result.items() if v}
    assert got == result


def test_the_request_id_is_in_the_header_and_the_xml(tmp_path: Path) -> None:
    request = decode_request(
        "POST",
        "/",
        "",
        {"Content-Type": "application/x-www-form-urlencoded"},
        b"Action=GetQueueUrl&QueueName=q",
    )
    status, headers, body = encode_result(request, "GetQueueUrl", {"QueueUrl": Q})
    assert status == 200 and headers["x-amzn-RequestId"] == request.request_id
    assert f"<RequestId>{request.request_id}</RequestId>" in body.decode()
    assert body.decode().startswith(
        '<?xml version="1.0"?><GetQueueUrlResponse xmlns="http://queue.amazonaws.com'
    )


ERRORS: list[tuple[BaseException, str, str, int]] = [
    # error, the code botocore shows in the JSON protocol, in the query protocol, status
    (e.queue_does_not_exist(), "AWS.SimpleQueueService.NonExistentQueue", "AWS.SimpleQueueService.NonExistentQueue", 400),
    (SqsError(e.QUEUE_NAME_EXISTS, "exists"), "QueueAlreadyExists", "QueueAlreadyExists", 400),
    (SqsError(e.PURGE_QUEUE_IN_PROGRESS, "wait"), "AWS.SimpleQueueService.PurgeQueueInProgress",
     "AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    (SqsError(e.RECEIPT_HANDLE_IS_INVALID, "bad <handle>"), "ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 400),
    (SqsError(e.OVER_LIMIT, "too many"), "OverLimit", "OverLimit", 403),
    (e.missing_parameter("QueueUrl"), "MissingParameter", "MissingParameter", 400),
    (e.invalid_parameter_value("no"), "InvalidParameterValue", "InvalidParameterValue", 400),
    (SqsError(e.INVALID_ACTION, "no"), "UnknownOperationException", "InvalidAction", 400),
    (SignatureDoesNotMatch("mismatch"), "SignatureDoesNotMatch", "SignatureDoesNotMatch", 403),
    (Unavailable("redis down"), "ServiceUnavailable", "ServiceUnavailable", 503),
    (RuntimeError("secret detail"), "InternalError", "InternalError", 500),
]  # fmt: skip


@pytest.mark.parametrize("protocol", ["json", "query"])
@pytest.mark.parametrize(
    ("error", "json_code", "query_code", "status"), ERRORS, ids=[repr(x[0])[:40] for x in ERRORS]
)
def test_botocore_reads_the_error_back(
    protocol: str, error: BaseException, json_code: str, query_code: str, status: int, tmp_path: Path
) -> None:
    sqs = client(protocol, _serving(error=error), tmp_path)
    with pytest.raises(ClientError) as caught:
        sqs.get_queue_url(QueueName="orders")
    response = caught.value.response
    assert response["Error"]["Code"] == (json_code if protocol == "json" else query_code)
    assert response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert response["ResponseMetadata"]["RequestId"]
    if isinstance(error, SqsError):
        assert response["Error"]["Message"] == error.message
    else:
        assert "secret" not in response["Error"]["Message"]
    if protocol == "json" and error is ERRORS[0][0]:
        # The awsQueryCompatible mapping: the legacy code shown, the modeled exception raised.
        assert isinstance(caught.value, sqs.exceptions.QueueDoesNotExist)
        assert response["Error"]["Type"] == "Sender"
        assert response["Error"]["QueryErrorCode"] == "QueueDoesNotExist"


def test_decode_errors_are_answered_in_the_detected_protocol() -> None:
    from mqgate.sqs.protocol import detect_protocol

    headers = {"X-Amz-Target": "AmazonSQS.Nope"}
    with pytest.raises(SqsError) as caught:
        decode_request("POST", "/", "", headers, b"{}")
    status, out_headers, body = encode_error(detect_protocol(headers), caught.value)
    assert status == 400 and b"com.amazon.coral.service#UnknownOperationException" in body
    assert "x-amzn-query-error" not in out_headers
    status, out_headers, body = encode_error("query", e.missing_parameter("QueueUrl"))
    assert b"<Type>Sender</Type><Code>MissingParameter</Code>" in body and b"<Detail/>" in body
    status, out_headers, body = encode_error("json", e.missing_parameter("QueueUrl"))
    assert out_headers["x-amzn-query-error"] == "MissingParameter;Sender"


def test_a_batch_failure_entry() -> None:
    entry = batch_error_entry("a", SqsError(e.INVALID_MESSAGE_CONTENTS, "bad"))
    assert entry == {"Id": "a", "SenderFault": True, "Code": "InvalidMessageContents", "Message": "bad"}


def test_sts_get_caller_identity_round_trip() -> None:
    identity = {"UserId": "AIDAEXAMPLE", "Account": "000000000000", "Arn": "arn:aws:iam::000000000000:user/x"}
    sts = client("query", _serving(identity), service="sts")
    got = sts.get_caller_identity()
    got.pop("ResponseMetadata")
    assert got == identity
    request = decode_request("POST", "/", "", {}, b"Action=GetCallerIdentity&Version=2011-06-15")
    _, _, body = encode_result(request, "GetCallerIdentity", identity)
    assert b'xmlns="https://sts.amazonaws.com/doc/2011-06-15/"' in body
    _, _, body = encode_error(request, SqsError(e.INVALID_CLIENT_TOKEN_ID, "bad key"))
    assert b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">' in body
