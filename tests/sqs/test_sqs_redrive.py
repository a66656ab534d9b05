"""Dead-letter queues between SQS queues, driven by boto3 unchanged (issue 30): RedrivePolicy
moves a message received once more than maxReceiveCount to its dead-letter queue (its id, body
and attributes kept), RedriveAllowPolicy decides who may use a queue as one,
ListDeadLetterSourceQueues lists the sources, and a message move task sends dead letters back."""

from __future__ import annotations

import json
import time
from typing import Any

import botocore.exceptions
import pytest

from tests.conftest import Server
from tests.sqs import test_sqs_boto3
from tests.sqs.test_sqs_boto3 import code_of, make_key, sqs

pytestmark = pytest.mark.slow
srv = test_sqs_boto3.srv  # the same gateways, one per store
UNSUPPORTED = "AWS.SimpleQueueService.UnsupportedOperation"  # as botocore names it


def arn(client: Any, url: str) -> str:
    return str(
        client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    )


def receive(client: Any, url: str, **kw: Any) -> list[dict[str, Any]]:
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, **kw)
    return list(got.get("Messages", []))


def refused(call: Any, **kw: Any) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call(**kw)
    return code_of(caught.value)


def test_a_message_received_too_often_moves_to_its_dead_letter_queue_and_back(srv: Server) -> None:
    key = make_key(srv, "app-redrive", "sqsredrive")
    client = sqs(srv, key)
    dlq = client.create_queue(QueueName="orders-dlq")["QueueUrl"]
    src = client.create_queue(QueueName="orders")["QueueUrl"]
    policy = {"deadLetterTargetArn": arn(client, dlq), "maxReceiveCount": 2}
    client.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": json.dumps(policy)})
    shown = client.get_queue_attributes(QueueUrl=src, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(shown["RedrivePolicy"]) == policy
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    assert client.list_dead_letter_source_queues(QueueUrl=src)["queueUrls"] == []

    sent = client.send_message(
        QueueUrl=src,
        MessageBody="poison",
        MessageAttributes={"kind": {"DataType": "String", "StringValue": "bad"}},
    )
    for count in (1, 2):  # received twice (maxReceiveCount), each time let go at once
        (m,) = receive(client, src, VisibilityTimeout=0, AttributeNames=["ApproximateReceiveCount"])
        assert m["MessageId"] == sent["MessageId"]
        assert m["Attributes"]["ApproximateReceiveCount"] == str(count)
    assert receive(client, src) == []  # the third receive moved it instead
    (dead,) = receive(client, dlq, MessageAttributeNames=["All"], WaitTimeSeconds=5)
    assert (dead["MessageId"], dead["Body"]) == (sent["MessageId"], "poison")
    # Its attributes as sent, and nothing of the move's own marks (boto3 checks the MD5 too).
    assert dead["MessageAttributes"] == {"kind": {"DataType": "String", "StringValue": "bad"}}
    client.change_message_visibility(QueueUrl=dlq, ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0)

    # A move task sends it back to the queue it came from.
    dlq_arn = arn(client, dlq)
    handle = client.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    deadline = time.monotonic() + 30
    while True:
        (task,) = client.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        if task["Status"] != "RUNNING":
            break
        assert time.monotonic() < deadline, task
    assert task["TaskHandle"] == handle
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1), task
    assert task["ApproximateNumberOfMessagesToMove"] == 1
    (back,) = receive(client, src, MessageAttributeNames=["All"], WaitTimeSeconds=5)
    assert (back["Body"], back["MessageAttributes"]["kind"]["StringValue"]) == ("poison", "bad")
    assert receive(client, dlq) == []
    assert refused(client.cancel_message_move_task, TaskHandle=handle) == UNSUPPORTED  # ended

    # Without a policy the queue keeps its messages however often they are received.
    client.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": ""})
    assert (
        "RedrivePolicy" not in client.get_queue_attributes(QueueUrl=src, AttributeNames=["All"])["Attributes"]
    )
    client.change_message_visibility(QueueUrl=src, ReceiptHandle=back["ReceiptHandle"], VisibilityTimeout=0)
    for _ in range(3):
        (again,) = receive(client, src, VisibilityTimeout=0)
        assert again["Body"] == "poison"
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == []


