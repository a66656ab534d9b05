"""Message QoS through the HTTP API, on every store (SPEC S1–S5): delayed start, deadlines,
priority lanes, several destinations and inboxes, and the clock edges."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Client, Server, wait_until

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def result(r: httpx.Response) -> Any:
    return r.json()["result"]


@pytest.fixture
def qos(shared_server: Server) -> Any:
    """A fresh topic with max priority 5 and one queue per lane."""
    topic = f"q{uuid.uuid4().hex[:8]}"
    shared_server.admin("POST", "/admin/topics", name=topic, queues=1, maxPriority=5)
    ptoken = shared_server.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = shared_server.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic)["token"]
    client = Client(shared_server, ptoken, ctoken)
    yield topic, client
    client.close()


def drain(c: Client, topic: str, wait: float = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        body = result(c.pull(topic, f"{topic}-c", max=100, wait=wait))
        if body["status"] != "FOUND":
            return out
        out += body["msgList"]
        assert c.call("/mq/ack", requestId=body["requestId"]).status_code == 200


def test_a_delayed_message_is_held_until_its_start(qos: Any) -> None:
    topic, c = qos
    r = c.produce(f"{topic}-p", "later", delayMs=1500)
    receipt = result(r)
    assert r.status_code == 200 and receipt["status"] == "scheduled" and "offset" not in receipt
    start = receipt["deliverAt"]
    assert result(c.pull(topic, f"{topic}-c"))["status"] == "NO_NEW_MSG"
    got = result(c.pull(topic, f"{topic}-c", wait=10))
    received = time.time() * 1000
    assert got["status"] == "FOUND" and got["msgList"][0]["message"] == "later"
    assert got["msgList"][0]["deliverAt"] == start
    # The gateway took it at or after its start (its clock); how soon after is the machine's load.
    assert start <= got["msgList"][0]["popTime"] <= received


def test_a_delivery_says_when_the_gateway_took_it(qos: Any) -> None:
    """`popTime`: the time the gateway checked the batch's deadlines against, between the pull's
    sending and its answer; the same for every message of a batch."""
    topic, c = qos
    deadlines = {result(c.produce(f"{topic}-p", body, ttlMs=600_000))["deadline"] for body in ("a", "b")}
    deadline = min(deadlines)
    sent = int(time.time() * 1000)
    got = result(c.pull(topic, f"{topic}-c", max=10))
    received = time.time() * 1000
    assert [m["message"] for m in got["msgList"]] == ["a", "b"]
    pops = {m["popTime"] for m in got["msgList"]}
    assert len(pops) == 1 and sent <= pops.pop() <= min(received, deadline)


def test_a_start_in_the_past_is_due_now_and_kept_as_given(qos: Any) -> None:
    topic, c = qos
    past = int(time.time() * 1000) - 60_000
    receipt = result(c.produce(f"{topic}-p", "now", deliverAt=past, ttlMs=600_000))
    assert receipt["status"] == "stored" and receipt["deliverAt"] == past
    assert receipt["deadline"] == past + 600_000
    [m] = drain(c, topic)
    assert m["message"] == "now" and m["deadline"] == past + 600_000


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"ttlMs": 0}, "ttlMs"),
        ({"ttlMs": -5}, "ttlMs"),
        ({"deliverAt": 1000, "ttlMs": 5}, "ttlMs"),  # the window closed long ago
        ({"deliverAt": 1, "delayMs": 5}, "delayMs"),
        ({"delayMs": 366 * 24 * 3600 * 1000}, "delayMs"),
        ({"priority": 10}, "priority"),
        ({"priority": 6}, "priority"),  # above the topic's max priority (5)
        ({"priority": "high"}, "priority"),
        ({"deliverAt": 1.5}, "deliverAt"),
        ({"destinations": []}, "destinations"),
        ({"destinations": [{"topic": "a", "consumer": "b"}]}, "destinations[0]"),
        ({"destinations": [{"topic": "../x"}]}, "destinations[0].topic"),
        ({"destinations": [{"queue": 1}]}, "destinations[0]"),
    ],
)
def test_bad_qos_fields_are_400_naming_the_field(qos: Any, fields: dict[str, Any], field: str) -> None:
    topic, c = qos
    r = c.produce(f"{topic}-p", "x", **fields)
    assert r.status_code == 400, r.text
    assert result(r)["field"] == field


def test_an_expired_message_is_never_delivered_and_is_dead_lettered(qos: Any) -> None:
    topic, c = qos
    server = c.server
    assert result(c.produce(f"{topic}-p", "short", ttlMs=300))["status"] == "stored"
    assert result(c.produce(f"{topic}-p", "long", ttlMs=600_000))["status"] == "stored"
    time.sleep(0.5)  # the first message's validity runs out
    assert [m["message"] for m in drain(c, topic)] == ["long"]
    dlq = f"%DLQ%{topic}-c"
    dtoken = server.admin("POST", "/admin/consumers", name=f"{topic}-dlq", topic=dlq)["token"]
    r = c.http.get(
        "/mq/message",
        params={"topic": dlq, "consumer": f"{topic}-dlq", "max": 10},
        headers={"Authorization": f"Bearer {dtoken}"},
    )
    dead_list = result(r)["msgList"]
    assert len(dead_list) == 1, r.text
    dead = dead_list[0]
    assert dead["message"] == "short" and dead["properties"]["dlq.reason"] == "expired"
    metrics = httpx.get(server.url + "/metrics").text
    m = re.search(rf'mqgate_expired_messages_total\{{consumer="{topic}-c"\}} ([0-9.]+)', metrics)
    assert m and float(m.group(1)) == 1.0


def test_higher_priority_is_served_first(qos: Any) -> None:
    topic, c = qos
    for i in range(3):
        c.produce(f"{topic}-p", f"low{i}")
    c.produce(f"{topic}-p", "mid", priority=2)
    for i in range(2):
        c.produce(f"{topic}-p", f"high{i}", priority=5)
    order = [m["message"] for m in drain(c, topic)]
    assert order == ["high0", "high1", "mid", "low0", "low1", "low2"]
    progress = c.server.admin("GET", f"/admin/consumers/{topic}-c/progress")
    lanes = {q["lane"] for q in progress["queues"] if q["source"] == topic}
    assert lanes == {0, 1, 2, 3, 4, 5}


def test_a_topic_without_lanes_refuses_priority_rather_than_ignoring_it(shared_server: Server) -> None:
    topic = f"np{uuid.uuid4().hex[:8]}"
    ptoken, ctoken = shared_server.setup_topic(topic, queues=2)
    c = Client(shared_server, ptoken, ctoken)
    r = c.produce(f"{topic}-p", "x", priority=1)
    assert r.status_code == 400 and result(r)["field"] == "priority"
    assert "maxPriority" in r.json()["message"]
    c.close()


def test_one_message_to_several_destinations_and_an_inbox(shared_server: Server) -> None:
    a, b = f"da{uuid.uuid4().hex[:6]}", f"db{uuid.uuid4().hex[:6]}"
    _, a_ctoken = shared_server.setup_topic(a, queues=2)
    _, b_ctoken = shared_server.setup_topic(b, queues=2)
    ptoken = shared_server.admin(
        "POST", "/admin/producers", name=f"{a}-multi", topic=a, destinations=[b, "inbox:*"]
    )["token"]
    c = Client(shared_server, ptoken, a_ctoken)
    r = c.produce(
        f"{a}-multi",
        "fan-out",
        destinations=[
            {"topic": a},
            {"topic": b, "delayMs": 800, "priority": 0},
            {"consumer": f"{b}-c", "ttlMs": 60_000},
        ],
    )
    assert r.status_code == 200, r.text
    receipts = result(r)["receipts"]
    assert [(x["destination"], x["status"]) for x in receipts] == [
        (a, "stored"),
        (b, "scheduled"),
        (f"inbox:{b}-c", "stored"),
    ]
    assert len({x["msgId"] for x in receipts}) == 1
    assert [m["message"] for m in drain(c, a)] == ["fan-out"]
    on_b = Client(shared_server, None, b_ctoken)
    first = drain(on_b, b)  # the inbox copy is there at once
    assert [m["message"] for m in first] == ["fan-out"] and first[0]["deadline"] > 0
    later = drain(on_b, b, wait=5)  # the topic copy after its delay
    assert [m["message"] for m in later] == ["fan-out"]
    # Destinations the producer was not given are refused, naming the destination.
    r = c.produce(f"{a}-multi", "x", destinations=[{"topic": "elsewhere"}])
    assert r.status_code == 403 and result(r)["field"] == "destinations[0].topic"
    c.close()
    on_b.close()


def test_batches_carry_qos_per_message(qos: Any) -> None:
    topic, c = qos
    r = c.produce_batch(
        f"{topic}-p",
        [{"message": "a"}, {"message": "b", "delayMs": 600}, {"message": "c", "priority": 3}],
    )
    statuses = [x["status"] for x in result(r)["receipts"]]
    assert statuses == ["stored", "scheduled", "stored"]
    assert [m["message"] for m in drain(c, topic)] == ["c", "a"]
    wait_until(lambda: [m["message"] for m in drain(c, topic, wait=1)] == ["b"], 10, "the delayed one")
