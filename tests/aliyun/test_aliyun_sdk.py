"""Alibaba Cloud MQ's HTTP API on a real gateway (issue 32), driven by the official Python SDK
unchanged (`mq-http-sdk`, pinned in requirements/dev.lock), on both stores: publish with tags,
keys, properties and a delay; long-poll consume with a tag filter; ack; redelivery after the
invisible time; ordered consume; transactions committed, rolled back and checked; and the
errors the SDK surfaces."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from mq_http_sdk.mq_client import MQClient
from mq_http_sdk.mq_consumer import Message
from mq_http_sdk.mq_exception import MQExceptionBase, MQServerException
from mq_http_sdk.mq_producer import TopicMessage

from mqgate.aliyun import signature
from tests.conftest import Server, store_server, wait_until
from tests.sqs import test_sqs_boto3
from tests.sqs.test_sqs_boto3 import make_key

pytestmark = pytest.mark.slow

srv = test_sqs_boto3.srv  # the same gateways, one per store


@dataclass
class Instance:
    """A project (the instance) with an access key, a topic and a mode=message group."""

    srv: Server
    project: str
    key: dict[str, Any]
    topic: str
    group: str
    clients: list[MQClient] = field(default_factory=list)

    def client(self, secret: str | None = None, key: dict[str, Any] | None = None) -> MQClient:
        key = key or self.key
        c = MQClient(self.srv.url, key["accessKeyId"], secret or key["secretAccessKey"])
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.http.conn.close()

    def consumer(self, tag: str = "", group: str | None = None) -> Any:
        return self.client().get_consumer(self.project, self.topic, group or self.group, tag)

    def producer(self) -> Any:
        return self.client().get_producer(self.project, self.topic)


def new_instance(srv: Server, lock_timeout_s: float = 30.0, queues: int = 4) -> Instance:
    suffix = secrets.token_hex(4)
    project = f"MQ_INST_{suffix}"
    key = make_key(srv, f"ali-{suffix}", project)
    topic = f"orders-{suffix}"
    group = f"GID_billing_{suffix}"
    srv.admin("POST", "/admin/topics", name=topic, queues=queues, project=project)
    srv.admin(
        "POST", "/admin/consumers", name=group, topic=topic, mode="message", lockTimeoutS=lock_timeout_s
    )
    return Instance(srv, project, key, topic, group)


Instances = Callable[..., Instance]


@pytest.fixture
def instance() -> Iterator[Instances]:
    """New instances on a gateway; the SDK's connections closed afterwards."""
    made: list[Instance] = []

    def make(srv: Server, lock_timeout_s: float = 30.0, queues: int = 4) -> Instance:
        made.append(new_instance(srv, lock_timeout_s, queues))
        return made[-1]

    yield make
    for inst in made:
        inst.close()


def consume_until(
    consumer: Any, count: int, *, orderly: bool = False, timeout_s: float = 30.0
) -> list[Message]:
    """Consume (long polls of 1 s) until `count` messages came, acking none."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages within {timeout_s}s"
        try:
            take = consumer.consume_message_orderly if orderly else consumer.consume_message
            got.extend(take(16, 1))
        except MQServerException as exc:
            assert exc.type == "MessageNotExist", exc
    return got


def checked_half_messages(trans: Any, timeout_s: float = 30.0) -> list[Message]:
    """The half messages offered for a check (`trans=pop`), once there are some."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, f"no half message offered for a check within {timeout_s}s"
        try:
            popped: list[Message] = trans.consume_half_message(16, 1)
        except MQServerException as exc:
            assert exc.type == "MessageNotExist", exc
            continue
        if popped:
            return popped


def nothing_to_consume(consumer: Any, wait_s: int = 0) -> bool:
    with pytest.raises(MQServerException) as refused:
        consumer.consume_message(16, wait_s)
    return bool(refused.value.type == "MessageNotExist")


