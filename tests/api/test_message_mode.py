"""Message-level consumption over HTTP (issue 30, `mode=message`) against real gateways on both
stores: receive with receipt handles, delete and change visibility by them, redelivery with
the count raised, dead letters after the attempts, a slow message holding back no other,
offsets and lag as for any consumer, and kill -9 losing no deleted state and redelivering what
was in flight."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import STORES, Server, metric_samples, store_server, wait_until

pytestmark = pytest.mark.slow


def call(srv: Server, token: str, path: str, **body: Any) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def setup(srv: Server, queues: int = 2, **consumer: Any) -> tuple[str, str, str]:
    topic = "mm" + uuid.uuid4().hex[:8]
    srv.admin("POST", "/admin/topics", name=topic, queues=queues)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic, mode="message",
                       start="earliest", **consumer)["token"]  # fmt: skip
    return topic, ptoken, ctoken


def produce(srv: Server, topic: str, token: str, n: int, **fields: Any) -> None:
    msgs = [{"message": f"m{i}", **fields} for i in range(n)]
    r = call(srv, token, "/mq/produce/batch", producer=f"{topic}-p", messages=msgs)
    assert r.status_code == 200, r.text


def receive(srv: Server, topic: str, token: str, **args: Any) -> list[dict[str, Any]]:
    r = call(srv, token, "/mq/receive", consumer=f"{topic}-c", **args)
    assert r.status_code == 200, r.text
    got: list[dict[str, Any]] = r.json()["result"]["messages"]
    return got


def delete(srv: Server, topic: str, token: str, *handles: str) -> list[str]:
    r = call(srv, token, "/mq/delete", consumer=f"{topic}-c", receiptHandles=list(handles))
    assert r.status_code == 200, r.text
    outcomes: list[str] = r.json()["result"]["outcomes"]
    return outcomes


def lag(srv: Server, topic: str) -> int:
    return int(srv.admin("GET", f"/admin/consumers/{topic}-c/progress")["lag"])


def test_receive_delete_and_visibility_by_receipt(shared_server: Server) -> None:
    srv = shared_server
    topic, ptoken, ctoken = setup(srv)
    produce(srv, topic, ptoken, 6)
    first = receive(srv, topic, ctoken, max=4, visibility=60)
    assert len(first) == 4 and all(m["receiveCount"] == 1 for m in first)
    assert {m["message"] for m in first} <= {f"m{i}" for i in range(6)}
    rest = receive(srv, topic, ctoken, max=10, visibility=60)
    assert len(rest) == 2  # the first four are hidden
    assert receive(srv, topic, ctoken, max=10) == []
    assert delete(srv, topic, ctoken, *(m["receiptHandle"] for m in first)) == ["deleted"] * 4
    assert delete(srv, topic, ctoken, first[0]["receiptHandle"]) == ["already_deleted"]
    assert lag(srv, topic) == 2  # in flight still counts: not deleted yet
    # Shown again at once: received again with its count raised; the old receipt is stale.
    m = rest[0]
    r = call(
        srv, ctoken, "/mq/visibility", consumer=f"{topic}-c", receiptHandle=m["receiptHandle"], seconds=0
    )
    assert r.status_code == 200 and r.json()["result"]["outcome"] == "changed", r.text
    (again,) = receive(srv, topic, ctoken, max=10, visibility=60)
    assert (again["messageId"], again["receiveCount"]) == (m["messageId"], 2)
    assert again["firstReceiveTime"] == m["firstReceiveTime"]
    assert delete(srv, topic, ctoken, m["receiptHandle"]) == ["stale_receipt"]
    assert delete(srv, topic, ctoken, again["receiptHandle"], rest[1]["receiptHandle"]) == ["deleted"] * 2
    assert lag(srv, topic) == 0


def test_refusals_name_their_field(shared_server: Server) -> None:
    srv = shared_server
    topic, ptoken, ctoken = setup(srv)
    produce(srv, topic, ptoken, 1)
    pulled = httpx.get(srv.url + "/mq/message", params={"topic": topic, "consumer": f"{topic}-c"},
                       headers={"Authorization": f"Bearer {ctoken}"}, timeout=30)  # fmt: skip
    assert pulled.status_code == 400 and pulled.json()["result"]["field"] == "consumer"  # receive, not pull
    bad = call(srv, ctoken, "/mq/delete", consumer=f"{topic}-c", receiptHandles=["not-a-receipt"])
    assert bad.status_code == 400 and bad.json()["result"]["field"] == "receiptHandle"
    (m,) = receive(srv, topic, ctoken, max=1)
    forged = m["receiptHandle"][:-2] + ("AA" if not m["receiptHandle"].endswith("AA") else "BB")
    assert call(srv, ctoken, "/mq/delete", consumer=f"{topic}-c", receiptHandles=[forged]).status_code == 403
    too_many = call(srv, ctoken, "/mq/delete", consumer=f"{topic}-c", receiptHandles=["x"] * 101)
    assert too_many.status_code == 400 and too_many.json()["result"]["field"] == "receiptHandles"
    late = call(
        srv, ctoken, "/mq/visibility", consumer=f"{topic}-c", receiptHandle=m["receiptHandle"], seconds=1e9
    )
    assert late.status_code == 400 and late.json()["result"]["field"] == "seconds"
    other_topic, _, other_token = setup(srv)
    stolen = call(
        srv, other_token, "/mq/delete", consumer=f"{other_topic}-c", receiptHandles=[m["receiptHandle"]]
    )
    assert stolen.status_code == 403 and stolen.json()["result"]["field"] == "receiptHandle"


def test_a_slow_message_holds_back_no_other(shared_server: Server) -> None:
    srv = shared_server
    topic, ptoken, ctoken = setup(srv, queues=1)
    produce(srv, topic, ptoken, 1)
    (slow,) = receive(srv, topic, ctoken, max=1, visibility=300)  # held by a slow worker
    produce(srv, topic, ptoken, 20)
    seen = []
    while len(seen) < 20:  # the same queue goes on past the slow one
        got = receive(srv, topic, ctoken, max=7)
        assert got, seen
        seen += got
        assert delete(srv, topic, ctoken, *(m["receiptHandle"] for m in got)) == ["deleted"] * len(got)
    assert slow["messageId"] not in {m["messageId"] for m in seen}
    assert lag(srv, topic) == 21  # the committed offset waits on the slow one...
    assert delete(srv, topic, ctoken, slow["receiptHandle"]) == ["deleted"]
    assert lag(srv, topic) == 0  # ...and moves over all of them once it is deleted


def test_out_of_receives_to_the_dead_letter_topic(shared_server: Server) -> None:
    srv = shared_server
    topic, ptoken, ctoken = setup(srv, queues=1, maxAttempts=2)
    produce(srv, topic, ptoken, 1)
    for n in (1, 2):
        (m,) = receive(srv, topic, ctoken, max=1, visibility=0)  # visible again at once
        assert m["receiveCount"] == n
    assert receive(srv, topic, ctoken, max=1, visibility=0) == []  # its third receive: a dead letter
    state = srv.admin("GET", f"/admin/consumers/{topic}-c/dead-letters")
    assert state["max"] - state["min"] == 1
    assert lag(srv, topic) == 0


def waiting_receive(
    srv: Server, topic: str, ctoken: str
) -> tuple[threading.Thread, list[list[dict[str, Any]]]]:
    """A receive (max 5, wait 20 s) in a thread, once it waits: (the thread, what it got)."""
    got: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(target=lambda: got.append(receive(srv, topic, ctoken, max=5, wait=20)))
    waiter.start()
    name = f'mqgate_waiting_pulls{{consumer="{topic}-c"}}'

    def waiting() -> bool:
        return metric_samples(httpx.get(srv.url + "/metrics", timeout=10).text).get(name, 0) >= 1

    wait_until(waiting, 20, "the receive to wait")
    return waiter, got


def test_a_long_poll_is_woken_by_a_produce(shared_server: Server) -> None:
    srv = shared_server
    topic, ptoken, ctoken = setup(srv)
    waiter, got = waiting_receive(srv, topic, ctoken)
    produce(srv, topic, ptoken, 1)
    waiter.join(25)
    assert got and len(got[0]) == 1


def test_a_long_poll_begun_before_a_pause_hands_out_nothing_produced_after_it(shared_server: Server) -> None:
    """A push consumer's loop waits in such a poll: a message produced after the pause was
    delivered to its endpoint (CI, this stop). The poll now asks again when it wakes."""
    srv = shared_server
    topic, ptoken, ctoken = setup(srv)
    waiter, got = waiting_receive(srv, topic, ctoken)
    srv.admin("POST", f"/admin/consumers/{topic}-c/pause")
    produce(srv, topic, ptoken, 1)
    waiter.join(25)
    assert got == [[]]
    srv.admin("POST", f"/admin/consumers/{topic}-c/resume")
    assert len(receive(srv, topic, ctoken, max=5)) == 1


@pytest.mark.parametrize("store", STORES)
def test_kill9_loses_no_delete_and_redelivers_what_was_in_flight(tmp_path: Path, store: str) -> None:
    srv, cleanup = store_server(tmp_path / "data", store)
    srv.start()
    try:
        topic, ptoken, ctoken = setup(srv, queues=2)
        produce(srv, topic, ptoken, 10)
        got = receive(srv, topic, ctoken, max=10, visibility=2)
        assert len(got) == 10
        deleted = got[:6]
        assert delete(srv, topic, ctoken, *(m["receiptHandle"] for m in deleted)) == ["deleted"] * 6
        srv.kill9()
        srv.start()
        assert delete(srv, topic, ctoken, deleted[0]["receiptHandle"]) == ["already_deleted"]
        back: list[dict[str, Any]] = []

        def redelivered() -> bool:
            back.extend(receive(srv, topic, ctoken, max=10, visibility=60))
            return len(back) >= 4

        wait_until(redelivered, 30, "the four in flight to come back after their visibility")
        assert sorted(m["messageId"] for m in back) == sorted(m["messageId"] for m in got[6:])
        assert all(m["receiveCount"] == 2 for m in back)
        assert delete(srv, topic, ctoken, *(m["receiptHandle"] for m in back)) == ["deleted"] * 4
        assert lag(srv, topic) == 0
    finally:
        srv.stop()
        cleanup()
