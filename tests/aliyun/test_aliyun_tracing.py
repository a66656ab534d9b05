"""Aliyun MQ traffic is traced and counted like native traffic (issue 32, "done when"): a
project's trace policy matches its instance's topics, and a message's path shows its publish,
each consume (its consumed times as the attempt) and its ack, found by its MessageId; every
request is counted in the gateway's metrics by operation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from mq_http_sdk.mq_exception import MQServerException
from mq_http_sdk.mq_producer import TopicMessage

from tests.aliyun import test_aliyun_sdk
from tests.aliyun.test_aliyun_sdk import Instances, consume_until
from tests.conftest import Server, wait_until
from tests.sqs.test_sqs_tracing import traces

pytestmark = pytest.mark.slow
srv = test_aliyun_sdk.srv  # the same gateways, one per store
instance = test_aliyun_sdk.instance


def test_a_message_s_path_through_the_aliyun_api_is_traced(srv: Server, instance: Instances) -> None:
    inst = instance(srv, lock_timeout_s=1.0)
    srv.admin("POST", "/admin/trace-policies", mode="project", project=inst.project, level="info")
    msg_id = inst.producer().publish_message(TopicMessage("follow me", "TagA")).message_id
    consumer = inst.consumer()
    (first,) = consume_until(consumer, 1)
    # Not acked: it comes again after the group's invisible time, its consumed times raised.
    (second,) = consume_until(consumer, 1)
    assert first.message_id == second.message_id == msg_id and second.consumed_times == 2
    consumer.ack_message([second.receipt_handle])

    def acked() -> dict[str, Any] | None:
        found = traces(srv, msgId=msg_id)
        hops = [h["hop"] for h in found["paths"][0]["hops"]] if found["paths"] else []
        return found["paths"][0] if "acked" in hops else None

    path = wait_until(acked, 20, "the ack to be traced")
    hops = [h["hop"] for h in path["hops"]]
    assert hops.index("accepted") < hops.index("stored") < hops.index("delivered") < hops.index("acked"), hops
    delivered = [h for h in path["hops"] if h["hop"] == "delivered"]
    assert len(delivered) == 2 and {h["consumer"] for h in delivered} == {inst.group}
    assert [h.get("attempt") for h in delivered] == [1, 2]
    assert path["project"] == inst.project


def metric(server: Server, name: str, **labels: str) -> float:
    """The value of a metric's series with these labels (0 when it has none yet)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_every_request_is_counted(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    before = metric(srv, "mqgate_request_seconds_count", route="aliyun publish")
    inst.producer().publish_message(TopicMessage("counted"))
    assert metric(srv, "mqgate_request_seconds_count", route="aliyun publish") == before + 1
    refused = metric(srv, "mqgate_errors_total", route="aliyun publish", status="403")
    wrong = inst.client(secret="not-the-secret").get_producer(inst.project, inst.topic)
    with pytest.raises(MQServerException):
        wrong.publish_message(TopicMessage("refused"))
    assert metric(srv, "mqgate_errors_total", route="aliyun publish", status="403") == refused + 1
