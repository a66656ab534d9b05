"""The SQS API on a real gateway, driven by boto3 unchanged (issue 30): the JSON protocol boto3
speaks today, the query protocol older SDKs speak (botocore with sqs_wire.py's query model),
STS's GetCallerIdentity, and the errors as botocore surfaces them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import botocore.session
import httpx
import pytest
from botocore.config import Config

from tests.conftest import Server, store_server, wait_until
from tests.sqs.sqs_wire import _session

pytestmark = pytest.mark.slow

REGION = "us-east-1"
NO_RETRIES = Config(retries={"total_max_attempts": 1}, read_timeout=60)
AWS_CLI = Path(sys.executable).parent / "aws"


@pytest.fixture(scope="module", params=["embedded", "redis"])
def srv(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Server]:
    server, cleanup = store_server(tmp_path_factory.mktemp("sqs") / "data", request.param)
    server.start()
    yield server
    server.stop()
    cleanup()


def make_key(srv: Server, name: str, project: str) -> dict[str, Any]:
    projects = httpx.get(
        srv.url + "/admin/projects", headers={"Authorization": f"Bearer {srv.admin_token}"}, timeout=10
    ).json()["result"]
    if project not in {p["name"] for p in projects.get("projects", [])}:
        srv.admin("POST", "/admin/projects", name=project)
    key: dict[str, Any] = srv.admin("POST", "/admin/access-keys", name=name, project=project)
    return key


def sqs(srv: Server, key: dict[str, Any], secret: str | None = None) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=srv.url,
        region_name=REGION,
        aws_access_key_id=key["accessKeyId"],
        aws_secret_access_key=secret or key["secretAccessKey"],
        config=NO_RETRIES,
    )


def code_of(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response["Error"]["Code"])


def test_queue_lifecycle_and_messages(srv: Server) -> None:
    key = make_key(srv, "app-life", "sqsp1")
    client = sqs(srv, key)
    account = key["account"]
    url = client.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "40"})["QueueUrl"]
    assert url == f"{srv.url}/{account}/orders"
    # Idempotent with the same attributes; refused with others.
    assert client.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "40"})["QueueUrl"] == url
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        client.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "50"})
    assert code_of(refused.value) == "QueueAlreadyExists"
    assert client.get_queue_url(QueueName="orders")["QueueUrl"] == url

    # Send with attributes: boto3 checks the MD5s it is answered against what it sent.
    sent = client.send_message(
        QueueUrl=url,
        MessageBody="hello",
        DelaySeconds=0,
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "order"},
            "size": {"DataType": "Number", "StringValue": "3"},
            "blob": {"DataType": "Binary.raw", "BinaryValue": b"\x00\x01\xff"},
        },
    )
    assert sent["MessageId"] and sent["MD5OfMessageAttributes"]
    got = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], AttributeNames=["All"],
        WaitTimeSeconds=5,
    )["Messages"]  # fmt: skip
    assert len(got) == 1
    m = got[0]
    assert m["Body"] == "hello" and m["MessageId"] == sent["MessageId"]
    assert m["MessageAttributes"]["blob"] == {"DataType": "Binary.raw", "BinaryValue": b"\x00\x01\xff"}
    assert m["MessageAttributes"]["size"] == {"DataType": "Number", "StringValue": "3"}
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert m["Attributes"]["SenderId"] == key["accessKeyId"]
    assert int(m["Attributes"]["SentTimestamp"]) > 0

    attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["VisibilityTimeout"] == "40"
    assert attrs["QueueArn"] == f"arn:aws:sqs:{REGION}:{account}:orders"

    # Visibility 0: it comes back at once, received a second time.
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    again = client.receive_message(
        QueueUrl=url, AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=5
    )
    m2 = again["Messages"][0]
    assert m2["Attributes"]["ApproximateReceiveCount"] == "2"
    client.delete_message(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"])
    client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])  # stale: success, as AWS
    with pytest.raises(botocore.exceptions.ClientError) as bad:
        client.delete_message(QueueUrl=url, ReceiptHandle="not-a-receipt")
    assert code_of(bad.value) == "ReceiptHandleIsInvalid"

    # A batch: one entry breaking a message rule lands in Failed, the rest is sent.
    batch = client.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {"Id": "b", "MessageBody": "two", "DelaySeconds": 901},
            {"Id": "c", "MessageBody": "three"},
        ],
    )
    assert sorted(s["Id"] for s in batch["Successful"]) == ["a", "c"]
    assert [(f["Id"], f["SenderFault"]) for f in batch["Failed"]] == [("b", True)]

    def received_all() -> list[dict[str, Any]] | None:
        out = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
        received.extend(out)
        return received if len(received) >= 2 else None

    received: list[dict[str, Any]] = []
    wait_until(received_all, 20, "both batch messages received")
    assert sorted(r["Body"] for r in received) == ["one", "three"]
    deleted = client.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": r["ReceiptHandle"]} for i, r in enumerate(received)],
    )
    assert len(deleted["Successful"]) == 2 and deleted["Failed"] == []
    changed = client.change_message_visibility_batch(
        QueueUrl=url, Entries=[{"Id": "x", "ReceiptHandle": "garbage", "VisibilityTimeout": 5}]
    )
    assert changed["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"

    # Long poll: a second thread sends while the receive waits.
    sender = threading.Timer(1.0, lambda: client.send_message(QueueUrl=url, MessageBody="late"))
    sender.start()
    polled = client.receive_message(QueueUrl=url, WaitTimeSeconds=10)
    sender.join()
    assert [p["Body"] for p in polled["Messages"]] == ["late"]

    # Purge: what is left is gone.
    client.send_message(QueueUrl=url, MessageBody="purged")
    client.purge_queue(QueueUrl=url)
    assert client.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []

    # Attributes, tags.
    client.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0", "MaximumMessageSize": "2048"})
    attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize", "DelaySeconds"])
    assert attrs["Attributes"] == {"MaximumMessageSize": "2048", "DelaySeconds": "0"}
    with pytest.raises(botocore.exceptions.ClientError) as big:
        client.send_message(QueueUrl=url, MessageBody="x" * 3000)
    assert code_of(big.value) == "InvalidParameterValue"
    client.tag_queue(QueueUrl=url, Tags={"team": "a", "env": "test"})
    client.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert client.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}

    with pytest.raises(botocore.exceptions.ClientError) as kms:  # kept and ignored would be a lie
        client.set_queue_attributes(QueueUrl=url, Attributes={"KmsMasterKeyId": "alias/aws/sqs"})
    assert code_of(kms.value) in ("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation")

    client.delete_queue(QueueUrl=url)
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName="orders")


def test_list_queues_with_prefix_and_pages(srv: Server) -> None:
    client = sqs(srv, make_key(srv, "app-list", "sqsp2"))
    for name in ("alpha-1", "alpha-2", "alpha-3", "beta-1"):
        client.create_queue(QueueName=name)
    assert len(client.list_queues(QueueNamePrefix="alpha")["QueueUrls"]) == 3
    first = client.list_queues(QueueNamePrefix="alpha", MaxResults=2)
    assert len(first["QueueUrls"]) == 2 and first["NextToken"]
    rest = client.list_queues(QueueNamePrefix="alpha", MaxResults=2, NextToken=first["NextToken"])
    assert len(rest["QueueUrls"]) == 1 and "NextToken" not in rest
    assert {u.rsplit("/", 1)[1] for u in first["QueueUrls"] + rest["QueueUrls"]} == {
        "alpha-1",
        "alpha-2",
        "alpha-3",
    }
    pages = client.get_paginator("list_queues").paginate(PaginationConfig={"PageSize": 1})
    assert len([u for page in pages for u in page.get("QueueUrls", [])]) == 4


def test_identity_and_refusals(srv: Server) -> None:
    key = make_key(srv, "app-ident", "sqsp3")
    other = make_key(srv, "app-other", "sqsp4")
    sts = boto3.client(
        "sts", endpoint_url=srv.url, region_name=REGION, aws_access_key_id=key["accessKeyId"],
        aws_secret_access_key=key["secretAccessKey"], config=NO_RETRIES,
    )  # fmt: skip
    me = sts.get_caller_identity()
    assert me["Account"] == key["account"] and me["UserId"] == key["accessKeyId"]
    assert me["Arn"] == f"arn:aws:iam::{key['account']}:user/app-ident"

    client = sqs(srv, key)
    url = client.create_queue(QueueName="private")["QueueUrl"]
    with pytest.raises(botocore.exceptions.ClientError) as wrong:
        sqs(srv, key, secret="x" * 40).list_queues()
    assert code_of(wrong.value) == "SignatureDoesNotMatch"
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName="never-made")
    # Another project's key: the queue is not there for it, by URL or by name.
    stranger = sqs(srv, other)
    with pytest.raises(stranger.exceptions.QueueDoesNotExist):
        stranger.send_message(QueueUrl=url, MessageBody="intrusion")
    with pytest.raises(stranger.exceptions.QueueDoesNotExist):
        stranger.get_queue_url(QueueName="private", QueueOwnerAWSAccountId=key["account"])
    assert stranger.list_queues().get("QueueUrls", []) == []
    # No native topic can squat this account's SQS names (test_the_native_doors_refuse_...).
    body = {"name": f"sqs.{key['account']}.squat", "queues": 1, "project": "sqsp4"}
    headers = {"Authorization": f"Bearer {srv.admin_token}"}
    squat = httpx.post(srv.url + "/admin/topics", json=body, headers=headers, timeout=10)
    assert squat.status_code == 400, squat.text
    assert client.create_queue(QueueName="squat")["QueueUrl"].endswith("/squat")
    # A receipt of another queue deletes nothing here.
    other_url = client.create_queue(QueueName="private-2")["QueueUrl"]
    client.send_message(QueueUrl=other_url, MessageBody="x")
    handle = client.receive_message(QueueUrl=other_url, WaitTimeSeconds=5)["Messages"][0]["ReceiptHandle"]
    with pytest.raises(botocore.exceptions.ClientError) as foreign:
        client.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert code_of(foreign.value) == "ReceiptHandleIsInvalid"
    # A revoked key.
    srv.admin("DELETE", "/admin/access-keys/app-other")
    with pytest.raises(botocore.exceptions.ClientError) as revoked:
        stranger.list_queues()
    assert code_of(revoked.value) == "InvalidClientTokenId"
    # The SQS API does not take the console's place: GET / still redirects.
    home = httpx.get(srv.url + "/", follow_redirects=False, timeout=10)
    assert home.status_code in (302, 303, 307)
    samples = httpx.get(srv.url + "/metrics", timeout=10).text
    assert 'mqgate_sqs_requests_total{action="CreateQueue",outcome="ok"}' in samples


def test_query_protocol(srv: Server, tmp_path: Path) -> None:
    key = make_key(srv, "app-query", "sqsp5")
    session: botocore.session.Session = _session("query", tmp_path, "sqs")
    client = session.create_client(
        "sqs", region_name=REGION, endpoint_url=srv.url, aws_access_key_id=key["accessKeyId"],
        aws_secret_access_key=key["secretAccessKey"], config=NO_RETRIES,
    )  # fmt: skip
    url = client.create_queue(QueueName="legacy", tags={"t": "1"})["QueueUrl"]
    client.send_message(
        QueueUrl=url,
        MessageBody="via query",
        MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}},
    )
    m = client.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=5)["Messages"][0]
    assert m["Body"] == "via query" and m["MessageAttributes"]["k"]["StringValue"] == "v"
    client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert client.list_queue_tags(QueueUrl=url)["Tags"] == {"t": "1"}
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        client.get_queue_url(QueueName="nope")
    assert code_of(missing.value) == "AWS.SimpleQueueService.NonExistentQueue"


@pytest.mark.skipif(not AWS_CLI.exists(), reason="the AWS CLI is not installed in the environment")
def test_aws_cli(srv: Server) -> None:
    key = make_key(srv, "app-cli", "sqsp6")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": key["accessKeyId"],
        "AWS_SECRET_ACCESS_KEY": key["secretAccessKey"],
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }

    def aws(*args: str) -> str:
        done = subprocess.run(
            [str(AWS_CLI), "--endpoint-url", srv.url, "--output", "text", "sqs", *args],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    url = aws("create-queue", "--queue-name", "cli", "--query", "QueueUrl")
    aws("send-message", "--queue-url", url, "--message-body", "from the cli")
    body = aws(
        "receive-message", "--queue-url", url, "--wait-time-seconds", "5", "--query", "Messages[0].Body"
    )
    assert body == "from the cli"


def test_who_signs_is_checked_before_the_body(srv: Server) -> None:
    """No credential, or a key that is not one of ours, is refused before a byte of the body is
    taken: a body over the SQS request limit gets the credential's error, not the body's."""
    import httpx

    huge = b"Action=ListQueues&x=" + b"a" * (4 * 1024 * 1024)
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(srv.url + "/", content=huge, headers=form, timeout=30)
    assert r.status_code == 403 and b"MissingAuthenticationToken" in r.content, r.text[:300]
    scope = "MQGAAAAAAAAAAAAAAAAA/20261128/us-east-1/sqs/aws4_request"
    unknown = f"AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders=host, Signature=00"
    r = httpx.post(srv.url + "/", content=huge, headers={**form, "authorization": unknown}, timeout=30)
    assert r.status_code == 403 and b"InvalidClientTokenId" in r.content, r.text[:300]


def test_the_native_doors_refuse_the_names_sqs_queues_use(srv: Server) -> None:
    """`sqs.` names are the SQS API's: a native topic there could stand where an account's queue
    would be. The API (and the console and applications, through the same topology) refuse them."""
    headers = {"Authorization": f"Bearer {srv.admin_token}"}
    srv.admin("POST", "/admin/topics", name="native-t", queues=1)
    for path, body in (
        ("/admin/topics", {"name": "sqs.123456789012.q", "queues": 1}),
        ("/admin/producers", {"name": "sqs.123456789012.q.p", "topic": "native-t"}),
        ("/admin/consumers", {"name": "sqs.123456789012.q.c", "topic": "native-t"}),
        ("/admin/topics", {"name": "aliyun.half.orders", "queues": 1}),  # the Aliyun API's
        ("/admin/consumers", {"name": "aliyun.op.orders", "topic": "native-t"}),
    ):
        r = httpx.post(srv.url + path, json=body, headers=headers, timeout=10)
        assert r.status_code == 400, r.text
        assert r.json()["result"]["field"] == "name" and "reserved" in r.json()["message"]


def test_delayed_messages_are_counted_until_they_come_due(srv: Server) -> None:
    client = sqs(srv, make_key(srv, "app-delay", "sqsdelay"))
    url = client.create_queue(QueueName="later")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="soon", DelaySeconds=1)
    for _ in range(2):
        client.send_message(QueueUrl=url, MessageBody="much later", DelaySeconds=900)
    client.send_message(QueueUrl=url, MessageBody="now")

    def counts() -> tuple[str, str]:
        a = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return a["ApproximateNumberOfMessagesDelayed"], a["ApproximateNumberOfMessages"]

    assert counts()[0] in ("2", "3")  # "soon" may be due already on a slow machine
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
    assert "much later" not in [m["Body"] for m in got]
    wait_until(lambda: counts()[0] == "2", 20, "the 1 s delay to come due")
