"""FIFO queues driven by boto3 unchanged (issue 30): each message group in order with one batch
of it in flight at a time, five-minute deduplication by id or content (kept across a kill -9:
the log is its record), sequence numbers, and AWS's errors for what a FIFO queue refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from tests.conftest import STORES, Server, store_server
from tests.sqs import test_sqs_boto3
from tests.sqs.test_sqs_boto3 import code_of, make_key, sqs

pytestmark = pytest.mark.slow
srv = test_sqs_boto3.srv  # the same gateways, one per store
FIFO = {"FifoQueue": "true"}


def refused(call: Any, **kw: Any) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call(**kw)
    return code_of(caught.value)


def receive(client: Any, url: str, **kw: Any) -> list[dict[str, Any]]:
    got = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], **kw
    )
    return list(got.get("Messages", []))


def test_a_fifo_queue_and_what_it_refuses(srv: Server) -> None:
    client = sqs(srv, make_key(srv, "app-fifo-rules", "sqsfifo1"))
    assert refused(client.create_queue, QueueName="jobs.fifo") == "InvalidParameterValue"  # FifoQueue unsaid
    assert refused(client.create_queue, QueueName="jobs", Attributes=FIFO) == "InvalidParameterValue"
    plain = client.create_queue(QueueName="plain")["QueueUrl"]
    code = refused(
        client.set_queue_attributes, QueueUrl=plain, Attributes={"ContentBasedDeduplication": "true"}
    )
    assert code == "InvalidAttributeName"
    url = client.create_queue(QueueName="jobs.fifo", Attributes=FIFO)["QueueUrl"]
    assert url.endswith("/jobs.fifo")
    shown = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (shown["FifoQueue"], shown["ContentBasedDeduplication"], shown["DeduplicationScope"]) == (
        "true",
        "false",
        "queue",
    )
    # The same queue again is the same queue; a different FIFO setting is another.
    assert client.create_queue(QueueName="jobs.fifo", Attributes=FIFO)["QueueUrl"] == url
    code = refused(
        client.create_queue, QueueName="jobs.fifo", Attributes={**FIFO, "ContentBasedDeduplication": "true"}
    )
    assert code == "QueueAlreadyExists"
    assert refused(client.send_message, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d") == (
        "MissingParameter"
    )
    assert (
        refused(client.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="g")
        == "InvalidParameterValue"
    )
    code = refused(
        client.send_message,
        QueueUrl=url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="d",
        DelaySeconds=5,
    )
    assert code == "InvalidParameterValue"
    assert (
        refused(client.set_queue_attributes, QueueUrl=url, Attributes={"DelaySeconds": "5"})
        == "InvalidAttributeValue"
    )
    code = refused(client.set_queue_attributes, QueueUrl=url, Attributes={"DeduplicationScope": "everywhere"})
    assert code == "InvalidAttributeValue"
    # A batch entry breaking a FIFO rule fails alone.
    answer = client.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "fine", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
            {"Id": "nogroup", "MessageBody": "lost", "MessageDeduplicationId": "2"},
        ],
    )
    assert [s["Id"] for s in answer["Successful"]] == ["ok"]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [("nogroup", "MissingParameter")]


def test_each_group_in_order_one_batch_in_flight(srv: Server) -> None:
    client = sqs(srv, make_key(srv, "app-fifo-order", "sqsfifo2"))
    url = client.create_queue(
        QueueName="orders.fifo", Attributes={**FIFO, "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    groups = [f"g{i}" for i in range(6)]
    sequences: dict[str, list[int]] = {g: [] for g in groups}
    for n in range(5):
        entries = [{"Id": g, "MessageBody": f"{g}-{n}", "MessageGroupId": g} for g in groups]
        answer = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not answer.get("Failed"), answer
        for s in answer["Successful"]:
            sequences[s["Id"]].append(int(s["SequenceNumber"]))
    for g in groups:
        assert sequences[g] == sorted(set(sequences[g])), sequences[g]  # increasing in a group

    seen: dict[str, list[int]] = {g: [] for g in groups}
    in_flight: dict[str, list[dict[str, Any]]] = {}
    rounds = 0
    while sum(len(v) for v in seen.values()) < 30:
        rounds += 1
        assert rounds < 100, seen
        got = receive(client, url, VisibilityTimeout=60)
        for m in got:
            group = m["Attributes"]["MessageGroupId"]
            assert group not in in_flight, f"{group} received while a batch of it is in flight"
        batch: dict[str, list[dict[str, Any]]] = {}
        for m in got:
            batch.setdefault(m["Attributes"]["MessageGroupId"], []).append(m)
        in_flight.update(batch)
        for group, msgs in batch.items():
            seen[group] += [int(m["Body"].split("-")[1]) for m in msgs]
            assert msgs[0]["Attributes"]["MessageDeduplicationId"]  # the body's hash
            numbers = [int(m["Attributes"]["SequenceNumber"]) for m in msgs]
            assert numbers == sorted(numbers)
        # Delete the oldest group in flight: it may go on, the others stay held.
        if in_flight:
            done = sorted(in_flight)[0]
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(in_flight.pop(done))
            ]
            assert not client.delete_message_batch(QueueUrl=url, Entries=entries).get("Failed")
    assert seen == {g: [0, 1, 2, 3, 4] for g in groups}

    # A batch let go comes back first and in order, its count raised.
    client.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(i), "MessageBody": f"r-{i}", "MessageGroupId": "r"} for i in range(3)],
    )
    for handles in in_flight.values():
        for m in handles:
            client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    first = receive(client, url, VisibilityTimeout=0)
    assert [m["Body"] for m in first] == ["r-0", "r-1", "r-2"]
    again = receive(client, url, VisibilityTimeout=60)
    assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again] == [
        ("r-0", "2"),
        ("r-1", "2"),
        ("r-2", "2"),
    ]


def test_deduplication_by_id_content_and_group(srv: Server) -> None:
    client = sqs(srv, make_key(srv, "app-fifo-dedup", "sqsfifo3"))
    url = client.create_queue(QueueName="pay.fifo", Attributes=FIFO)["QueueUrl"]
    one = client.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g", MessageDeduplicationId="x")
    two = client.send_message(QueueUrl=url, MessageBody="b", MessageGroupId="g", MessageDeduplicationId="x")
    assert (two["MessageId"], two["SequenceNumber"]) == (one["MessageId"], one["SequenceNumber"])
    # Within one batch too.
    answer = client.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "1", "MessageBody": "c", "MessageGroupId": "g", "MessageDeduplicationId": "y"},
            {"Id": "2", "MessageBody": "c", "MessageGroupId": "h", "MessageDeduplicationId": "y"},
        ],
    )
    ids = {s["Id"]: s["MessageId"] for s in answer["Successful"]}
    assert ids["1"] == ids["2"]
    assert sorted(m["Body"] for m in receive(client, url)) == ["a", "c"]

    client.set_queue_attributes(
        QueueUrl=url, Attributes={"ContentBasedDeduplication": "true", "DeduplicationScope": "messageGroup"}
    )
    client.purge_queue(QueueUrl=url)
    first = client.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g1")
    assert (
        client.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g1")["MessageId"]
        == first["MessageId"]
    )
    other = client.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g2")  # scope: the group
    assert other["MessageId"] != first["MessageId"]


@pytest.fixture(params=STORES)
def own_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    server, cleanup = store_server(tmp_path / "data", request.param)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        cleanup()


def test_deduplication_survives_a_kill(own_server: Server) -> None:
    key = make_key(own_server, "app-fifo-kill", "sqsfifo4")
    client = sqs(own_server, key)
    url = client.create_queue(QueueName="kept.fifo", Attributes=FIFO)["QueueUrl"]
    sent = [
        client.send_message(
            QueueUrl=url, MessageBody=f"m{i}", MessageGroupId=f"g{i % 3}", MessageDeduplicationId=f"d{i}"
        )
        for i in range(20)
    ]
    own_server.kill9()
    own_server.start()
    client = sqs(own_server, key)
    for i in (0, 7, 19):  # a retry after the restart is still a duplicate, answered as before
        again = client.send_message(
            QueueUrl=url, MessageBody=f"m{i}", MessageGroupId=f"g{i % 3}", MessageDeduplicationId=f"d{i}"
        )
        assert (again["MessageId"], again["SequenceNumber"]) == (
            sent[i]["MessageId"],
            sent[i]["SequenceNumber"],
        )
    bodies: list[str] = []
    while True:
        got = receive(client, url)
        if not got:
            break
        bodies += [m["Body"] for m in got]
        client.delete_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
        )
    assert sorted(bodies) == sorted(f"m{i}" for i in range(20))
