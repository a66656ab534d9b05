"""Which requests the Alibaba Cloud MQ edge takes, and how the gateway's own errors are answered
(mqgate.aliyun.edge)."""

from __future__ import annotations

from typing import Any

from mqgate.aliyun import errors
from mqgate.aliyun.detect import is_aliyun_request
from mqgate.aliyun.edge import aliyun_error_of
from mqgate.aliyun.errors import AliyunError
from mqgate.errors import BadRequest, MqgateError, PayloadTooLarge


def scope(path: str, *headers: tuple[bytes, bytes], method: str = "GET") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": list(headers)}


def test_requests_of_this_api_are_told_apart_by_path_and_headers() -> None:
    path = "/topics/orders/messages"
    assert is_aliyun_request(scope(path, (b"authorization", b"MQ LTAI:abc")))
    assert is_aliyun_request(scope(path, (b"x-mq-version", b"2015-06-06"), method="DELETE"))
    assert not is_aliyun_request(scope(path))  # the native API's 404
    assert not is_aliyun_request(scope(path, (b"authorization", b"Bearer mqc_x")))
    assert not is_aliyun_request(scope("/mq/produce", (b"x-mq-version", b"2015-06-06")))


def test_the_gateways_errors_as_the_service_answers() -> None:
    own = AliyunError(errors.TOPIC_NOT_EXIST)
    assert aliyun_error_of(own) is own
    bad = aliyun_error_of(BadRequest("keys are too many", field="keys"))
    assert (bad.kind, bad.element, bad.message) == (errors.INVALID_ARGUMENT, "keys", "keys are too many")
    assert aliyun_error_of(PayloadTooLarge("too big", field="body")).kind is errors.INVALID_ARGUMENT

    class Throttled(MqgateError):
        http_status = 429

    assert aliyun_error_of(Throttled("slow down")).kind is errors.QPS_LIMIT_EXCEEDED
    internal = aliyun_error_of(RuntimeError("bug"))
    assert internal.kind is errors.INTERNAL_ERROR and "bug" not in internal.message
