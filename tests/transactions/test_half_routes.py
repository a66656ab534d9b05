"""Half (transactional) messages over the native API (issue 32: `/mq/half`, `/mq/half/check`,
`/mq/half/commit`, `/mq/half/rollback`) on a real gateway, on both stores: never delivered
before their commit, delivered to native consumers as ordinary messages after it, discarded by a
rollback, offered to a check once open past their check time, kept across kill -9."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import Server, wait_until

pytestmark = pytest.mark.slow


@dataclass
class Topic:
    """A topic with a producer, a mode=message consumer and a cluster consumer."""

    srv: Server
    name: str
    http: httpx.Client
    ptoken: str
    mtoken: str  # the mode=message consumer's
    ctoken: str  # the cluster consumer's

    @property
    def producer(self) -> str:
        return f"{self.name}-p"

    def post(self, path: str, token: str | None = None, **body: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.ptoken}"}
        return self.http.post(path, json={"producer": self.producer, **body}, headers=headers)

    def half(self, *messages: dict[str, Any], check_after_s: float = 3600) -> list[dict[str, Any]]:
        r = self.post("/mq/half", checkAfterS=check_after_s, messages=list(messages))
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["result"]["messages"]
        return out

    def decide(self, op: str, handle: str) -> httpx.Response:
        return self.post(f"/mq/half/{op}", handle=handle)

    def check(self, wait: float = 0.0, max: int = 10) -> list[dict[str, Any]]:
        r = self.post("/mq/half/check", wait=wait, max=max)
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["result"]["messages"]
        return out

    def receive(self, wait: float) -> list[dict[str, Any]]:
        r = self.http.post(
            "/mq/receive",
            json={"consumer": f"{self.name}-m", "max": 10, "wait": wait},
            headers={"Authorization": f"Bearer {self.mtoken}"},
        )
        assert r.status_code == 200, r.text
        got: list[dict[str, Any]] = r.json()["result"]["messages"]
        if got:
            deleted = self.http.post(
                "/mq/delete",
                json={"consumer": f"{self.name}-m", "receiptHandles": [m["receiptHandle"] for m in got]},
                headers={"Authorization": f"Bearer {self.mtoken}"},
            )
            assert deleted.status_code == 200, deleted.text
        return got

    def receive_until(self, count: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count:
            assert time.monotonic() < deadline, f"received {len(got)} of {count}"
            got += self.receive(wait=1.0)
        return got

    def pull_all(self) -> list[dict[str, Any]]:
        r = self.http.get(
            "/mq/message",
            params={"topic": self.name, "consumer": f"{self.name}-c", "max": 100, "wait": 0.5},
            headers={"Authorization": f"Bearer {self.ctoken}"},
        )
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        if result["status"] != "FOUND":
            return []
        ack = self.http.post(
            "/mq/ack",
            json={"requestId": result["requestId"]},
            headers={"Authorization": f"Bearer {self.ctoken}"},
        )
        assert ack.status_code == 200, ack.text
        msgs: list[dict[str, Any]] = result["msgList"]
        return msgs


def new_topic(srv: Server, queues: int = 2, max_priority: int = 0) -> Topic:
    name = "tx-" + secrets.token_hex(4)
    srv.admin("POST", "/admin/topics", name=name, queues=queues, maxPriority=max_priority)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{name}-p", topic=name)["token"]
    mtoken = srv.admin("POST", "/admin/consumers", name=f"{name}-m", topic=name, mode="message")["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{name}-c", topic=name)["token"]
    return Topic(srv, name, httpx.Client(base_url=srv.url, timeout=40), ptoken, mtoken, ctoken)


@pytest.fixture
def topics(shared_server: Server) -> Iterator[Any]:
    made: list[Topic] = []

    def make(**kwargs: Any) -> Topic:
        t = new_topic(shared_server, **kwargs)
        made.append(t)
        return t

    yield make
    for t in made:
        t.http.close()


def test_a_committed_half_message_is_delivered_as_an_ordinary_message(topics: Any) -> None:
    t: Topic = topics()
    first, second = t.half(
        {
            "message": "to commit",
            "keys": ["k1"],
            "tags": ["TagA"],
            "properties": {"a": "1"},
            "orderKey": "o1",
        },
        {"message": "to roll back", "properties": {"b": "2"}},
    )
    assert first["handle"].startswith("H1.") and first["messageId"] != second["messageId"]
    assert first["checkAt"] > time.time() * 1000 + 3000 * 1000
    assert t.receive(wait=1.0) == [] and t.pull_all() == []  # never before the commit
    committed = t.decide("commit", first["handle"])
    assert committed.status_code == 200, committed.text
    result = committed.json()["result"]
    assert result["messageId"] == first["messageId"] and result["outcome"] == "committed"
    (receipt,) = result["receipts"]
    assert receipt["status"] == "stored"
    rolled = t.decide("rollback", second["handle"])
    assert rolled.status_code == 200 and rolled.json()["result"] == {
        "messageId": second["messageId"],
        "outcome": "rolled_back",
    }
    (m,) = t.receive_until(1)
    assert (m["message"], m["keys"], m["tags"], m["properties"]) == (
        "to commit",
        ["k1"],
        ["TagA"],
        {"a": "1"},
    )
    assert m["messageId"] == receipt["msgId"] and m["producer"] == t.producer
    (pulled,) = t.pull_all()  # a cluster consumer of the topic gets it too, once
    assert pulled["messageId"] == receipt["msgId"] and pulled["properties"] == {"a": "1"}
    assert t.receive(wait=1.0) == [] and t.pull_all() == []  # the rolled back one, never
    # Decided is decided: either handle again is 409, on commit or rollback.
    for op, handle in (
        ("commit", first["handle"]),
        ("rollback", first["handle"]),
        ("commit", second["handle"]),
    ):
        again = t.decide(op, handle)
        assert again.status_code == 409 and again.json()["result"]["code"] == "already_decided", again.text
        assert again.json()["result"]["field"] == "handle"
    # Nor is a decided message ever offered to a check.
    assert t.check() == []


def test_a_commit_applies_the_messages_qos_from_the_commit(topics: Any) -> None:
    t: Topic = topics(max_priority=1)
    (delayed, prioritised) = t.half(
        {"message": "later", "delayMs": 60_000}, {"message": "first", "priority": 1}
    )
    scheduled = t.decide("commit", delayed["handle"]).json()["result"]["receipts"][0]
    assert scheduled["status"] == "scheduled"
    assert scheduled["deliverAt"] >= time.time() * 1000 + 50_000  # counted from the commit
    stored = t.decide("commit", prioritised["handle"]).json()["result"]["receipts"][0]
    assert stored["status"] == "stored" and stored["queue"] >= 2  # the priority lane's queues
    (m,) = t.receive_until(1)
    assert m["message"] == "first" and m["priority"] == 1 and m["properties"] == {}
    assert t.receive(wait=0.5) == []


def test_an_open_half_message_is_offered_to_a_check_after_its_time(topics: Any) -> None:
    t: Topic = topics()
    (due,) = t.half({"message": "due", "properties": {"x": "y"}}, check_after_s=0)
    (later,) = t.half({"message": "later"}, check_after_s=3600)
    checked = t.check(wait=5.0)
    assert [c["messageId"] for c in checked] == [due["messageId"]]  # the later one stays hidden
    (c,) = checked
    assert (c["message"], c["properties"], c["producer"], c["receiveCount"]) == (
        "due",
        {"x": "y"},
        t.producer,
        1,
    )
    assert c["handle"] != due["handle"]
    assert t.check(wait=1.0) == []  # hidden for the check interval once offered
    committed = t.decide("commit", c["handle"])  # by the check's handle
    assert committed.status_code == 200, committed.text
    (m,) = t.receive_until(1)
    assert m["message"] == "due" and m["properties"] == {"x": "y"}
    assert t.decide("rollback", due["handle"]).status_code == 409  # its put's handle: decided
    assert t.decide("rollback", later["handle"]).status_code == 200
    assert t.check(wait=0.5) == [] and t.receive(wait=0.5) == []


def test_bad_requests_name_their_field(topics: Any, shared_server: Server) -> None:
    t: Topic = topics()
    other: Topic = topics()
    (h,) = t.half({"message": "x"})

    def refused(r: httpx.Response, status: int, field: str, code: str | None = None) -> None:
        assert r.status_code == status, r.text
        assert r.json()["result"]["field"] == field, r.text
        if code:
            assert r.json()["result"]["code"] == code, r.text

    refused(t.post("/mq/half", checkAfterS=-1, messages=[{"message": "x"}]), 400, "checkAfterS")
    refused(t.post("/mq/half", checkAfterS=43_201, messages=[{"message": "x"}]), 400, "checkAfterS")
    refused(t.post("/mq/half", messages=[]), 400, "messages")
    refused(
        t.post(
            "/mq/half", messages=[{"message": "x"}, {"message": "y", "destinations": [{"topic": t.name}]}]
        ),
        400,
        "messages[1].destinations",
    )
    refused(t.post("/mq/half", messages=[{"message": "x", "properties": {"mq.half.checkAt": "0"}}]), 400,
            "messages[0].properties")  # fmt: skip
    refused(t.post("/mq/half", messages=[{"message": "x", "priority": 1}]), 400, "messages[0].priority")
    refused(
        t.post("/mq/half", messages=[{"message": "x", "delayMs": 1, "deliverAt": 1}]),
        400,
        "messages[0].delayMs",
    )
    refused(t.post("/mq/half/check", max=10**6), 400, "max")
    refused(t.decide("commit", "H1.bogus.sig"), 400, "handle", "bad_handle")
    refused(t.decide("commit", "not-a-receipt"), 400, "handle", "bad_handle")
    refused(t.decide("commit", ""), 400, "handle")
    # Another topic's handle, by that topic's producer: not its half message.
    (oh,) = other.half({"message": "y"})
    refused(t.decide("commit", oh["handle"]), 400, "handle", "bad_handle")
    # Auth before the body: no token or another producer's, whatever the body.
    no_token = t.http.post("/mq/half", content=b"{not json")
    assert no_token.status_code == 401
    theirs = t.http.post(
        "/mq/half/commit", content=b"{not json", headers={"Authorization": f"Bearer {other.ptoken}"}
    )
    assert theirs.status_code in (400, 403)  # the producer it names is read from the body
    wrong = t.http.post(
        "/mq/half/commit",
        json={"producer": t.producer, "handle": h["handle"]},
        headers={"Authorization": f"Bearer {other.ptoken}"},
    )
    assert wrong.status_code == 403, wrong.text
    consumer = t.http.post(
        "/mq/half/check", json={"producer": t.producer}, headers={"Authorization": f"Bearer {t.mtoken}"}
    )
    assert consumer.status_code == 403, consumer.text
    # The hidden topics are the gateway's: no admin may make them.
    taken = httpx.post(
        shared_server.url + "/admin/topics",
        json={"name": f"aliyun.half.{t.name}"},
        headers={"Authorization": f"Bearer {shared_server.admin_token}"},
    )
    assert taken.status_code == 400, taken.text
    assert t.decide("rollback", h["handle"]).status_code == 200


def test_half_messages_survive_kill9(server: Server) -> None:
    t = new_topic(server)
    try:
        (open_one,) = t.half({"message": "open", "tags": ["T"]}, check_after_s=3600)
        (to_check,) = t.half({"message": "to check"}, check_after_s=1)
        (decided,) = t.half({"message": "rolled back before the crash"}, check_after_s=1)
        assert t.decide("rollback", decided["handle"]).status_code == 200
        server.kill9()
        server.start()
        wait_until(lambda: httpx.get(server.url + "/healthz", timeout=2).status_code == 200, 20, "restart")
        t.http.close()
        t.http = httpx.Client(base_url=server.url, timeout=40)
        assert t.receive(wait=1.0) == []  # nothing delivered: all three were half messages
        # The decision before the crash is known after it (read back from the op log).
        again = t.decide("commit", decided["handle"])
        assert again.status_code == 409 and again.json()["result"]["code"] == "already_decided", again.text
        assert t.decide("commit", open_one["handle"]).status_code == 200
        (m,) = t.receive_until(1)
        assert (m["message"], m["tags"]) == ("open", ["T"])
        checked: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while not checked:
            assert time.monotonic() < deadline, "no check offered"
            checked = t.check(wait=1.0)
        assert [c["messageId"] for c in checked] == [to_check["messageId"]]
        assert t.decide("rollback", checked[0]["handle"]).status_code == 200
        assert t.check(wait=1.0) == [] and t.receive(wait=0.5) == []
    finally:
        t.http.close()
