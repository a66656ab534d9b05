"""Every SQS action on a message is traced like native traffic (issue 30): a project's trace
policy matches its SQS queues, and a message's path shows its send, each receive (its receive
count as the attempt) and its delete, found by its MessageId."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Server, wait_until
from tests.sqs import test_sqs_boto3
from tests.sqs.test_sqs_boto3 import make_key, sqs

pytestmark = pytest.mark.slow
srv = test_sqs_boto3.srv  # the same gateways, one per store


def traces(server: Server, **query: str) -> dict[str, Any]:
    h = {"Authorization": f"Bearer {server.admin_token}"}
    r = httpx.get(server.url + "/admin/traces", params=query, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["result"])


def test_a_message_s_sqs_path_is_traced(srv: Server) -> None:
    key = make_key(srv, "app-traced", "sqstraced")
    srv.admin("POST", "/admin/trace-policies", mode="project", project="sqstraced", level="info")
    client = sqs(srv, key)
    url = client.create_queue(QueueName="traced")["QueueUrl"]
    msg_id = client.send_message(QueueUrl=url, MessageBody="follow me")["MessageId"]
    (first,) = client.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=5)["Messages"]
    (second,) = client.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert first["MessageId"] == second["MessageId"] == msg_id
    client.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])

    def acked() -> dict[str, Any] | None:
        found = traces(srv, msgId=msg_id)
        hops = [h["hop"] for h in found["paths"][0]["hops"]] if found["paths"] else []
        return found["paths"][0] if "acked" in hops else None

    path = wait_until(acked, 20, "the delete to be traced")
    hops = [h["hop"] for h in path["hops"]]
    assert hops.index("accepted") < hops.index("stored") < hops.index("delivered") < hops.index("acked"), hops
    delivered = [h for h in path["hops"] if h["hop"] == "delivered"]
    assert len(delivered) == 2 and {h["consumer"] for h in delivered} == {f"sqs.{key['account']}.traced.c"}
    assert [h.get("attempt") for h in delivered] == [1, 2]
    assert path["project"] == "sqstraced"
