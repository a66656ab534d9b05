"""Growing a topic live and deleting topics, producers and consumers (issue 10, section 4), on
both stores: what happens to data, offsets, side queues and held messages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Client, RedisServer, Server, wait_until

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def call(server: Server, method: str, path: str, **body: Any) -> httpx.Response:
    h = {"Authorization": f"Bearer {server.admin_token}"}
    return httpx.request(method, server.url + path, json=body or None, headers=h, timeout=30)


def drain(client: Client, topic: str, consumer: str) -> list[dict[str, Any]]:
    """Pull and ack until nothing is left; the messages in delivery order."""
    got: list[dict[str, Any]] = []
    while True:
        res = client.pull(topic, consumer, max=100, wait=0).json()["result"]
        if res["status"] != "FOUND":
            return got
        got += res["msgList"]
        r = client.call("/mq/ack", requestId=res["requestId"])
        assert r.status_code == 200, r.text


def receipts(client: Client, producer: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = client.produce_batch(producer, messages)
    assert r.status_code == 200, r.text
    return list(r.json()["result"]["receipts"])


def test_a_topic_grows_queues_and_lanes_live(server: Server) -> None:
    server.admin("POST", "/admin/topics", name="g", queues=2, maxPriority=1)
    ptoken = server.admin("POST", "/admin/producers", name="g-p", topic="g")["token"]
    ctoken = server.admin("POST", "/admin/consumers", name="g-c", topic="g", start="latest")["token"]
    client = Client(server, ptoken, ctoken)
    before = receipts(client, "g-p", [{"message": f"old{i}", "orderKey": f"k{i}"} for i in range(10)])
    assert {r["queue"] for r in before} == {0, 1}
    assert len(drain(client, "g", "g-c")) == 10

    r = call(server, "PATCH", "/admin/topics/g", queues=4)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["queues"] == 4 and r.json()["result"]["maxPriority"] == 1

    plain = receipts(client, "g-p", [{"message": f"new{i}", "orderKey": f"k{i}"} for i in range(40)])
    # Lane 0 had store queues 0-1 and lane 1 2-3; the grown cells of lanes 0 and 1 are 4-5, 6-7.
    assert {r["queue"] for r in plain} == {0, 1, 4, 5}
    urgent = receipts(
        client, "g-p", [{"message": f"hi{i}", "orderKey": f"k{i}", "priority": 1} for i in range(40)]
    )
    assert {r["queue"] for r in urgent} == {2, 3, 6, 7}
    # A consumer that started at "latest" before the growth still reads the new queues from
    # their beginning, and nothing old again.
    got = drain(client, "g", "g-c")
    assert sorted(m["message"] for m in got) == sorted(
        [f"new{i}" for i in range(40)] + [f"hi{i}" for i in range(40)]
    )
    r = httpx.get(
        server.url + "/mq/read",
        params={"topic": "g", "queue": 5, "offset": 0, "consumer": "g-c"},
        headers={"Authorization": f"Bearer {ctoken}"},
    )
    assert r.status_code == 200 and r.json()["result"]["msgList"], r.text

    assert call(server, "PATCH", "/admin/topics/g", maxPriority=2).status_code == 200
    top = receipts(
        client, "g-p", [{"message": f"top{i}", "orderKey": f"k{i}", "priority": 2} for i in range(20)]
    )
    assert {r["queue"] for r in top} == {8, 9, 10, 11}
    progress = server.admin("GET", "/admin/consumers/g-c/progress")
    assert sorted(q["queue"] for q in progress["queues"] if q["source"] == "g") == list(range(12))

    # The numbering outlives a restart: it is in the registry.
    server.stop()
    server.start()
    again = receipts(client, "g-p", [{"message": "after", "orderKey": "k3", "priority": 1}])
    assert again[0]["queue"] == urgent[3]["queue"]
    client.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [({"queues": 1}, "queues"), ({"maxPriority": 0}, "maxPriority"), ({"queues": 0}, "queues")],
)
def test_a_topic_never_shrinks(server: Server, body: dict[str, Any], field: str) -> None:
    server.admin("POST", "/admin/topics", name="s", queues=2, maxPriority=1)
    r = call(server, "PATCH", "/admin/topics/s", **body)
    assert r.status_code == 400 and r.json()["result"]["field"] == field, r.text
    assert call(server, "PATCH", "/admin/topics/nope", queues=3).status_code == 404


def test_deleting_a_consumer_drops_its_offsets_side_queues_and_dead_letters(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("d", queues=2)
    itoken = server.admin("POST", "/admin/producers", name="to-inbox", topic="d", destinations=["inbox:d-c"])[
        "token"
    ]
    client = Client(server, ptoken, ctoken)
    receipts(client, "d-p", [{"message": f"m{i}"} for i in range(6)])
    assert len(drain(client, "d", "d-c")) == 6
    sender = Client(server, itoken, None)
    r = sender.produce("to-inbox", "for the inbox", destinations=[{"consumer": "d-c"}])
    assert r.status_code == 200, r.text
    sender.close()
    assert server.admin("GET", "/admin/topics/%25DLQ%25d-c")["name"] == "%DLQ%d-c"

    r = call(server, "DELETE", "/admin/consumers/d-c")
    assert r.status_code == 200 and r.json()["result"] == {"name": "d-c", "deleted": True}, r.text
    assert client.pull("d", "d-c").status_code in (401, 404)  # its token is no one's now
    assert call(server, "GET", "/admin/topics/%25DLQ%25d-c").status_code == 404
    assert call(server, "GET", "/admin/consumers/d-c/progress").status_code == 404
    assert call(server, "DELETE", "/admin/consumers/d-c").status_code == 404

    # The same name starts afresh: no table (so `earliest` reads everything again), an empty
    # inbox (the message sent to the old one is gone), an empty dead-letter topic.
    client.ctoken = server.admin("POST", "/admin/consumers", name="d-c", topic="d", start="earliest")["token"]
    assert sorted(m["message"] for m in drain(client, "d", "d-c")) == [f"m{i}" for i in range(6)]
    dlq = server.admin("GET", "/admin/consumers/d-c/progress")
    assert dlq["deadLettered"] == 0
    client.close()


def test_a_consumers_dead_letters_can_be_kept(server: Server) -> None:
    server.setup_topic("k", queues=1)
    h = {"Authorization": f"Bearer {server.admin_token}"}
    r = httpx.delete(server.url + "/admin/consumers/k-c", params={"keepDeadLetters": "true"}, headers=h)
    assert r.status_code == 200, r.text
    assert server.admin("GET", "/admin/topics/%25DLQ%25k-c")["name"] == "%DLQ%k-c"
    server.admin("POST", "/admin/consumers", name="k-c", topic="k")  # takes its old DLQ topic back


def test_a_topic_in_use_is_not_deleted_and_a_deleted_one_is_gone(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("x", queues=2)
    client = Client(server, ptoken, ctoken)
    receipts(client, "x-p", [{"message": "kept?"}])
    r = call(server, "DELETE", "/admin/topics/x")
    assert r.status_code == 409 and r.json()["result"]["code"] == "in_use", r.text
    assert "producer x-p" in r.json()["message"] and "consumer x-c" in r.json()["message"]
    assert call(server, "DELETE", "/admin/topics/%25DLQ%25x-c").json()["result"]["field"] == "name"

    assert call(server, "DELETE", "/admin/producers/x-p").status_code == 200
    assert client.produce("x-p", "after").status_code == 401  # its token is refused at once
    assert call(server, "DELETE", "/admin/consumers/x-c").status_code == 200
    r = call(server, "DELETE", "/admin/topics/x")
    assert r.status_code == 200, r.text
    assert "x" not in [t["name"] for t in server.admin("GET", "/admin/topics")["topics"]]
    assert call(server, "GET", "/admin/topics/x").status_code == 404
    if "--store" not in server.extra_args:
        assert not (server.data_dir / "topics" / "x").exists()

    # A new topic of the same name is empty.
    client.ptoken, client.ctoken = server.setup_topic("x", queues=2)
    assert drain(client, "x", "x-c") == []
    assert receipts(client, "x-p", [{"message": "new"}])[0]["offset"] == 0
    client.close()


def test_held_messages_of_a_deleted_topic_are_dropped_and_counted(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("h", queues=1)
    client = Client(server, ptoken, ctoken)
    r = client.produce("h-p", "later", delayMs=1500)
    assert r.status_code == 200 and r.json()["result"]["status"] == "scheduled", r.text
    for path in ("/admin/producers/h-p", "/admin/consumers/h-c", "/admin/topics/h"):
        assert call(server, "DELETE", path).status_code == 200
    pattern = re.compile(r'^mqgate_dropped_held_messages_total\{target="t:h"\} 1\.0$', re.M)
    wait_until(lambda: pattern.search(httpx.get(server.url + "/metrics").text), 15, "the drop to be counted")
    client.close()


def test_a_topic_whose_store_delete_fails_stays_registered_with_its_messages(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """The registry row goes first (no produce or pull finds a topic being deleted); when the
    store then cannot delete it (its Redis is down), the row comes back: the delete is answered
    with an error and can be retried, and no store topic is left under no name for the next
    topic of that name to take over, messages and all."""
    server = Server(tmp_path / "data", extra_args=["--store", own_redis.url]).start()
    try:
        server.admin("POST", "/admin/topics", name="d", queues=2)
        ptoken = server.admin("POST", "/admin/producers", name="d-p", topic="d")["token"]
        client = Client(server, ptoken, None)
        receipts(client, "d-p", [{"message": f"old{i}"} for i in range(3)])
        assert call(server, "DELETE", "/admin/producers/d-p").status_code == 200

        own_redis.kill9()
        r = call(server, "DELETE", "/admin/topics/d")
        assert r.status_code == 503, r.text
        own_redis.start()  # the same files: what it acknowledged is there

        assert call(server, "GET", "/admin/topics/d").status_code == 200, "the topic is still registered"

        def consumer_made() -> str | None:
            # A first call may meet a connection the old Redis closed (503), after the consumer's
            # row was written: that one is deleted and made again.
            r = call(server, "POST", "/admin/consumers", name="d-c", topic="d")
            if r.status_code == 409:
                call(server, "DELETE", "/admin/consumers/d-c")
            return str(r.json()["result"]["token"]) if r.status_code == 200 else None

        client.ctoken = wait_until(consumer_made, 20, "the gateway to reach the restarted Redis")
        assert sorted(m["message"] for m in drain(client, "d", "d-c")) == ["old0", "old1", "old2"]

        # The delete again, the store up: gone, and a topic made again under the name is empty.
        assert call(server, "DELETE", "/admin/consumers/d-c").status_code == 200
        r = call(server, "DELETE", "/admin/topics/d")
        assert r.status_code == 200, r.text
        client.ptoken, client.ctoken = server.setup_topic("d", queues=2)
        assert drain(client, "d", "d-c") == []
        client.close()
    finally:
        server.stop()


def test_a_consumer_whose_cleanup_fails_stays_registered_and_its_delete_can_be_retried(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """A consumer's delete removes its row first, then its side topics and offsets in the store;
    when the store cannot (its Redis is down), the consumer (paused) and its dead-letter topic
    are registered again: the delete is answered with an error and retried, rather than leaving
    a name nobody can delete and offsets the next consumer of that name would start from."""
    server = Server(tmp_path / "data", extra_args=["--store", own_redis.url]).start()
    try:
        ptoken, ctoken = server.setup_topic("e", queues=2)
        client = Client(server, ptoken, ctoken)
    except BaseException:
        server.stop()
        raise
    try:
        receipts(client, "e-p", [{"message": f"m{i}"} for i in range(4)])
        assert len(drain(client, "e", "e-c")) == 4  # its offsets are at the end

        own_redis.kill9()
        r = call(server, "DELETE", "/admin/consumers/e-c")
        assert r.status_code == 503, r.text
        own_redis.start()

        listed = {c["name"]: c for c in server.admin("GET", "/admin/consumers")["consumers"]}
        assert listed["e-c"]["paused"] is True, "registered again, paused until the delete is retried"
        assert call(server, "GET", "/admin/topics/%25DLQ%25e-c").status_code == 200
        wait_until(
            lambda: call(server, "DELETE", "/admin/consumers/e-c").status_code == 200,
            20,
            "the delete to succeed once the store is back",
        )
        assert call(server, "GET", "/admin/consumers/e-c/progress").status_code == 404
        assert call(server, "GET", "/admin/topics/%25DLQ%25e-c").status_code == 404

        def registered() -> str | None:
            # A call may still meet a connection the old Redis closed (503): a registration
            # that fails is undone, so it is simply made again.
            r = call(
                server, "POST", "/admin/consumers", name="e-c", topic="e", start="earliest", lockTimeoutS=1
            )
            assert r.status_code in (200, 503), r.text
            return str(r.json()["result"]["token"]) if r.status_code == 200 else None

        # Made again under the name, from the earliest: its old offsets went with the delete.
        client.ctoken = wait_until(registered, 20, "the consumer to be registered again")
        got: set[str] = set()

        def everything_again() -> bool:
            r = client.pull("e", "e-c", max=100, wait=0)
            assert r.status_code in (200, 503), r.text  # 503: the same (a lease so cut short ends in 1 s)
            if r.status_code == 200 and r.json()["result"]["status"] == "FOUND":
                got.update(m["message"] for m in r.json()["result"]["msgList"])
                assert client.call("/mq/ack", requestId=r.json()["result"]["requestId"]).status_code in (
                    200,
                    503,
                )
            return got == {f"m{i}" for i in range(4)}

        wait_until(everything_again, 20, "every message to be delivered again")
    finally:
        client.close()
        server.stop()
