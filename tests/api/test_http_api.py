"""The HTTP API against a real gateway process."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import Client, Server, wait_until


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic_client(shared_server: Server, request: pytest.FixtureRequest) -> Any:
    """A fresh topic on the shared server; consumer options come from indirect parametrization."""
    opts = dict(getattr(request, "param", None) or {})  # a copy: the same param serves every store
    topic = unique("t")
    ptoken, ctoken = shared_server.setup_topic(topic, queues=opts.pop("queues", 4), consumer_args=opts)
    client = Client(shared_server, ptoken, ctoken)
    yield topic, client
    client.close()


def result(r: httpx.Response) -> Any:
    return r.json()["result"]


def pull_all(client: Client, topic: str, **params: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(100):
        r = client.pull(topic, f"{topic}-c", max=100, **params)
        body = result(r)
        if body["status"] != "FOUND":
            return out
        out += body["msgList"]
        assert client.call("/mq/ack", requestId=body["requestId"]).status_code == 200
    raise AssertionError("pull_all did not drain the topic")


class TestProduceAndConsume:
    def test_round_trip_with_ack(self, topic_client: Any) -> None:
        topic, c = topic_client
        r = c.produce(f"{topic}-p", "héllo", keys=["k1"], tags=["a"], properties={"x": "1"})
        assert r.status_code == 200
        receipt = result(r)
        assert set(receipt) == {"msgId", "broker", "status", "queue", "offset"}
        assert receipt["status"] == "stored"
        body = result(c.pull(topic, f"{topic}-c"))
        assert body["status"] == "FOUND"
        (m,) = body["msgList"]
        assert m["message"] == "héllo" and m["keys"] == ["k1"] and m["tags"] == ["a"]
        assert m["properties"] == {"x": "1"} and m["messageId"] == receipt["msgId"]
        assert (m["queue"], m["offset"], m["reconsumeTimes"]) == (receipt["queue"], receipt["offset"], 0)
        ack = c.call("/mq/ack", requestId=body["requestId"])
        assert ack.status_code == 200
        again = c.call("/mq/ack", requestId=body["requestId"])  # a retried ack: its own answer
        assert again.status_code == 409 and result(again)["code"] == "already_acked"
        assert result(c.pull(topic, f"{topic}-c"))["status"] == "NO_NEW_MSG"

    def test_form_encoded_bodies_work(self, topic_client: Any) -> None:
        topic, c = topic_client
        r = c.http.post(
            "/mq/produce",
            data={"producer": f"{topic}-p", "message": "form body", "keys": "a,b", "properties": '{"p":"v"}'},
            headers={"Authorization": f"Bearer {c.ptoken}"},
        )
        assert r.status_code == 200, r.text
        (m,) = pull_all(c, topic)
        assert (m["message"], m["keys"], m["properties"]) == ("form body", ["a", "b"], {"p": "v"})

    def test_batch_receipts_in_order_and_order_key_keeps_order(self, topic_client: Any) -> None:
        topic, c = topic_client
        msgs = [{"message": f"m{i}", "orderKey": "customer-7"} for i in range(50)]
        r = c.produce_batch(f"{topic}-p", msgs)
        assert r.status_code == 200
        receipts = result(r)["receipts"]
        assert len(receipts) == 50 and len({x["queue"] for x in receipts}) == 1
        assert [x["offset"] for x in receipts] == list(
            range(receipts[0]["offset"], receipts[0]["offset"] + 50)
        )
        got = pull_all(c, topic)
        assert [m["message"] for m in got] == [f"m{i}" for i in range(50)]

    def test_round_robin_spreads_over_queues(self, topic_client: Any) -> None:
        topic, c = topic_client
        queues = [result(c.produce(f"{topic}-p", "x"))["queue"] for _ in range(8)]
        assert set(queues) == {0, 1, 2, 3}
        # A batch takes the next turns in one step, going on from the single produces.
        batch = result(c.produce_batch(f"{topic}-p", [{"message": str(i)} for i in range(6)]))
        turn = queues[-1] + 1
        assert [r["queue"] for r in batch["receipts"]] == [(turn + i) % 4 for i in range(6)]

    def test_next_pull_acks_the_previous_batch(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce_batch(f"{topic}-p", [{"message": str(i)} for i in range(6)])
        first = result(c.pull(topic, f"{topic}-c", max=100))
        second = result(c.pull(topic, f"{topic}-c", max=100, requestId=first["requestId"]))
        assert second["ack"] == "ok"
        progress = c.server.admin("GET", f"/admin/consumers/{topic}-c/progress")
        q = next(q for q in progress["queues"] if q["queue"] == first["msgList"][0]["queue"])
        assert q["committed"] == first["msgList"][-1]["offset"] + 1

    def test_release_delivers_again_after_a_backoff(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "again")
        first = result(c.pull(topic, f"{topic}-c"))
        released = time.monotonic()
        assert c.call("/mq/release", requestId=first["requestId"]).status_code == 200
        assert result(c.pull(topic, f"{topic}-c"))["status"] == "NO_NEW_MSG"  # backing off
        second = result(c.pull(topic, f"{topic}-c", wait=5))
        assert time.monotonic() - released >= 0.9  # the first backoff is 1 s (SPEC S5)
        again = second["msgList"][0]
        assert again["messageId"] == first["msgList"][0]["messageId"]
        assert again["reconsumeTimes"] == 1 and again["properties"]["mq.deliveries"] == "1"
        stale = c.call("/mq/ack", requestId=first["requestId"])
        assert stale.status_code == 409 and result(stale)["code"] == "offset_moved"
        assert c.call("/mq/ack", requestId=second["requestId"]).status_code == 200

    def test_forged_token_is_403_and_garbage_is_400(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "x")
        rid = result(c.pull(topic, f"{topic}-c"))["requestId"]
        forged = rid[:-2] + ("AA" if rid[-2:] != "AA" else "BB")
        r = c.call("/mq/ack", requestId=forged)
        assert r.status_code == 403 and result(r)["field"] == "requestId"
        r = c.call("/mq/ack", requestId="not a token!")
        assert r.status_code == 400 and result(r)["field"] == "requestId"


class TestLocks:
    @pytest.mark.parametrize("topic_client", [{"lockTimeoutS": 1}], indirect=True)
    def test_unacked_batch_is_redelivered_after_the_lock_timeout(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "slow")
        first = result(c.pull(topic, f"{topic}-c"))
        assert result(c.pull(topic, f"{topic}-c"))["status"] == "NO_NEW_MSG"  # locked
        # Lock timeout (1 s), then the first redelivery backoff (1 s).
        second = result(c.pull(topic, f"{topic}-c", wait=5))
        assert second["status"] == "FOUND" and second["msgList"][0]["reconsumeTimes"] == 1
        late = c.call("/mq/ack", requestId=first["requestId"])
        assert late.status_code == 409 and result(late)["code"] == "offset_moved"
        assert c.call("/mq/ack", requestId=second["requestId"]).status_code == 200

    @pytest.mark.parametrize("topic_client", [{"lockTimeoutS": 1}], indirect=True)
    def test_expired_lock_ack_is_refused_not_silently_accepted(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "x")
        first = result(c.pull(topic, f"{topic}-c"))
        time.sleep(1.2)  # the lock timeout itself is what is under test
        r = c.call("/mq/ack", requestId=first["requestId"])
        assert r.status_code == 409 and result(r)["code"] == "lock_expired"

    @pytest.mark.parametrize("topic_client", [{"lockTimeoutS": 1}], indirect=True)
    def test_extend_keeps_a_slow_consumers_lock(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "x")
        first = result(c.pull(topic, f"{topic}-c"))
        assert c.call("/mq/extend", requestId=first["requestId"], seconds=30).status_code == 200
        assert result(c.pull(topic, f"{topic}-c", wait=1.5))["status"] == "NO_NEW_MSG"
        assert c.call("/mq/ack", requestId=first["requestId"]).status_code == 200

    @pytest.mark.parametrize(
        "topic_client", [{"lockTimeoutS": 1, "maxAttempts": 2, "queues": 1}], indirect=True
    )
    def test_poison_batch_goes_to_the_dead_letter_topic(self, topic_client: Any) -> None:
        topic, c = topic_client
        server = c.server
        c.produce_batch(f"{topic}-p", [{"message": "poison-1"}, {"message": "poison-2"}])
        seen = [result(c.pull(topic, f"{topic}-c", max=10))]
        seen.append(result(c.pull(topic, f"{topic}-c", max=10, wait=5)))
        assert [b["msgList"][0]["reconsumeTimes"] for b in seen] == [0, 1]
        c.produce(f"{topic}-p", "healthy")
        after = result(c.pull(topic, f"{topic}-c", max=10, wait=5))
        assert [m["message"] for m in after["msgList"]] == ["healthy"]
        assert c.call("/mq/ack", requestId=after["requestId"]).status_code == 200

        # The second delivery's lock runs out too: the next pull moves the batch to the DLQ.
        def dead_lettered() -> bool:
            assert result(c.pull(topic, f"{topic}-c", wait=1))["status"] == "NO_NEW_MSG"
            return server.admin("GET", f"/admin/consumers/{topic}-c/progress")["deadLettered"] == 2

        wait_until(dead_lettered, 10, "the poison batch to be dead-lettered")
        dlq = f"%DLQ%{topic}-c"
        dtoken = server.admin("POST", "/admin/consumers", name=f"{topic}-dlq", topic=dlq)["token"]
        r = c.http.get(
            f"/mq/message?topic={quote(dlq)}&consumer={topic}-dlq&max=10",
            headers={"Authorization": f"Bearer {dtoken}"},
        )
        msgs = result(r)["msgList"]
        assert [m["message"] for m in msgs] == ["poison-1", "poison-2"]
        assert msgs[0]["properties"]["dlq.reason"] == "max_attempts"
        assert msgs[0]["properties"]["dlq.topic"] == topic


class TestLongPolling:
    def test_a_waiting_pull_answers_as_soon_as_a_message_arrives(self, topic_client: Any) -> None:
        topic, c = topic_client
        answer: dict[str, Any] = {}

        def waiter() -> None:
            r = c.pull(topic, f"{topic}-c", wait=10)
            answer["at"] = time.monotonic()
            answer["body"] = result(r)

        t = threading.Thread(target=waiter)
        t.start()
        gauge = f'mqgate_waiting_pulls{{consumer="{topic}-c"}} 1.0'  # what is measured: the wake-up
        wait_until(lambda: gauge in httpx.get(c.server.url + "/metrics", timeout=10).text, 20, "the poll")
        c2 = Client(c.server, c.ptoken, None)
        assert c2.produce(f"{topic}-p", "wake").status_code == 200
        # From the moment the message is stored (the produce's 200), not from before the
        # producer connected: a busy CI machine once spent most of 0.5 s on the produce itself.
        stored_at = time.monotonic()
        c2.close()
        t.join(15)
        assert answer["body"]["status"] == "FOUND"
        assert answer["at"] - stored_at < 5  # woken, not timed out after the 10 s wait

    def test_wait_without_messages_returns_after_the_wait(self, topic_client: Any) -> None:
        topic, c = topic_client
        started = time.monotonic()
        assert result(c.pull(topic, f"{topic}-c", wait=1))["status"] == "NO_NEW_MSG"
        assert 0.9 < time.monotonic() - started < 3


class TestOperations:
    def test_pause_and_resume(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "x")
        c.server.admin("POST", f"/admin/consumers/{topic}-c/pause")
        assert result(c.pull(topic, f"{topic}-c"))["status"] == "PAUSED"
        progress = c.server.admin("GET", f"/admin/consumers/{topic}-c/progress")
        assert progress["paused"] and not any(q["locked"] for q in progress["queues"])
        c.server.admin("POST", f"/admin/consumers/{topic}-c/resume")
        assert result(c.pull(topic, f"{topic}-c"))["status"] == "FOUND"

    def test_a_long_poll_begun_before_a_pause_answers_paused(self, topic_client: Any) -> None:
        """Not the message produced after the pause (it was handed out before)."""
        topic, c = topic_client
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(result(c.pull(topic, f"{topic}-c", wait=20))))
        waiter.start()
        gauge = f'mqgate_waiting_pulls{{consumer="{topic}-c"}} 1.0'
        wait_until(lambda: gauge in httpx.get(c.server.url + "/metrics", timeout=10).text, 20, "the poll")
        c.server.admin("POST", f"/admin/consumers/{topic}-c/pause")
        c.produce(f"{topic}-p", "after the pause")
        waiter.join(25)
        assert [g["status"] for g in got] == ["PAUSED"]
        c.server.admin("POST", f"/admin/consumers/{topic}-c/resume")
        assert [m["message"] for m in result(c.pull(topic, f"{topic}-c"))["msgList"]] == ["after the pause"]

    def test_rate_limit_is_enforced_across_requests(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce_batch(f"{topic}-p", [{"message": str(i), "orderKey": "k"} for i in range(40)])
        c.server.admin("POST", f"/admin/consumers/{topic}-c/rate-limit", messagesPerSecond=5)
        first = c.pull(topic, f"{topic}-c", max=100)
        assert len(result(first)["msgList"]) == 5
        limited = c.pull(topic, f"{topic}-c", max=100, requestId=result(first)["requestId"])
        assert limited.status_code == 429 and result(limited)["status"] == "RATE_LIMITED"
        assert int(limited.headers["retry-after"]) >= 1
        assert result(limited)["ack"] == "ok"
        c.server.admin("POST", f"/admin/consumers/{topic}-c/rate-limit", messagesPerSecond=0)
        assert len(result(c.pull(topic, f"{topic}-c", max=100))["msgList"]) == 35

    def test_backlog_alerts(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce_batch(f"{topic}-p", [{"message": str(i)} for i in range(10)])
        c.server.admin("POST", f"/admin/consumers/{topic}-c/alert", backlog=3)
        alerts = c.server.admin("GET", "/admin/alerts")["alerts"]
        assert {"consumer": f"{topic}-c", "topic": topic, "lag": 10, "threshold": 3} in alerts
        pull_all(c, topic)
        alerts = c.server.admin("GET", "/admin/alerts")["alerts"]
        assert not [a for a in alerts if a["consumer"] == f"{topic}-c"]

    def test_reset_to_earliest_latest_offset_and_timestamp(self, topic_client: Any) -> None:
        topic, c = topic_client
        server = c.server
        name = f"{topic}-c"
        c.produce_batch(f"{topic}-p", [{"message": f"a{i}", "orderKey": "k"} for i in range(5)])
        time.sleep(0.01)
        middle = int(time.time() * 1000)
        time.sleep(0.01)
        c.produce_batch(f"{topic}-p", [{"message": f"b{i}", "orderKey": "k"} for i in range(5)])
        assert len(pull_all(c, topic)) == 10
        p = server.admin("POST", f"/admin/consumers/{name}/reset", to="earliest")
        assert p["lag"] == 10
        p = server.admin("POST", f"/admin/consumers/{name}/reset", to="latest")
        assert p["lag"] == 0
        server.admin("POST", f"/admin/consumers/{name}/reset", to="timestamp", timestamp=middle)
        assert [m["message"] for m in pull_all(c, topic)] == [f"b{i}" for i in range(5)]
        queue = result(c.produce(f"{topic}-p", "z", orderKey="k"))["queue"]
        server.admin("POST", f"/admin/consumers/{name}/reset", to="offset", offset=3, queue=queue)
        assert len(pull_all(c, topic)) == 8

    def test_consumer_starting_at_latest_skips_the_backlog(self, shared_server: Server) -> None:
        topic = unique("late")
        ptoken, _ = shared_server.setup_topic(topic, queues=2)
        c = Client(shared_server, ptoken, None)
        c.produce_batch(f"{topic}-p", [{"message": "old"}] * 4)
        c.ctoken = shared_server.admin(
            "POST", "/admin/consumers", name=f"{topic}-late", topic=topic, start="latest"
        )["token"]
        c.produce(f"{topic}-p", "new")
        r = result(c.pull(topic, f"{topic}-late", max=10))
        assert [m["message"] for m in r["msgList"]] == ["new"]
        c.close()

    def test_progress_metrics_health_and_openapi(self, topic_client: Any) -> None:
        topic, c = topic_client
        c.produce(f"{topic}-p", "x")
        body = result(c.pull(topic, f"{topic}-c"))
        p = c.server.admin("GET", f"/admin/consumers/{topic}-c/progress")
        locked = [q for q in p["queues"] if q["locked"]]
        assert len(locked) == 1 and locked[0]["lockAgeMs"] >= 0 and locked[0]["attempts"] == 1
        assert set(locked[0]) >= {"min", "max", "committed", "lag", "lockOwner", "lastAccessMs"}
        c.call("/mq/ack", requestId=body["requestId"])
        metrics = c.http.get("/metrics").text
        assert f'mqgate_produced_messages_total{{topic="{topic}"}} 1.0' in metrics
        assert f'mqgate_consumer_lag{{consumer="{topic}-c"}} 0.0' in metrics
        assert "mqgate_request_seconds_bucket" in metrics
        assert result(c.http.get("/healthz"))["healthy"] is True

    def test_openapi_lists_exactly_the_routes_that_exist(self, shared_server: Server) -> None:
        doc = httpx.get(shared_server.url + "/openapi.json").json()
        assert doc["openapi"].startswith("3.")
        listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
        assert ("POST", "/mq/produce") in listed and ("GET", "/mq/message") in listed
        for method, path in listed:
            r = httpx.request(method, shared_server.url + path.replace("{name}", "nobody"), timeout=10)
            assert r.status_code != 404 or result(r)["code"] != "no_route", (method, path)
            assert r.status_code < 500, (method, path, r.text)
        r = httpx.get(shared_server.url + "/mq/nothing-here")
        assert r.status_code == 404 and result(r)["code"] == "no_route"


class TestSecurityAndBadInput:
    def test_tokens_are_required_and_scoped(self, shared_server: Server) -> None:
        a, b = unique("a"), unique("b")
        pa, ca = shared_server.setup_topic(a)
        pb, _ = shared_server.setup_topic(b)
        http = httpx.Client(base_url=shared_server.url)
        r = http.post("/mq/produce", json={"producer": f"{a}-p", "message": "x"})
        assert r.status_code == 401 and result(r)["field"] == "Authorization"
        r = http.post(
            "/mq/produce",
            json={"producer": f"{a}-p", "message": "x"},
            headers={"Authorization": f"Bearer {pb}"},
        )
        assert r.status_code == 403
        r = http.get(
            "/mq/message",
            params={"topic": b, "consumer": f"{a}-c"},
            headers={"Authorization": f"Bearer {ca}"},
        )
        assert r.status_code == 403 and result(r)["field"] == "topic"
        r = http.post("/admin/topics", json={"name": unique("x")}, headers={"Authorization": f"Bearer {pa}"})
        assert r.status_code == 403
        assert http.get("/admin/topics").status_code == 401
        http.close()

    def test_unknown_producer_is_named_to_the_admin_only(self, shared_server: Server) -> None:
        r = httpx.post(
            shared_server.url + "/mq/produce",
            json={"producer": "ghost", "message": "x"},
            headers={"Authorization": f"Bearer {shared_server.admin_token}"},
        )
        assert r.status_code == 404
        assert r.json()["message"] == "producer ghost is not registered"
        # A token that is no one's cannot tell a registered name from an unknown one.
        r = httpx.post(
            shared_server.url + "/mq/produce",
            json={"producer": "ghost", "message": "x"},
            headers={"Authorization": "Bearer whatever"},
        )
        assert r.status_code == 401 and "ghost" not in r.json()["message"]

    @pytest.mark.parametrize(
        ("params", "field"),
        [
            ({"max": 0}, "max"),
            ({"max": 1025}, "max"),
            ({"max": "ten"}, "max"),
            ({"wait": 31}, "wait"),
            ({"wait": -1}, "wait"),
            ({"wait": "nan"}, "wait"),
        ],
    )
    def test_bad_pull_parameters_are_400_naming_the_field(
        self, topic_client: Any, params: dict[str, Any], field: str
    ) -> None:
        topic, c = topic_client
        r = c.pull(topic, f"{topic}-c", **params)
        assert r.status_code == 400 and result(r)["field"] == field

    def test_size_limits(self, topic_client: Any) -> None:
        topic, c = topic_client
        r = c.produce(f"{topic}-p", "x" * (1024 * 1024 + 1))
        assert r.status_code == 413 and result(r)["field"] == "message"
        assert c.produce(f"{topic}-p", "x" * (1024 * 1024)).status_code == 200
        r = c.produce_batch(f"{topic}-p", [{"message": "x"}] * 1001)
        assert r.status_code == 400 and result(r)["field"] == "messages"
        r = c.produce_batch(f"{topic}-p", [{"message": "y" * 1024 * 1024}] * 4 + [{"message": "z"}])
        assert r.status_code == 413 and result(r)["field"] == "messages"
        r = c.http.post(
            "/mq/produce",
            content=b"{" + b" " * (6 * 1024 * 1024) + b"}",
            headers={"Authorization": f"Bearer {c.ptoken}", "Content-Type": "application/json"},
        )
        assert r.status_code == 413 and result(r)["field"] == "body"

    @pytest.mark.parametrize(
        ("body", "content_type", "field"),
        [
            (b"{not json", "application/json", "body"),
            (b"[1,2]", "application/json", "body"),
            (b'{"producer": 5, "message": "x"}', "application/json", "producer"),
            (b'{"producer": "p", "message": 5}', "application/json", "message"),
            (b'{"producer": "../../etc", "message": "x"}', "application/json", "producer"),
            (b"<xml/>", "text/xml", "body"),
        ],
    )
    def test_malformed_produce_bodies(
        self, shared_server: Server, body: bytes, content_type: str, field: str
    ) -> None:
        topic = unique("bad")
        ptoken, _ = shared_server.setup_topic(topic)
        body = body.replace(b'"p"', f'"{topic}-p"'.encode())
        r = httpx.post(
            shared_server.url + "/mq/produce",
            content=body,
            headers={"Content-Type": content_type, "Authorization": f"Bearer {ptoken}"},
        )
        assert 400 <= r.status_code < 500, r.text
        assert result(r)["field"] == field

    @pytest.mark.parametrize(
        ("fields", "field"),
        [
            ({"keys": [1]}, "keys"),
            ({"keys": ["k"] * 33}, "keys"),
            ({"properties": {"a": 1}}, "properties"),
            ({"properties": "nope"}, "properties"),
            ({"tags": ["x" * 257]}, "tags"),
            ({"orderKey": 3}, "orderKey"),
        ],
    )
    def test_bad_message_fields(self, topic_client: Any, fields: dict[str, Any], field: str) -> None:
        topic, c = topic_client
        r = c.produce(f"{topic}-p", "x", **fields)
        assert r.status_code == 400 and result(r)["field"] == field

    def test_admin_input_errors(self, shared_server: Server) -> None:
        h = {"Authorization": f"Bearer {shared_server.admin_token}"}
        cases = [
            ({"name": "a/b"}, "/admin/topics", "name"),
            ({"name": unique("q"), "queues": 0}, "/admin/topics", "queues"),
            ({"name": unique("q"), "queues": 257}, "/admin/topics", "queues"),
            ({"name": unique("p"), "topic": "missing"}, "/admin/producers", "topic"),
            ({"name": unique("c"), "topic": "missing"}, "/admin/consumers", "topic"),
        ]
        for body, path, field in cases:
            r = httpx.post(shared_server.url + path, json=body, headers=h)
            assert 400 <= r.status_code < 500 and result(r)["field"] == field, (body, r.text)
        topic = unique("dup")
        shared_server.setup_topic(topic)
        r = httpx.post(shared_server.url + "/admin/topics", json={"name": topic}, headers=h)
        assert r.status_code == 409
        r = httpx.post(
            shared_server.url + "/admin/consumers",
            json={"name": unique("c"), "topic": topic, "mode": "fanout"},
            headers=h,
        )
        assert r.status_code == 400 and result(r)["field"] == "mode"

    def test_broadcast_pull_needs_a_client_id(self, shared_server: Server) -> None:
        topic = unique("bc")
        ptoken, ctoken = shared_server.setup_topic(topic, consumer_args={"mode": "broadcast"})
        c = Client(shared_server, ptoken, ctoken)
        r = c.pull(topic, f"{topic}-c")
        assert r.status_code == 400 and result(r)["field"] == "clientId"
        c.produce(f"{topic}-p", "x")
        for client_id in ("host1-1", "host2-7"):
            body = result(c.pull(topic, f"{topic}-c", clientId=client_id))
            assert [m["message"] for m in body["msgList"]] == ["x"]
        c.close()


def test_registry_changes_from_another_gateway_are_seen(tmp_path: Any) -> None:
    """A producer added straight into the shared registry is usable after the refresh interval."""
    from mqgate.registry.records import ProducerRecord, hash_token
    from mqgate.registry.sql import SqlRegistry

    server = Server(tmp_path / "data", env={"MQGATE_REGISTRY_REFRESH_S": "0.3"}).start()
    try:
        _ptoken, _ = server.setup_topic("shared")
        registry = SqlRegistry(f"sqlite:///{tmp_path / 'data' / 'registry.db'}")
        registry.add_producer(ProducerRecord("other-p", "shared", hash_token("tok-other"), 0))
        registry.dispose()
        c = Client(server, "tok-other", None)
        r = wait_until(lambda: (x := c.produce("other-p", "hi")).status_code == 200 and x, 5, "the refresh")
        assert result(r)["offset"] == 0
        c.close()
    finally:
        server.stop()


def test_idle_broadcast_clients_expire_and_start_at_a_timestamp(tmp_path: Any) -> None:
    server = Server(tmp_path / "data", env={"MQGATE_BROADCAST_CLIENT_TTL_S": "1"}).start()
    try:
        ptoken, ctoken = server.setup_topic("bc", consumer_args={"mode": "broadcast"})
        c = Client(server, ptoken, ctoken)
        c.produce("bc-p", "before", orderKey="k")
        time.sleep(0.01)
        cutoff = int(time.time() * 1000)
        time.sleep(0.01)
        c.produce("bc-p", "after", orderKey="k")
        body = result(c.pull("bc", "bc-c", clientId="idle-client", max=10))
        assert [m["message"] for m in body["msgList"]] == ["before", "after"]
        clients = {q["clientId"] for q in server.admin("GET", "/admin/consumers/bc-c/progress")["queues"]}
        assert clients == {"idle-client"}
        wait_until(
            lambda: not server.admin("GET", "/admin/consumers/bc-c/progress")["queues"],
            10,
            "the idle clientId to expire",
            interval_s=0.1,
        )
        c.ctoken = server.admin("POST", "/admin/consumers", name="from-ts", topic="bc", start=str(cutoff))[
            "token"
        ]
        body = result(c.pull("bc", "from-ts", max=10))
        assert [m["message"] for m in body["msgList"]] == ["after"]
        c.close()
    finally:
        server.stop()


def test_broker_names_with_format_characters_are_served_verbatim(tmp_path: Any) -> None:
    server = Server(tmp_path / "data", env={"MQGATE_BROKER_NAME": "b-1.eu_west"}).start()
    try:
        ptoken, ctoken = server.setup_topic("br")
        c = Client(server, ptoken, ctoken)
        c.produce("br-p", "x")
        (m,) = result(c.pull("br", "br-c"))["msgList"]
        assert m["broker"] == "b-1.eu_west"
        c.close()
    finally:
        server.stop()
    bad = Server(tmp_path / "data2", env={"MQGATE_BROKER_NAME": "b%d"})
    with pytest.raises(AssertionError, match="exited"):
        bad.start(timeout_s=10)


def test_batch_fast_path_and_fallback_agree(shared_server: Server) -> None:
    """Valid batches take the typed decoder; anything unusual takes the field-naming path."""
    topic = unique("fp")
    ptoken, ctoken = shared_server.setup_topic(topic, queues=1)
    c = Client(shared_server, ptoken, ctoken)
    fast = [{"message": "a", "keys": ["k"], "tags": ["t"], "properties": {"p": "v"}, "orderKey": "o"}]
    slow = [{"message": "é", "keys": "k1,k2", "orderKey": ""}]  # non-ASCII, comma keys, empty key
    assert c.produce_batch(f"{topic}-p", fast).status_code == 200
    assert c.produce_batch(f"{topic}-p", slow).status_code == 200
    r = c.http.post(
        f"/mq/produce/batch?producer={topic}-p",
        json={"messages": [{"message": "via query"}]},
        headers={"Authorization": f"Bearer {ptoken}"},
    )
    assert r.status_code == 200, r.text
    got = pull_all(c, topic)
    assert [(m["message"], m["keys"]) for m in got] == [("a", ["k"]), ("é", ["k1", "k2"]), ("via query", [])]
    assert got[0]["properties"] == {"p": "v"} and got[0]["tags"] == ["t"]
    bad = c.produce_batch(f"{topic}-p", [{"message": "x", "keys": [1]}])
    assert bad.status_code == 400 and result(bad)["field"] == "messages[0].keys"
    bad = c.produce_batch(f"{topic}-p", [{"message": "x", "tags": ["t" * 300]}])
    assert bad.status_code == 400 and result(bad)["field"] == "messages[0].tags"
    r = c.http.post(
        "/mq/produce/batch",
        data={"producer": f"{topic}-p", "messages": "x"},
        headers={"Authorization": f"Bearer {ptoken}"},
    )
    assert r.status_code == 415 and result(r)["field"] == "body"
    c.close()
