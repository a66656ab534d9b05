"""Reading a topic by offset (/mq/bounds, /mq/read) and committing a reader's own progress
(/mq/commit): what a Spark job needs, on both stores."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Client, Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def get(server: Server, path: str, token: str, **params: Any) -> httpx.Response:
    return httpx.get(
        server.url + path, params=params, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def post(server: Server, path: str, token: str, **body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_read_by_offset_returns_stored_messages_with_positions(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("t", queues=2)
    client = Client(server, ptoken, ctoken)
    msgs = [{"message": f"m{i}", "keys": [f"k{i}"], "orderKey": "a" if i % 2 else "b"} for i in range(30)]
    msgs[0]["tags"] = ["tag"]
    msgs[0]["properties"] = {"p": "v"}
    assert client.produce_batch("t-p", msgs).status_code == 200

    bounds = get(server, "/mq/bounds", server.admin_token, topic="t").json()["result"]
    assert [(q["queue"], q["min"]) for q in bounds["queues"]] == [(0, 0), (1, 0)]
    assert sum(q["max"] for q in bounds["queues"]) == 30
    seen: dict[str, dict[str, Any]] = {}
    for q in bounds["queues"]:
        offset = 0
        while offset < q["max"]:
            r = get(
                server, "/mq/read", ctoken, topic="t", consumer="t-c", queue=q["queue"], offset=offset, max=4
            )
            assert r.status_code == 200, r.text
            result = r.json()["result"]
            assert result["offset"] == offset and result["queue"] == q["queue"]
            items = result["msgList"]
            assert [m["offset"] for m in items] == list(range(offset, result["next"]))
            assert 0 < len(items) <= 4
            for m in items:
                assert m["queue"] == q["queue"] and m["broker"] == bounds["broker"]
                seen[m["message"]] = m
            offset = result["next"]
        end = get(server, "/mq/read", ctoken, topic="t", consumer="t-c", queue=q["queue"], offset=offset)
        assert end.json()["result"]["msgList"] == [] and end.json()["result"]["next"] == offset
    assert sorted(seen) == sorted(m["message"] for m in msgs)
    first = seen["m0"]
    assert first["keys"] == ["k0"] and first["tags"] == ["tag"] and first["properties"] == {"p": "v"}
    assert isinstance(first["timestamp"], int) and first["messageId"]
    # Reading takes no lock and commits nothing: the consumer still sees everything.
    assert server.admin("GET", "/admin/consumers/t-c/progress")["lag"] == 30
    client.close()


def test_read_needs_a_consumer_of_the_topic_or_the_admin_token(server: Server) -> None:
    _, ctoken = server.setup_topic("t")
    server.setup_topic("other")
    anonymous = httpx.get(server.url + "/mq/read", params={"topic": "t", "queue": 0, "offset": 0}, timeout=30)
    assert anonymous.status_code == 401
    no_name = get(server, "/mq/read", ctoken, topic="t", queue=0, offset=0)
    assert no_name.status_code == 403 and no_name.json()["result"]["field"] == "consumer"
    wrong_topic = get(server, "/mq/bounds", ctoken, topic="other", consumer="t-c")
    assert wrong_topic.status_code == 403 and wrong_topic.json()["result"]["field"] == "topic"
    forged = get(server, "/mq/read", "mqc_forged", topic="t", consumer="t-c", queue=0, offset=0)
    assert forged.status_code == 401  # no one's token: refused alike for any name
    for params, field in (
        ({"queue": 8, "offset": 0}, "queue"),
        ({"queue": 0, "offset": -1}, "offset"),
        ({"queue": 0, "offset": 0, "max": 10_001}, "max"),
        ({"queue": "x", "offset": 0}, "queue"),
    ):
        r = get(server, "/mq/read", ctoken, topic="t", consumer="t-c", **params)
        assert r.status_code == 400 and r.json()["result"]["field"] == field, r.text
    missing = get(server, "/mq/bounds", server.admin_token, topic="nope")
    assert missing.status_code == 404 and missing.json()["result"]["field"] == "topic"


def test_commit_raises_committed_offsets_idempotently_and_shows_as_progress(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("t", queues=2)
    client = Client(server, ptoken, ctoken)
    client.produce_batch("t-p", [{"message": str(i), "orderKey": str(i % 2)} for i in range(20)])
    maxes = {
        q["queue"]: q["max"]
        for q in get(server, "/mq/bounds", ctoken, topic="t", consumer="t-c").json()["result"]["queues"]
    }
    half = {str(q): m // 2 for q, m in maxes.items()}
    r = post(server, "/mq/commit", ctoken, consumer="t-c", offsets=half)
    assert r.status_code == 200, r.text
    assert {q["queue"]: q["committed"] for q in r.json()["result"]["queues"]} == {
        q: m // 2 for q, m in maxes.items()
    }
    assert server.admin("GET", "/admin/consumers/t-c/progress")["lag"] == sum(
        m - m // 2 for m in maxes.values()
    )
    # Replaying an older commit moves nothing back.
    assert post(server, "/mq/commit", ctoken, consumer="t-c", offsets={"0": 0}).json()["result"][
        "queues"
    ] == [{"queue": 0, "committed": maxes[0] // 2}]
    full = {str(q): m for q, m in maxes.items()}
    assert post(server, "/mq/commit", server.admin_token, consumer="t-c", offsets=full).status_code == 200
    assert server.admin("GET", "/admin/consumers/t-c/progress")["lag"] == 0
    # A pull now finds nothing: the committed position is the consumer's.
    assert client.pull("t", "t-c").json()["result"]["status"] != "FOUND"
    for offsets, field in (
        ({"2": 0}, "offsets.2"),
        ({"0": maxes[0] + 1}, "offsets.0"),
        ({"0": -1}, "offsets.0"),
        ({"x": 1}, "offsets.x"),
        ({}, "offsets"),
        ([1], "offsets"),
    ):
        bad = post(server, "/mq/commit", ctoken, consumer="t-c", offsets=offsets)
        assert bad.status_code == 400 and bad.json()["result"]["field"] == field, bad.text
    client.close()


def test_commit_is_refused_for_broadcast_consumers_and_others_tokens(server: Server) -> None:
    server.setup_topic("t", queues=1)
    btoken = server.admin("POST", "/admin/consumers", name="b", topic="t", mode="broadcast")["token"]
    r = post(server, "/mq/commit", btoken, consumer="b", offsets={"0": 0})
    assert r.status_code == 400 and r.json()["result"]["field"] == "consumer"
    assert post(server, "/mq/commit", btoken, consumer="t-c", offsets={"0": 0}).status_code == 403


def test_the_admin_token_may_produce_for_any_producer(server: Server) -> None:
    server.setup_topic("t", queues=1)
    r = post(server, "/mq/produce", server.admin_token, producer="t-p", message="from admin")
    assert r.status_code == 200, r.text
    batch = post(server, "/mq/produce/batch", server.admin_token, producer="t-p", messages=[{"message": "b"}])
    assert batch.status_code == 200
    assert post(server, "/mq/produce", "mqp_wrong", producer="t-p", message="x").status_code == 401