def test_a_move_task_to_a_destination_paced_and_cancelled(srv: Server) -> None:
    key = make_key(srv, "app-move", "sqsmove")
    client = sqs(srv, key)
    dlq = client.create_queue(QueueName="m-dlq")["QueueUrl"]
    client.create_queue(
        QueueName="m-src",
        Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(client, dlq), "maxReceiveCount": "1"})
        },
    )
    other = client.create_queue(QueueName="m-other")["QueueUrl"]
    for i in range(0, 30, 10):
        entries = [{"Id": str(j), "MessageBody": f"m{i + j}"} for j in range(10)]
        assert not client.send_message_batch(QueueUrl=dlq, Entries=entries).get("Failed")
    dlq_arn = arn(client, dlq)
    # At 10 a second, 30 messages take 2 s or more: cancelled well before the end.
    handle = client.start_message_move_task(
        SourceArn=dlq_arn, DestinationArn=arn(client, other), MaxNumberOfMessagesPerSecond=10
    )["TaskHandle"]
    assert refused(client.start_message_move_task, SourceArn=dlq_arn) == UNSUPPORTED  # one at a time
    moved = client.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 30
    (task,) = client.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert (task["Status"], task["MaxNumberOfMessagesPerSecond"]) == ("CANCELLED", 10)
    assert task["DestinationArn"] == arn(client, other)
    # The task stopped between steps: each message is in one queue or the other, once, and
    # none is left hidden by a step cut short.
    bodies = [
        m["Body"]
        for url in (dlq, other)
        for _ in range(4)
        for m in receive(client, url, VisibilityTimeout=60)
    ]
    assert sorted(bodies) == sorted(f"m{i}" for i in range(30))


def test_policies_are_checked(srv: Server) -> None:
    key = make_key(srv, "app-policy", "sqspolicy")
    client = sqs(srv, key)
    account = key["account"]
    src = client.create_queue(QueueName="p-src")["QueueUrl"]
    locked = client.create_queue(
        QueueName="p-locked", Attributes={"RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"})}
    )["QueueUrl"]
    chosen = client.create_queue(QueueName="p-chosen")["QueueUrl"]
    only = {"redrivePermission": "byQueue", "sourceQueueArns": [arn(client, src)]}
    client.set_queue_attributes(QueueUrl=chosen, Attributes={"RedriveAllowPolicy": json.dumps(only)})
    shown = client.get_queue_attributes(QueueUrl=chosen, AttributeNames=["RedriveAllowPolicy"])["Attributes"]
    assert json.loads(shown["RedriveAllowPolicy"]) == only

    def policy(target: str, count: object = 3) -> dict[str, str]:
        return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": count})}

    bad = [
        policy(arn(client, locked)),  # denyAll
        policy(f"arn:aws:sqs:us-east-1:{account}:nowhere"),  # no such queue
        policy("arn:aws:sqs:us-east-1:000000000000:p-chosen"),  # another account's
        policy(arn(client, chosen), 0),
        policy(arn(client, chosen), 1001),
        policy(arn(client, src)),  # itself
        {"RedrivePolicy": "not json"},
        {"RedrivePolicy": json.dumps({"maxReceiveCount": 3})},
        {"RedriveAllowPolicy": json.dumps({"redrivePermission": "byQueue"})},
        {"RedriveAllowPolicy": json.dumps({"redrivePermission": "sometimes"})},
    ]
    for attributes in bad:
        assert (
            refused(client.set_queue_attributes, QueueUrl=src, Attributes=attributes)
            == "InvalidParameterValue"
        ), attributes
    assert (
        "RedrivePolicy" not in client.get_queue_attributes(QueueUrl=src, AttributeNames=["All"])["Attributes"]
    )
    client.set_queue_attributes(QueueUrl=src, Attributes=policy(arn(client, chosen)))  # byQueue lists it
    other = client.create_queue(QueueName="p-other")["QueueUrl"]
    code = refused(client.set_queue_attributes, QueueUrl=other, Attributes=policy(arn(client, chosen)))
    assert code == "InvalidParameterValue"
    # Move tasks only from a dead-letter queue, and only for a task that exists.
    assert refused(client.start_message_move_task, SourceArn=arn(client, other)) == "InvalidParameterValue"
    assert (
        refused(client.cancel_message_move_task, TaskHandle="bm90LWEtdGFzaw==") == "ResourceNotFoundException"
    )
    missing = f"arn:aws:sqs:us-east-1:{account}:nowhere"
    assert refused(client.list_message_move_tasks, SourceArn=missing) == "ResourceNotFoundException"
