"""The native half-message routes and the Aliyun API's transactions act on the same half
messages (one store per topic, transactions/): a half message published with the official Python
SDK is checked and committed natively and delivered to the SDK's group; one put natively is
offered to the SDK's `consume_half_message` and rolled back with it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mq_http_sdk.mq_exception import MQServerException
from mq_http_sdk.mq_producer import TopicMessage

from tests.aliyun.test_aliyun_sdk import Instance, consume_until, new_instance, nothing_to_consume
from tests.conftest import Server

pytestmark = pytest.mark.slow


@pytest.fixture
def inst(shared_server: Server) -> Iterator[Instance]:
    i = new_instance(shared_server)
    yield i
    i.close()


def test_half_messages_are_shared_by_the_aliyun_api_and_the_native_routes(
    shared_server: Server, inst: Instance
) -> None:
    ptoken = shared_server.admin("POST", "/admin/producers", name=f"{inst.topic}-p", topic=inst.topic)[
        "token"
    ]
    http = httpx.Client(base_url=shared_server.url, timeout=40, headers={"Authorization": f"Bearer {ptoken}"})
    producer = f"{inst.topic}-p"

    def native(path: str, **body: Any) -> Any:
        r = http.post(path, json={"producer": producer, **body})
        assert r.status_code == 200, r.text
        return r.json()["result"]

    try:
        trans = inst.client().get_trans_producer(inst.project, inst.topic, inst.group)
        msg = TopicMessage("from the SDK", "TagA")
        msg.set_trans_check_immunity_time(0)
        msg.put_property("p", "v")
        sent = trans.publish_message(msg)
        checked: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while not checked:
            assert time.monotonic() < deadline, "the SDK's half message never offered to a native check"
            checked = native("/mq/half/check", wait=1.0)["messages"]
        (c,) = checked
        assert c["messageId"] == sent.message_id and c["message"] == "from the SDK" and c["tags"] == ["TagA"]
        assert c["properties"]["p"] == "v"
        assert native("/mq/half/commit", handle=c["handle"])["outcome"] == "committed"
        consumer = inst.consumer()
        (m,) = consume_until(consumer, 1)
        assert (m.message_body, m.message_tag, m.get_property("p")) == ("from the SDK", "TagA", "v")
        consumer.ack_message([m.receipt_handle])
        # The other way: put natively, checked and rolled back through the SDK.
        (put,) = native("/mq/half", checkAfterS=0, messages=[{"message": "native"}])["messages"]
        popped: list[Any] = []
        deadline = time.monotonic() + 20
        while not popped:
            assert time.monotonic() < deadline, "the native half message never offered to the SDK"
            try:
                popped = trans.consume_half_message(16, 1)
            except MQServerException as exc:
                assert exc.type == "MessageNotExist"
        assert [(p.message_id, p.message_body) for p in popped] == [(put["messageId"], "native")]
        trans.rollback(popped[0].receipt_handle)
        again = http.post("/mq/half/commit", json={"producer": producer, "handle": put["handle"]})
        assert again.status_code == 409 and again.json()["result"]["code"] == "already_decided"
        assert nothing_to_consume(consumer, 1)
    finally:
        http.close()
