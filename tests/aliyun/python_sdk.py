"""The official Python SDK (`mq-http-sdk` 1.0.3, pinned in requirements/dev.lock) driven without a
network: its HTTP layer is replaced by a function that records each request the SDK built and
signed, and answers it with what the test gives (mqgate's encoders' XML)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mq_http_sdk.mq_client import MQClient
from mq_http_sdk.mq_http import RequestInternal, ResponseInternal

from mqgate.aliyun import xml as mqxml


@dataclass
class Sent:
    method: str
    uri: str
    headers: dict[str, str]
    body: bytes


Answer = tuple[int, bytes]  # status, body
Responder = Callable[[Sent], Answer]


def default_answer(sent: Sent) -> Answer:
    if sent.method == "POST":
        return 201, mqxml.encode_publish_result("0A0B0C0D", mqxml.message_body_md5("x"), "")
    if sent.method == "GET":
        message = mqxml.ConsumedMessage("0A0B0C0D", "RH-1", "x", 1, 2, 3, 1)
        return 200, mqxml.encode_consume_result([message])
    return 204, b""


@dataclass
class Recorder:
    """Stands in for the SDK's MQHttp.send_request."""

    answer: Responder = default_answer
    sent: list[Sent] = field(default_factory=list)

    def __call__(self, request: RequestInternal) -> ResponseInternal:
        data = request.data
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        sent = Sent(request.method, request.uri, dict(request.header), body)
        self.sent.append(sent)
        status, answer = self.answer(sent)
        headers = {mqxml.REQUEST_ID_HEADER: "REQ-1"}
        if answer:
            headers["content-type"] = mqxml.CONTENT_TYPE
        return ResponseInternal(status=status, header=headers, data=answer)


def client(access_key_id: str, secret: str, recorder: Recorder, security_token: str = "") -> MQClient:
    c = MQClient("http://mq.example.test", access_key_id, secret, security_token=security_token)
    c.http.send_request = recorder
    return c
