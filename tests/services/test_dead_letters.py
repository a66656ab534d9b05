"""Dead letters as an operator handles them, one queue numbering, browsing without consuming:
real gateway processes on both stores (issue 10 §4)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Client, Server, wait_until

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

Connect = Callable[[str | None, str | None], Client]


@pytest.fixture
def connect(server: Server) -> Iterator[Connect]:
    """Data-path clients of the test's server (producer token, consumer token), closed after it."""
    made: list[Client] = []

    def make(ptoken: str | None, ctoken: str | None) -> Client:
        made.append(Client(server, ptoken, ctoken))
        return made[-1]

    yield make
    for client in made:
        client.close()


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def get(server: Server, path: str, token: str, **params: Any) -> httpx.Response:
    return httpx.get(
        server.url + path, params=params, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def post(server: Server, path: str, token: str, **body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()["result"]


def dead_letters(server: Server, consumer: str, count: int) -> list[dict[str, Any]]:
    """The consumer's dead letters, read without consuming, once there are `count` of them."""

    def read() -> list[dict[str, Any]] | None:
        got = ok(get(server, "/mq/read", server.admin_token, topic=f"%DLQ%{consumer}", queue=0, offset=0))
        items: list[dict[str, Any]] = got["msgList"]
        return items if len(items) >= count else None

    found: list[dict[str, Any]] = wait_until(read, 15, f"{count} dead letters of {consumer}")
    return found


def expire_now(client: Client, topic: str, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Produce one message that is past its deadline when pulled (1 ms validity) and `extra`
    ones to the same queue; return the receipts."""
    batch = [{"message": "late", "ttlMs": 1, "keys": ["k-late"], "orderKey": "o"}]
    batch += [{"orderKey": "o", **m} for m in extra]
    receipts: list[dict[str, Any]] = ok(client.produce_batch(f"{topic}-p", batch))["receipts"]
    time.sleep(0.01)  # let the 1 ms validity pass: a deadline in time, not a wait for a process
    return receipts


class TestDeadLetterCounts:
    def test_an_expired_message_is_counted_with_no_deliveries_and_its_store_queue(
        self, server: Server, connect: Connect
    ) -> None:
        topic = unique("x")
        ptoken, ctoken = server.setup_topic(topic, queues=2)
        c = connect(ptoken, ctoken)
        receipts = expire_now(c, topic, {"message": "live"})
        pulled = ok(c.pull(topic, f"{topic}-c", max=10))
        assert [m["message"] for m in pulled["msgList"]] == ["live"]
        assert c.call("/mq/ack", requestId=pulled["requestId"]).status_code == 200
        (dead,) = dead_letters(server, f"{topic}-c", 1)
        progress = server.admin("GET", f"/admin/consumers/{topic}-c/progress")
        assert progress["deadLettered"] == 1 and progress["lag"] == 0
        props = dead["properties"]
        assert props["dlq.reason"] == "expired" and props["dlq.topic"] == topic
        assert props["dlq.attempts"] == "0"  # it was never delivered
        assert (props["dlq.queue"], props["dlq.offset"]) == (
            str(receipts[0]["queue"]),
            str(receipts[0]["offset"]),
        )

    def test_attempts_are_the_deliveries_through_redelivery(self, server: Server, connect: Connect) -> None:
        topic = unique("a")
        ptoken, ctoken = server.setup_topic(
            topic, queues=1, consumer_args={"lockTimeoutS": 1, "maxAttempts": 2}
        )
        c = connect(ptoken, ctoken)
        c.produce(f"{topic}-p", "never acked")
        first = ok(c.pull(topic, f"{topic}-c"))
        assert first["status"] == "FOUND"
        # Lock timeout, then the first backoff: delivered again, from the retry queue.
        second = ok(c.pull(topic, f"{topic}-c", wait=6))
        assert second["status"] == "FOUND" and second["msgList"][0]["reconsumeTimes"] == 1
        # Its lock runs out again: two deliveries of two allowed, so it is dead-lettered.
        assert ok(c.pull(topic, f"{topic}-c", wait=3))["status"] == "NO_NEW_MSG"
        (dead,) = dead_letters(server, f"{topic}-c", 1)
        props = dead["properties"]
        assert props["dlq.reason"] == "max_attempts" and props["dlq.attempts"] == "2"
        # Queues are named in the one numbering: queue 0 of the retry topic it came from.
        assert second["msgList"][0]["source"] == f"%RETRY%{topic}-c" and second["msgList"][0]["queue"] == 0
        assert props["dlq.source"] == f"%RETRY%{topic}-c" and props["dlq.queue"] == "0"
        assert server.admin("GET", f"/admin/consumers/{topic}-c/progress")["deadLettered"] == 1


class TestOneQueueNumbering:
    def test_a_receipts_queue_is_the_one_pull_read_browse_progress_and_reset_use(
        self, server: Server, connect: Connect
    ) -> None:
        topic = unique("n")
        server.admin("POST", "/admin/topics", name=topic, queues=2, maxPriority=1)
        ptoken = server.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
        ctoken = server.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic)["token"]
        c = connect(ptoken, ctoken)
        receipt = ok(c.produce(f"{topic}-p", "urgent", priority=1, orderKey="k"))
        queue, offset = receipt["queue"], receipt["offset"]
        assert queue in (2, 3)  # lane 1 holds store queues 2 and 3
        read = ok(get(server, "/mq/read", server.admin_token, topic=topic, queue=queue, offset=offset))
        assert [m["message"] for m in read["msgList"]] == ["urgent"]
        browsed = ok(get(server, "/mq/browse", server.admin_token, topic=topic, queue=queue, offset=offset))
        assert [m["message"] for m in browsed["msgList"]] == ["urgent"]
        pulled = ok(c.pull(topic, f"{topic}-c"))
        (m,) = pulled["msgList"]
        assert (m["queue"], m["offset"]) == (queue, offset) and "source" not in m
        progress = server.admin("GET", f"/admin/consumers/{topic}-c/progress")
        (entry,) = [q for q in progress["queues"] if q["source"] == topic and q["queue"] == queue]
        assert entry["lane"] == 1 and entry["locked"]
        acked = c.call("/mq/ack", requestId=pulled["requestId"])
        assert ok(acked) == {"queue": queue, "committed": offset + 1}
        server.admin("POST", f"/admin/consumers/{topic}-c/reset", to="offset", offset=0, queue=queue)
        again = ok(c.pull(topic, f"{topic}-c"))
        assert [(m["queue"], m["offset"]) for m in again["msgList"]] == [(queue, offset)]


class TestDeadLetterTopics:
    def test_a_dlq_is_consumed_by_a_consumer_and_read_with_its_token(
        self, server: Server, connect: Connect
    ) -> None:
        topic = unique("d")
        ptoken, ctoken = server.setup_topic(topic, queues=1)
        c = connect(ptoken, ctoken)
        expire_now(c, topic)
        assert ok(c.pull(topic, f"{topic}-c"))["status"] == "NO_NEW_MSG"
        dead_letters(server, f"{topic}-c", 1)
        dlq = f"%DLQ%{topic}-c"
        dtoken = server.admin("POST", "/admin/consumers", name=f"{topic}-dlq", topic=dlq)["token"]
        browsed = ok(get(server, "/mq/read", dtoken, topic=dlq, consumer=f"{topic}-dlq", queue=0, offset=0))
        assert [m["message"] for m in browsed["msgList"]] == ["late"]
        reader = connect(None, dtoken)
        pulled = ok(reader.pull(dlq, f"{topic}-dlq"))
        assert [m["properties"]["dlq.reason"] for m in pulled["msgList"]] == ["expired"]
        assert reader.call("/mq/ack", requestId=pulled["requestId"]).status_code == 200


class TestRedrive:
    def setup_dead(self, server: Server, connect: Connect, topic: str) -> tuple[Client, list[dict[str, Any]]]:
        ptoken, ctoken = server.setup_topic(topic, queues=2)
        c = connect(ptoken, ctoken)
        batch = [
            {
                "message": f"m{i}",
                "ttlMs": 1,
                "keys": [f"k{i % 2}"],
                "tags": ["t"],
                "properties": {"p": str(i)},
            }
            for i in range(5)
        ]
        assert c.produce_batch(f"{topic}-p", batch).status_code == 200
        time.sleep(0.01)  # let the 1 ms validity pass
        assert ok(c.pull(topic, f"{topic}-c", max=10))["status"] == "NO_NEW_MSG"
        assert ok(c.pull(topic, f"{topic}-c", max=10))["status"] == "NO_NEW_MSG"
        return c, dead_letters(server, f"{topic}-c", 5)

    def redrive(self, server: Server, consumer: str, **body: Any) -> httpx.Response:
        return post(server, f"/admin/consumers/{consumer}/dead-letters/redrive", server.admin_token, **body)

    def test_a_redriven_dead_letter_reaches_only_the_consumer_it_died_for(
        self, server: Server, connect: Connect
    ) -> None:
        topic = unique("only")
        ptoken, billing_token = server.setup_topic(topic, queues=2, consumer_args={"maxAttempts": 1})
        shipping_token = server.admin("POST", "/admin/consumers", name=f"{topic}-s", topic=topic)["token"]
        producer, billing, shipping = (
            connect(ptoken, None),
            connect(None, billing_token),
            connect(None, shipping_token),
        )
        msg_id = ok(producer.produce(f"{topic}-p", "order 7 paid"))["msgId"]
        got = ok(shipping.pull(topic, f"{topic}-s"))
        assert shipping.call("/mq/ack", requestId=got["requestId"]).status_code == 200
        failed = ok(billing.pull(topic, f"{topic}-c"))
        assert billing.call("/mq/release", requestId=failed["requestId"]).status_code == 200  # its 1 attempt
        dead_letters(server, f"{topic}-c", 1)
        (copy,) = ok(self.redrive(server, f"{topic}-c", all=True))["redriven"]
        assert (copy["messageId"], copy["topic"], copy["queue"]) == (msg_id, f"%INBOX%{topic}-c", 0)
        assert server.admin("GET", f"/admin/consumers/{topic}-s/progress")["lag"] == 0
        assert ok(shipping.pull(topic, f"{topic}-s"))["status"] == "NO_NEW_MSG"
        again = ok(billing.pull(topic, f"{topic}-c"))
        assert [m["messageId"] for m in again["msgList"]] == [msg_id] and again["msgList"][0][
            "source"
        ] == f"%INBOX%{topic}-c"
        assert billing.call("/mq/ack", requestId=again["requestId"]).status_code == 200
        assert server.admin("GET", f"/admin/consumers/{topic}-c/progress")["lag"] == 0

    def test_one_a_filter_then_all_each_exactly_once(self, server: Server, connect: Connect) -> None:
        topic = unique("r")
        consumer = f"{topic}-c"
        c, dead = self.setup_dead(server, connect, topic)
        by_offset = {m["offset"]: m for m in dead}
        # One, by its DLQ offset (not the first one: it is recorded on its own).
        one = ok(self.redrive(server, consumer, offset=3))
        assert [r["dlqOffset"] for r in one["redriven"]] == [3] and one["position"] == 0
        again = self.redrive(server, consumer, offset=3)
        assert again.status_code == 409 and again.json()["result"]["code"] == "already_redriven"
        # A filter: key k0 is on dead letters 0, 2, 4 (by message), one of them redriven already.
        k0 = {o for o, m in by_offset.items() if "k0" in m["keys"]}
        filtered = ok(self.redrive(server, consumer, key="k0"))
        assert {r["dlqOffset"] for r in filtered["redriven"]} == k0 - {3}
        assert filtered["alreadyRedriven"] == (1 if 3 in k0 else 0) and filtered["scanned"] == 5
        # All: only what is left; the position then passes every dead letter.
        rest = ok(self.redrive(server, consumer, all=True))
        assert {r["dlqOffset"] for r in rest["redriven"]} == set(by_offset) - k0 - {3}
        assert rest["position"] == 5
        assert ok(self.redrive(server, consumer, all=True))["redriven"] == []
        by_id = self.redrive(server, consumer, messageId=dead[0]["messageId"])
        assert (
            by_id.status_code == 404 and by_id.json()["result"]["field"] == "messageId"
        )  # below the position
        state = server.admin("GET", f"/admin/consumers/{consumer}/dead-letters")
        assert (state["position"], state["redriven"], state["max"]) == (5, 5, 5)
        # Every message came back once, without dlq.* properties, and is delivered again.
        back = ok(c.pull(topic, consumer, max=20))["msgList"]
        back += ok(c.pull(topic, consumer, max=20))["msgList"]
        assert sorted(m["message"] for m in back) == [f"m{i}" for i in range(5)]
        for m in back:
            i = int(m["message"][1:])
            assert m["keys"] == [f"k{i % 2}"] and m["tags"] == ["t"] and m["properties"] == {"p": str(i)}
            assert m["messageId"] == next(d["messageId"] for d in dead if d["message"] == m["message"])

    def test_by_reason_and_time_and_the_refusals(self, server: Server, connect: Connect) -> None:
        topic = unique("f")
        consumer = f"{topic}-c"
        _, dead = self.setup_dead(server, connect, topic)
        assert ok(self.redrive(server, consumer, reason="max_attempts"))["redriven"] == []
        none_yet = ok(self.redrive(server, consumer, until=dead[0]["timestamp"]))
        assert none_yet["redriven"] == [] and none_yet["position"] == 0
        bounded = ok(self.redrive(server, consumer, reason="expired", max=2))
        assert [r["dlqOffset"] for r in bounded["redriven"]] == [0, 1] and bounded["position"] == 2
        assert (bounded["scanned"], bounded["next"], bounded["scanLimit"]) == (2, 2, 2)
        assert self.redrive(server, consumer, offset=1).json()["result"]["code"] == "already_redriven"
        # By message id: searched from the position; found and redriven once, then refused.
        third = ok(self.redrive(server, consumer, messageId=dead[3]["messageId"]))
        assert [r["dlqOffset"] for r in third["redriven"]] == [3] and third["position"] == 2
        twice = self.redrive(server, consumer, messageId=dead[3]["messageId"])
        assert twice.status_code == 409 and twice.json()["result"]["code"] == "already_redriven"
        assert self.redrive(server, consumer, messageId="nope").status_code == 404
        rest = ok(self.redrive(server, consumer, all=True))
        assert [r["dlqOffset"] for r in rest["redriven"]] == [2, 4] and rest["alreadyRedriven"] == 1
        assert rest["position"] == 5
        nothing = self.redrive(server, consumer)
        assert nothing.status_code == 400 and nothing.json()["result"]["field"] == "all"
        mixed = self.redrive(server, consumer, all=True, key="k0")
        assert mixed.status_code == 400
        missing = self.redrive(server, consumer, offset=99)
        assert missing.status_code == 404 and missing.json()["result"]["field"] == "offset"
        unknown = self.redrive(server, "nobody", all=True)
        assert unknown.status_code == 404


class TestBrowse:
    def test_by_offset_time_key_and_message_id_without_consuming(
        self, server: Server, connect: Connect
    ) -> None:
        topic = unique("b")
        ptoken, ctoken = server.setup_topic(topic, queues=1)
        c = connect(ptoken, ctoken)
        receipts = ok(
            c.produce_batch(f"{topic}-p", [{"message": f"m{i}", "keys": [f"k{i % 3}"]} for i in range(30)])
        )
        ids = [r["msgId"] for r in receipts["receipts"]]

        def browse(token: str = server.admin_token, **params: Any) -> Any:
            return ok(get(server, "/mq/browse", token, topic=topic, queue=0, **params))

        page = browse(offset=10, max=5)
        assert [m["offset"] for m in page["msgList"]] == [10, 11, 12, 13, 14] and page["next"] == 15
        assert "scanLimit" not in page
        first = browse()
        assert first["msgList"][0]["offset"] == 0 and len(first["msgList"]) == 30
        stamp = first["msgList"][0]["timestamp"]
        assert browse(timestamp=stamp + 10**6)["msgList"] == []
        assert browse(timestamp=stamp, max=1)["msgList"][0]["offset"] == 0
        keyed = browse(key="k1", max=3)
        assert [m["offset"] for m in keyed["msgList"]] == [1, 4, 7] and keyed["next"] == 8
        bounded = browse(key="k1", scan=5)
        assert [m["offset"] for m in bounded["msgList"]] == [1, 4]
        assert (bounded["scanned"], bounded["scanLimit"], bounded["next"]) == (5, 5, 5)
        found = browse(token=ctoken, consumer=f"{topic}-c", messageId=ids[21])
        assert [m["offset"] for m in found["msgList"]] == [21] and found["scanned"] == 22
        assert browse(messageId="nope", scan=10)["msgList"] == []
        bad = get(server, "/mq/browse", server.admin_token, topic=topic, queue=0, key="a", messageId="b")
        assert bad.status_code == 400
        assert get(server, "/mq/browse", server.admin_token, topic=topic, queue=7).status_code == 400
        other = get(server, "/mq/browse", ctoken, topic=topic, consumer="someone-else", queue=0)
        assert other.status_code in (401, 403)
        assert httpx.get(server.url + "/mq/browse", params={"topic": topic, "queue": 0}).status_code == 401
        # Nothing was consumed.
        assert server.admin("GET", f"/admin/consumers/{topic}-c/progress")["lag"] == 30