def test_publish_consume_ack_with_tags_keys_properties(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    producer = inst.producer()
    sent: dict[str, str] = {}
    for i, tag in enumerate(["TagA", "TagB", "TagC", "TagA"]):
        msg = TopicMessage(f"order {i} paid <&> ünïcode", tag)
        msg.set_message_key(f"order-{i}")
        msg.put_property("color", "blue")
        msg.put_property("n", str(i))
        answer = producer.publish_message(msg)
        assert answer.message_id and answer.message_body_md5
        sent[answer.message_id] = tag

    # The group's subscription is TagA||TagB: TagC's message is consumed for it, never shown.
    consumer = inst.consumer("TagA||TagB")
    got = consume_until(consumer, 3)
    assert sorted(m.message_tag for m in got) == ["TagA", "TagA", "TagB"]
    now_ms = time.time() * 1000
    for m in got:
        assert sent[m.message_id] == m.message_tag
        assert m.message_body.startswith("order ") and m.message_body.endswith("paid <&> ünïcode")
        i = m.message_body.split()[1]
        assert m.get_message_key() == f"order-{i}"
        assert m.get_property("color") == "blue" and m.get_property("n") == i
        assert m.consumed_times == 1
        assert m.publish_time <= m.first_consume_time <= now_ms
        assert now_ms + 25_000 < m.next_consume_time <= now_ms + 31_000  # the group's 30 s
    consumer.ack_message([m.receipt_handle for m in got])
    assert nothing_to_consume(consumer)
    # An ack again of the same handles is no error.
    consumer.ack_message([got[0].receipt_handle])


def test_long_poll_is_woken_by_a_publish(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    consumer = inst.consumer()
    out: list[Any] = []

    def consume() -> None:
        started = time.monotonic()
        try:
            out.append(consumer.consume_message(4, 20))
        except MQServerException as exc:
            out.append(exc)
        out.append(time.monotonic() - started)

    thread = threading.Thread(target=consume)
    thread.start()
    inst.producer().publish_message(TopicMessage("wake up"))
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(out[0], list) and [m.message_body for m in out[0]] == ["wake up"], out
    assert out[1] < 15

    # With nothing to consume, the long poll lasts its waitseconds, then answers MessageNotExist.
    started = time.monotonic()
    assert nothing_to_consume(consumer, 1)
    assert 0.9 <= time.monotonic() - started < 10


def test_delayed_message_through_the_scheduler(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    start = int(time.time() * 1000) + 2500
    msg = TopicMessage("later", "TagD")
    msg.set_start_deliver_time(start)
    inst.producer().publish_message(msg)
    past = TopicMessage("past start time: at once")
    past.set_start_deliver_time(int(time.time() * 1000) - 60_000)
    inst.producer().publish_message(past)
    consumer = inst.consumer()
    (now,) = consume_until(consumer, 1)
    assert now.message_body == "past start time: at once"
    consumer.ack_message([now.receipt_handle])
    (later,) = consume_until(consumer, 1)
    assert time.time() * 1000 >= start - 50
    assert later.message_body == "later" and later.get_start_deliver_time() == start
    consumer.ack_message([later.receipt_handle])


def test_redelivery_after_the_invisible_time_and_bad_handles(srv: Server, instance: Instances) -> None:
    inst = instance(srv, lock_timeout_s=1)
    inst.producer().publish_message(TopicMessage("again"))
    consumer = inst.consumer()
    (first,) = consume_until(consumer, 1)
    assert first.consumed_times == 1
    assert first.next_consume_time - first.first_consume_time <= 1500
    (second,) = consume_until(consumer, 1)  # not acked: back after its second
    assert second.message_id == first.message_id
    assert second.consumed_times == 2
    assert second.first_consume_time == first.first_consume_time
    assert second.receipt_handle != first.receipt_handle

    # The first handle expired: MessageNotExist for it; a forged one ReceiptHandleError.
    with pytest.raises(MQServerException) as refused:
        consumer.ack_message([first.receipt_handle, "not-a-handle", second.receipt_handle])
    codes = {e["ReceiptHandle"]: e["ErrorCode"] for e in refused.value.sub_errors}
    assert codes == {first.receipt_handle: "MessageNotExist", "not-a-handle": "ReceiptHandleError"}
    assert nothing_to_consume(consumer)  # the good handle in that ack was applied

    # A handle of another group is not this group's.
    other = f"GID_other_{secrets.token_hex(3)}"
    srv.admin("POST", "/admin/consumers", name=other, topic=inst.topic, mode="message")
    inst.producer().publish_message(TopicMessage("for both"))
    (mine,) = consume_until(consumer, 1)
    with pytest.raises(MQServerException) as refused:
        inst.consumer(group=other).ack_message([mine.receipt_handle])
    assert [e["ErrorCode"] for e in refused.value.sub_errors] == ["ReceiptHandleError"]


def test_ordered_consume_by_sharding_key(srv: Server, instance: Instances) -> None:
    inst = instance(srv, lock_timeout_s=2, queues=4)
    producer = inst.producer()
    keys = [f"user-{k}" for k in range(4)]
    for i in range(5):
        for k in keys:
            msg = TopicMessage(f"{k}:{i}")
            msg.set_sharding_key(k)
            producer.publish_message(msg)
    consumer = inst.consumer()
    seen: dict[str, list[int]] = {k: [] for k in keys}
    deadline = time.monotonic() + 60
    while sum(map(len, seen.values())) < 20:
        assert time.monotonic() < deadline, seen
        try:
            batch = consumer.consume_message_orderly(3, 1)
        except MQServerException as exc:
            assert exc.type == "MessageNotExist"
            continue
        # While a batch is out, its queue hands out nothing else.
        try:
            more = consumer.consume_message_orderly(16, 0)
        except MQServerException:
            more = []
        batch_keys = {m.get_sharding_key() for m in batch}
        assert not batch_keys & {m.get_sharding_key() for m in more}
        for m in [*batch, *more]:
            key, i = m.message_body.split(":")
            assert m.get_sharding_key() == key
            seen[key].append(int(i))
        consumer.ack_message([m.receipt_handle for m in [*batch, *more]])
    assert seen == {k: list(range(5)) for k in keys}

    # Not acked: the same batch comes again, in order, after its invisible time.
    for i in range(3):
        msg = TopicMessage(f"again:{i}")
        msg.set_sharding_key("again")
        producer.publish_message(msg)
    first = consume_until(consumer, 3, orderly=True)
    assert [m.message_body for m in first] == [f"again:{i}" for i in range(3)]
    consumer.ack_message([first[0].receipt_handle])
    again = consume_until(consumer, 2, orderly=True, timeout_s=20)
    assert [m.message_body for m in again] == ["again:1", "again:2"]
    assert all(m.consumed_times == 2 for m in again)
    consumer.ack_message([m.receipt_handle for m in again])


def test_transactions_commit_rollback_and_check(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    trans = inst.client().get_trans_producer(inst.project, inst.topic, inst.group)
    consumer = inst.consumer()

    def half(body: str, check_s: int) -> Any:
        msg = TopicMessage(body, "TagT")
        msg.set_trans_check_immunity_time(check_s)
        msg.put_property("step", body)
        return trans.publish_message(msg)

    committed = half("committed", 60)
    rolled_back = half("rolled back", 60)
    half("checked", 1)
    assert committed.receipt_handle and rolled_back.receipt_handle
    assert nothing_to_consume(consumer)  # half messages are not delivered

    trans.commit(committed.receipt_handle)
    trans.rollback(rolled_back.receipt_handle)
    (m,) = consume_until(consumer, 1)
    assert m.message_body == "committed" and m.message_tag == "TagT" and m.get_property("step") == "committed"
    consumer.ack_message([m.receipt_handle])
    # A decided half message cannot be decided again; a forged handle is no half message's.
    with pytest.raises(MQServerException) as refused:
        trans.commit(committed.receipt_handle)
    assert refused.value.type == "MessageNotExist"
    forged = committed.receipt_handle[:-4] + (
        "AAAA" if not committed.receipt_handle.endswith("AAAA") else "BBBB"
    )
    for handle in ("not-a-handle", forged):
        with pytest.raises(MQServerException) as refused:
            trans.rollback(handle)
        assert refused.value.type == "ReceiptHandleError", handle

    # The one left open is offered for a check once its immunity time is over (and only it).
    popped = checked_half_messages(trans)
    assert [p.message_body for p in popped] == ["checked"]
    assert popped[0].get_trans_check_immunity_time() == 1
    trans.commit(popped[0].receipt_handle)
    (m,) = consume_until(consumer, 1)
    assert m.message_body == "checked" and m.get_trans_check_immunity_time() == 0
    consumer.ack_message([m.receipt_handle])
    assert nothing_to_consume(consumer)
    with pytest.raises(MQServerException) as refused:
        trans.consume_half_message(16, 0)
    assert refused.value.type == "MessageNotExist"


def test_errors_as_the_sdk_expects(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    with pytest.raises(MQServerException) as refused:
        inst.client(secret="wrong" + inst.key["secretAccessKey"][5:]).get_producer(
            inst.project, inst.topic
        ).publish_message(TopicMessage("x"))
    assert refused.value.type == "SignatureDoesNotMatch"
    assert refused.value.req_id  # the RequestId of the error document
    with pytest.raises(MQServerException) as refused:
        inst.client().get_producer(inst.project, "no-such-topic").publish_message(TopicMessage("x"))
    assert refused.value.type == "TopicNotExist"
    with pytest.raises(MQServerException) as refused:
        inst.client().get_producer("MQ_INST_other", inst.topic).publish_message(TopicMessage("x"))
    assert refused.value.type == "AccessDenied"
    other = make_key(srv, f"ali-other-{secrets.token_hex(3)}", f"MQ_INST_o{secrets.token_hex(3)}")
    stranger = inst.client(key=other)
    with pytest.raises(MQServerException) as refused:  # another project's topic
        stranger.get_producer("", inst.topic).publish_message(TopicMessage("x"))
    assert refused.value.type == "TopicNotExist"
    with pytest.raises(MQServerException) as refused:
        inst.consumer(group="GID_unknown").consume_message(1, 0)
    assert refused.value.type == "InvalidArgument" and "GID_unknown" in refused.value.message
    with pytest.raises(MQServerException) as refused:
        inst.consumer().consume_message(17, 0)
    assert refused.value.type == "InvalidArgument" and "numOfMessages" in refused.value.message
    with pytest.raises(MQServerException) as refused:
        inst.consumer().consume_message(1, 31)
    assert refused.value.type == "InvalidArgument" and "waitseconds" in refused.value.message
    with pytest.raises(MQServerException) as refused:
        inst.producer().publish_message(TopicMessage("x" * (1024 * 1024 + 1)))
    assert refused.value.type == "InvalidArgument" and "MessageBody" in refused.value.message


def signed(
    srv: Server, inst: Instance, method: str, resource: str, body: bytes = b"", **hdrs: str
) -> httpx.Response:
    """A request signed as the SDKs sign, with what the SDKs would not send."""
    headers = {
        "Date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
        "x-mq-version": signature.VERSION,
        **hdrs,
    }
    if body:
        headers.setdefault("Content-Type", "text/xml;charset=UTF-8")
    headers["Authorization"] = signature.authorization(
        inst.key["accessKeyId"], inst.key["secretAccessKey"], method, headers, resource
    )
    return httpx.request(method, srv.url + resource, content=body, headers=headers, timeout=30)


def test_protocol_refusals_on_the_wire(srv: Server, instance: Instances) -> None:
    inst = instance(srv)
    base = f"/topics/{inst.topic}/messages"
    no_auth = httpx.get(srv.url + base + "?consumer=x", headers={"x-mq-version": "2015-06-06"}, timeout=10)
    assert no_auth.status_code == 400 and b"<Code>MissingAuthorizationHeader</Code>" in no_auth.content
    assert no_auth.headers["x-mq-request-id"]
    bad_xml = signed(srv, inst, "POST", base, b"<Message><MessageBody>x</Message>")
    assert bad_xml.status_code == 400 and b"MalformedXML" in bad_xml.content
    doctype = signed(srv, inst, "POST", base, b'<!DOCTYPE x [<!ENTITY a "b">]><Message/>')
    assert doctype.status_code == 400 and b"MalformedXML" in doctype.content
    digest = signed(
        srv, inst, "POST", base, b"<Message><MessageBody>x</MessageBody></Message>", **{"Content-MD5": "AAAA"}
    )
    assert digest.status_code == 400 and b"InvalidDigest" in digest.content
    unknown = signed(srv, inst, "GET", base + f"?consumer={inst.group}&bogus=1")
    assert unknown.status_code == 400 and b"InvalidQueryString" in unknown.content
    trans = signed(srv, inst, "GET", base + f"?consumer={inst.group}&trans=commit")
    assert trans.status_code == 400 and b"InvalidArgument" in trans.content
    empty_ack = signed(srv, inst, "DELETE", base + f"?consumer={inst.group}", b"<ReceiptHandles/>")
    assert empty_ack.status_code == 400 and b"InvalidArgument" in empty_ack.content
    stale = dict(Date="Thu, 07 Mar 2012 18:49:58 GMT")
    expired = signed(srv, inst, "GET", base + f"?consumer={inst.group}", **stale)
    assert expired.status_code == 408 and b"TimeExpired" in expired.content
    # Not this API's without its headers: the native API's 404.
    assert httpx.get(srv.url + base, timeout=10).status_code == 404


@pytest.fixture(params=["embedded", "redis"])
def own_srv(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    server, cleanup = store_server(tmp_path / "data", request.param)
    server.start()
    yield server
    server.stop()
    cleanup()


def test_half_messages_survive_kill9(own_srv: Server, instance: Instances) -> None:
    inst = instance(own_srv)
    trans = inst.client().get_trans_producer(inst.project, inst.topic, inst.group)

    def half(body: str, check_s: int) -> Any:
        msg = TopicMessage(body)
        msg.set_trans_check_immunity_time(check_s)
        return trans.publish_message(msg)

    open_one = half("open", 60)
    to_check = half("to check", 1)
    decided = half("rolled back before the crash", 60)
    trans.rollback(decided.receipt_handle)
    own_srv.kill9()
    own_srv.start()
    wait_until(lambda: httpx.get(own_srv.url + "/healthz", timeout=2).status_code == 200, 20, "restart")
    consumer = inst.consumer()
    assert nothing_to_consume(consumer)
    trans = inst.client().get_trans_producer(inst.project, inst.topic, inst.group)
    trans.commit(open_one.receipt_handle)
    (m,) = consume_until(consumer, 1)
    assert m.message_body == "open"
    consumer.ack_message([m.receipt_handle])
    popped = checked_half_messages(trans)
    assert [p.message_body for p in popped] == ["to check"]
    assert popped[0].message_id == to_check.message_id
    trans.rollback(popped[0].receipt_handle)
    with pytest.raises(MQServerException):
        trans.consume_half_message(16, 2)
    assert nothing_to_consume(consumer)


def test_kill9_under_load_loses_nothing_acknowledged(own_srv: Server, instance: Instances) -> None:
    """Publishes answered 201 are all there after a kill -9 amid publishing, and messages acked
    (204) before it never come back."""
    inst = instance(own_srv)
    producer = inst.producer()
    for i in range(60):
        producer.publish_message(TopicMessage(f"before-{i}"))
    consumer = inst.consumer()
    acked = consume_until(consumer, 30)[:30]
    consumer.ack_message([m.receipt_handle for m in acked[:16]])
    consumer.ack_message([m.receipt_handle for m in acked[16:]])
    answered: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def publish(n: int) -> None:
        p = inst.client().get_producer(inst.project, inst.topic)
        i = 0
        while not stop.is_set():
            try:
                sent = p.publish_message(TopicMessage(f"load-{n}-{i}"))
            except MQExceptionBase:
                return  # the gateway is gone
            with lock:
                answered.append(sent.message_id)
            i += 1

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(answered) >= 200, 60, "200 publishes answered under load")
    own_srv.kill9()
    stop.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    own_srv.start()
    after = inst.consumer()
    ids: set[str] = set()
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline
        try:
            got = after.consume_message(16, 1)
        except MQServerException as exc:
            assert exc.type == "MessageNotExist"
            break
        ids.update(m.message_id for m in got)
        after.ack_message([m.receipt_handle for m in got])
    assert not ids & {m.message_id for m in acked}, "acked messages came back"
    missing = set(answered) - ids
    assert not missing, f"{len(missing)} of {len(answered)} answered publishes lost"
    assert len(answered) >= 200
