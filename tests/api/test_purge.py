"""Purge through the admin API (its plan, the confirmation, every consumer of a topic queue or
one consumer's backlog) and the dead-letter redrive's filters by source and queue, copy and
pace: real gateways on both stores (the embedded one and the machine's Redis)."""

from __future__ import annotations

import time
import uuid
import zlib
from typing import Any

import httpx
import pytest

from tests.conftest import Server, wait_until

# Starts gateways module by module: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def call(srv: Server, method: str, path: str, **body: Any) -> httpx.Response:
    return httpx.request(
        method,
        srv.url + path,
        json=body if method != "GET" else None,
        params=body if method == "GET" else None,
        headers={"Authorization": f"Bearer {srv.admin_token}"},
        timeout=30,
    )


def keys_for_two_queues() -> tuple[str, str]:
    """Two order keys that land on different queues of a 2-queue topic."""
    first = "k0"
    other = next(f"k{i}" for i in range(1, 50) if zlib.crc32(f"k{i}".encode()) % 2 != zlib.crc32(b"k0") % 2)
    return first, other


def produce(srv: Server, token: str, producer: str, **fields: Any) -> dict[str, Any]:
    r = httpx.post(srv.url + "/mq/produce", json={"producer": producer, **fields},
                   headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def lags(srv: Server, consumer: str) -> dict[tuple[str, int], int]:
    progress = srv.admin("GET", f"/admin/consumers/{consumer}/progress")
    return {(q["source"], q["queue"]): q["lag"] for q in progress["queues"]}


def test_purge_plans_confirms_and_moves_every_consumer_of_a_queue_or_one_consumer(
    shared_server: Server,
) -> None:
    srv = shared_server
    topic = "pg" + uuid.uuid4().hex[:6]
    srv.admin("POST", "/admin/topics", name=topic, queues=2)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    for c in ("a", "b"):
        srv.admin("POST", "/admin/consumers", name=f"{topic}-{c}", topic=topic, start="earliest")
    k_one, k_two = keys_for_two_queues()
    queue = produce(srv, ptoken, f"{topic}-p", message="1", orderKey=k_one)["queue"]
    produce(srv, ptoken, f"{topic}-p", message="2", orderKey=k_one)
    other = produce(srv, ptoken, f"{topic}-p", message="3", orderKey=k_two)["queue"]
    assert queue != other

    plan = srv.admin("GET", f"/admin/topics/{topic}/purge?queue={queue}")
    assert plan["purged"] is False and plan["skipped"] == 4 and plan["movesCount"] == 2
    assert plan["consumers"] == [f"{topic}-a", f"{topic}-b"]
    assert {(m["consumer"], m["queue"], m["committed"], m["end"], m["skipped"]) for m in plan["moves"]} == {
        (f"{topic}-a", queue, 0, 2, 2),
        (f"{topic}-b", queue, 0, 2, 2),
    }
    assert lags(srv, f"{topic}-a")[(topic, queue)] == 2  # a plan moves nothing

    wrong = call(srv, "POST", f"/admin/topics/{topic}/purge", queue=queue, confirm=f"{topic}-a")
    assert wrong.status_code == 400 and wrong.json()["result"]["field"] == "confirm"
    missing = call(srv, "POST", f"/admin/topics/{topic}/purge", queue=queue)
    assert missing.status_code == 400 and missing.json()["result"]["field"] == "confirm"
    outside = call(srv, "GET", f"/admin/topics/{topic}/purge", queue=2)
    assert outside.status_code == 400 and outside.json()["result"]["field"] == "queue"
    assert call(srv, "GET", "/admin/topics/no-such-topic/purge").status_code == 404

    done = srv.admin("POST", f"/admin/topics/{topic}/purge", queue=queue, confirm=topic)
    assert done["purged"] is True and done["skipped"] == 4
    for c in ("a", "b"):
        assert lags(srv, f"{topic}-{c}")[(topic, queue)] == 0
        assert lags(srv, f"{topic}-{c}")[(topic, other)] == 1
    kept = srv.admin("GET", f"/mq/browse?topic={topic}&queue={queue}&offset=0")["msgList"]
    assert [m["message"] for m in kept] == ["1", "2"]  # still in the log until retention

    one = srv.admin("POST", f"/admin/consumers/{topic}-a/purge", confirm=f"{topic}-a")
    assert one["skipped"] == 1 and one["consumers"] == [f"{topic}-a"]
    assert sum(lags(srv, f"{topic}-a").values()) == 0 and lags(srv, f"{topic}-b")[(topic, other)] == 1

    audit = httpx.get(srv.url + "/admin/alerts", headers={"Authorization": f"Bearer {srv.admin_token}"})
    assert audit.status_code == 200  # the gateway still answers after purges


def dead_letters(srv: Server, topic: str) -> tuple[int, int]:
    """3 expired messages dead-lettered: 2 read from one queue, 1 from the other."""
    srv.admin("POST", "/admin/topics", name=topic, queues=2)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic, start="earliest")["token"]
    k_one, k_two = keys_for_two_queues()
    queues = [produce(srv, ptoken, f"{topic}-p", message=f"late {i}", ttlMs=1, orderKey=k)["queue"]
              for i, k in enumerate([k_one, k_one, k_two])]  # fmt: skip
    time.sleep(0.01)  # the 1 ms validity passes: a deadline in time, not a wait for a process

    def dead() -> bool:
        httpx.get(srv.url + "/mq/message", params={"topic": topic, "consumer": f"{topic}-c"},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
        return bool(srv.admin("GET", f"/admin/consumers/{topic}-c/dead-letters")["max"] >= 3)

    wait_until(dead, 15, "3 dead letters")
    return queues[0], queues[2]


def test_redrive_filters_by_source_and_queue_copies_and_paces(shared_server: Server) -> None:
    srv = shared_server
    topic = "rd" + uuid.uuid4().hex[:6]
    two, one = dead_letters(srv, topic)
    path = f"/admin/consumers/{topic}-c/dead-letters/redrive"
    none = srv.admin("POST", path, source=f"%RETRY%{topic}-c")
    assert none["redriven"] == []
    copied = srv.admin("POST", path, source=topic, queue=two, copy=True)
    assert copied["copied"] is True and len(copied["redriven"]) == 2 and copied["position"] == 0
    again = srv.admin("POST", path, queue=two, copy=True)
    assert len(again["redriven"]) == 2  # a copy records nothing: they can be copied again
    paced = srv.admin("POST", path, queue=one, messagesPerSecond=0.05)
    assert len(paced["redriven"]) == 1 and paced.get("left", 0) == 0
    moved = srv.admin("POST", path, all=True, messagesPerSecond=0.05)
    assert len(moved["redriven"]) == 1 and moved["left"] == 1  # one per call at this pace
    bad = call(srv, "POST", path, all=True, messagesPerSecond=0)
    assert bad.status_code == 400 and bad.json()["result"]["field"] == "messagesPerSecond"
    inbox = lags(srv, f"{topic}-c")[(f"%INBOX%{topic}-c", 0)]
    assert inbox == 6


def test_a_paced_copy_goes_on_where_it_left_off(shared_server: Server) -> None:
    """A copy records nothing, so its `next` must name the first dead letter it left: each
    call with `start=next` copies the following ones (it answered the scan's end, and the
    next call copied nothing)."""
    srv = shared_server
    topic = "rc" + uuid.uuid4().hex[:6]
    dead_letters(srv, topic)
    path = f"/admin/consumers/{topic}-c/dead-letters/redrive"
    first = srv.admin("POST", path, all=True, copy=True, messagesPerSecond=0.05)
    copied = [c["dlqOffset"] for c in first["redriven"]]
    assert len(copied) == 1 and first["left"] == 2 and first["next"] == copied[0] + 1
    second = srv.admin("POST", path, all=True, copy=True, messagesPerSecond=0.05, start=first["next"])
    third = srv.admin("POST", path, all=True, copy=True, messagesPerSecond=0.05, start=second["next"])
    copied += [c["dlqOffset"] for r in (second, third) for c in r["redriven"]]
    assert copied == sorted(set(copied)) and len(copied) == 3 and third.get("left", 0) == 0


def test_purging_a_broadcast_consumer_after_its_topic_grew(shared_server: Server) -> None:
    """A broadcast client's table from before the topic grew is grown first: every queue is
    purged, none fails half-way (it was a 500 with the first queues already moved)."""
    srv = shared_server
    topic = "pb" + uuid.uuid4().hex[:6]
    srv.admin("POST", "/admin/topics", name=topic, queues=2)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{topic}-b", topic=topic, mode="broadcast",
                       start="earliest")["token"]  # fmt: skip
    for i in range(4):
        produce(srv, ptoken, f"{topic}-p", message=f"m{i}")
    query = {"topic": topic, "consumer": f"{topic}-b", "clientId": "c1"}
    pulled = httpx.get(
        srv.url + "/mq/message", params=query, headers={"Authorization": f"Bearer {ctoken}"}, timeout=30
    )
    assert pulled.status_code == 200 and pulled.json()["result"]["status"] == "FOUND", pulled.text
    assert call(srv, "PATCH", f"/admin/topics/{topic}", queues=4).status_code == 200
    for i in range(8):
        produce(srv, ptoken, f"{topic}-p", message=f"n{i}", orderKey=f"k{i}")
    r = call(srv, "POST", f"/admin/consumers/{topic}-b/purge", confirm=f"{topic}-b")
    assert r.status_code == 200, r.text
    assert all(lag == 0 for lag in lags(srv, f"{topic}-b").values())
    r = call(srv, "POST", f"/admin/topics/{topic}/purge", queue=3, confirm=topic)
    assert r.status_code == 200, r.text
