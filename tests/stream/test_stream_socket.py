"""WebSocket streams and stream tickets through a real gateway (issue 31): the same batches as
the SSE stream, acked over the socket, flow control, the refusals (an HTTP answer before the
socket opens), bad messages answered, and what a ticket opens and what it does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.conftest import Client, RedisServer, Server, wait_until
from tests.stream.test_stream_sse import events, open_stream, setup

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("socket") / "data").start()
    yield srv
    srv.stop()


def ws_url(server: Server, topic: str, **params: Any) -> str:
    query = httpx.QueryParams({"topic": topic, "consumer": f"{topic}-c", **params})
    return server.url.replace("http://", "ws://") + "/mq/stream?" + str(query)


def socket(server: Server, topic: str, token: str | None, **params: Any) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return connect(ws_url(server, topic, **params), additional_headers=headers, open_timeout=20)


def next_event(ws: ClientConnection, *kinds: str) -> dict[str, Any]:
    """The next event of one of `kinds`, the heartbeats and waits before it skipped."""
    while True:
        ev: dict[str, Any] = json.loads(ws.recv(timeout=20))
        if ev["event"] in kinds:
            return ev


def texts(ev: dict[str, Any]) -> list[str]:
    return [m["message"] for m in ev["data"]["result"]["msgList"]]


def test_batches_come_as_acked_with_flow_control(server: Server) -> None:
    client = setup(server, "ws-a", lockTimeoutS=30)
    for i in range(12):
        client.produce("ws-a-p", f"m{i}")
    seen: list[str] = []
    with socket(server, "ws-a", client.ctoken, max=5, heartbeat=0.5) as ws:
        assert json.loads(ws.recv(timeout=20)) == {"event": "open", "consumer": "ws-a-c"}
        first = next_event(ws, "messages")
        assert texts(first) == ["m0", "m1", "m2", "m3", "m4"]
        assert first["id"] == first["data"]["result"]["requestId"]
        seen += texts(first)
        # Nothing more while the five are out: waits (and heartbeats) only, for a while.
        for _ in range(3):
            ev = next_event(ws, "waiting", "messages")
            assert ev["event"] == "waiting", ev
        ws.send(json.dumps({"ack": first["id"]}))
        answers = [next_event(ws, "acked", "messages") for _ in range(2)]
        acked = next(a for a in answers if a["event"] == "acked")
        assert acked == {"event": "acked", "id": first["id"], "outcome": "ok"}
        second = next(a for a in answers if a["event"] == "messages")
        assert texts(second) == ["m5", "m6", "m7", "m8", "m9"]
        seen += texts(second)
        ws.send(json.dumps({"ack": second["id"]}))
        third = next_event(ws, "messages")
        seen += texts(third)
        ws.send(json.dumps({"ack": third["id"]}))
        assert next_event(ws, "acked")["id"] == third["id"]
        # The same ack again: answered with why it did nothing, the socket stays open.
        ws.send(json.dumps({"ack": first["id"]}))
        again = next_event(ws, "acked", "error")
        assert again["event"] == "acked" and again["outcome"] != "ok", again
    assert seen == [f"m{i}" for i in range(12)]  # nothing lost, nothing twice
    assert server.admin("GET", "/admin/consumers/ws-a-c/progress")["lag"] == 0
    client.close()


def test_refusals_before_the_socket_and_bad_messages_on_it(server: Server) -> None:
    client = setup(server, "ws-b")
    server.admin("POST", "/admin/consumers", name="ws-b-m", topic="ws-b", mode="message")
    message_token = server.admin("POST", "/admin/consumers/ws-b-m/token")["token"]
    refusals: list[tuple[dict[str, Any], str | None, int, str]] = [
        ({}, None, 401, "Authorization"),
        ({}, "not-a-token", 401, "Authorization"),
        ({"max": "0"}, client.ctoken, 400, "max"),
        ({"consumer": "ws-b-m"}, message_token, 400, "consumer"),
        ({"consumer": "ws-b-m"}, client.ctoken, 403, "Authorization"),
    ]
    for params, token, status, field_name in refusals:
        with pytest.raises(InvalidStatus) as refused:
            socket(server, "ws-b", token, **params)
        response = refused.value.response
        assert response.status_code == status, (params, response.body)
        assert json.loads(response.body)["result"]["field"] == field_name, (params, response.body)
    with pytest.raises(InvalidStatus) as refused:  # a path that takes no WebSocket
        connect(server.url.replace("http://", "ws://") + "/healthz", open_timeout=20)
    assert refused.value.response.status_code == 400

    other = setup(server, "ws-c")
    other.produce("ws-c-p", "x")
    foreign = other.http.get(
        "/mq/message",
        params={"topic": "ws-c", "consumer": "ws-c-c"},
        headers={"Authorization": f"Bearer {other.ctoken}"},
    ).json()["result"]["requestId"]
    with socket(server, "ws-b", client.ctoken, heartbeat=0.5) as ws:
        for message, field_name in (
            ("not json", "ack"),
            (json.dumps({"nack": "x"}), "ack"),
            (json.dumps({"ack": "!!"}), "ack"),
            (json.dumps({"ack": foreign}), "ack"),  # another consumer's batch
        ):
            ws.send(message)
            error = next_event(ws, "error")
            assert error["field"] == field_name and error["message"], (message, error)
        ws.send("x" * 5000)  # over the most a client's message may be
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=20)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    client.close()
    other.close()


def ticket_of(client: Client, topic: str, **fields: Any) -> str:
    r = client.http.post(
        "/mq/stream/tickets",
        json={"topic": topic, "consumer": f"{topic}-c", **fields},
        headers={"Authorization": f"Bearer {client.ctoken}"},
    )
    assert r.status_code == 200, r.text
    ticket: str = r.json()["result"]["ticket"]
    assert ticket.startswith("mqt_") and r.json()["result"]["expiresAtMs"] > 0
    return ticket


def stream_status(server: Server, topic: str, ticket: str, **params: Any) -> httpx.Response:
    """The head of a stream opened with `ticket` (the stream itself is closed at once)."""
    with httpx.stream(
        "GET",
        server.url + "/mq/stream",
        params={"topic": topic, "consumer": f"{topic}-c", "ticket": ticket, **params},
        timeout=20,
    ) as r:
        if r.status_code != 200:
            r.read()
        return r


def test_a_ticket_opens_its_stream_and_acks_and_nothing_else(server: Server) -> None:
    client = setup(server, "ws-t", lockTimeoutS=30)
    client.produce("ws-t-p", "one")
    ticket = ticket_of(client, "ws-t")
    # The stream without the token, and an ack with the ticket as the bearer.
    with httpx.stream(
        "GET", server.url + "/mq/stream", params={"topic": "ws-t", "consumer": "ws-t-c", "ticket": ticket},
        timeout=httpx.Timeout(20, read=20),
    ) as r:  # fmt: skip
        assert r.status_code == 200
        batch = next(e for e in events(r.iter_lines()) if e.name == "messages")
    assert batch.messages == ["one"]
    as_ticket = {"Authorization": f"Bearer {ticket}"}
    r = client.http.post("/mq/ack", json={"consumer": "ws-t-c", "requestId": batch.id}, headers=as_ticket)
    assert r.status_code == 200, r.text
    assert server.admin("GET", "/admin/consumers/ws-t-c/progress")["lag"] == 0
    # Over a WebSocket too.
    client.produce("ws-t-p", "two")
    with connect(ws_url(server, "ws-t", ticket=ticket), open_timeout=20) as ws:
        got = next_event(ws, "messages")
        assert texts(got) == ["two"]
    # Nothing else: no pull, no produce, no new ticket, no other consumer's stream.
    r = client.http.get("/mq/message", params={"topic": "ws-t", "consumer": "ws-t-c"}, headers=as_ticket)
    assert r.status_code == 403 and r.json()["result"]["field"] == "Authorization", r.text
    r = client.http.post("/mq/produce", json={"producer": "ws-t-p", "message": "x"}, headers=as_ticket)
    assert r.status_code == 403, r.text
    ask = {"topic": "ws-t", "consumer": "ws-t-c"}
    r = client.http.post("/mq/stream/tickets", json=ask, headers=as_ticket)
    assert r.status_code == 403, r.text
    setup(server, "ws-u").close()
    r = stream_status(server, "ws-u", ticket)
    assert r.status_code == 403, r.text
    # Forged, or of another client: refused.
    forged = ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB")
    assert stream_status(server, "ws-t", forged).status_code == 401
    assert stream_status(server, "ws-t", ticket, clientId="other").status_code == 403
    # A rotated token's tickets stop opening.
    server.admin("POST", "/admin/consumers/ws-t-c/token")
    r = stream_status(server, "ws-t", ticket)
    assert r.status_code == 401 and r.json()["result"]["field"] == "ticket", r.text
    client.close()


def test_a_ticket_expires(server: Server) -> None:
    client = setup(server, "ws-x")
    ticket = ticket_of(client, "ws-x", expiresInS=1)
    r = client.http.post(
        "/mq/stream/tickets",
        json={"topic": "ws-x", "consumer": "ws-x-c", "expiresInS": 3601},
        headers={"Authorization": f"Bearer {client.ctoken}"},
    )
    assert r.status_code == 400 and r.json()["result"]["field"] == "expiresInS", r.text
    expired = wait_until(
        lambda: (r := stream_status(server, "ws-x", ticket)).status_code == 401 and r,
        30,
        "the ticket to expire",
    )
    assert "expired" in expired.json()["message"]
    client.close()


def test_a_socket_is_closed_when_the_gateway_stops(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        client = setup(srv, "ws-s")
        client.produce("ws-s-p", "last")
        with socket(srv, "ws-s", client.ctoken, heartbeat=0.5) as ws:
            assert texts(next_event(ws, "messages")) == ["last"]
            srv.stop()  # SIGTERM
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=20)
        # Closed by the server with a going-away or restart code, not cut off.
        assert closed.value.rcvd is not None and closed.value.rcvd.code in (1001, 1012), closed.value
        client.close()
    finally:
        srv.stop()


def test_the_sse_stream_takes_a_ticket_and_resumes(server: Server) -> None:
    client = setup(server, "ws-r", lockTimeoutS=30)
    client.produce("ws-r-p", "a")
    with open_stream(client, "ws-r", heartbeat=0.5) as r:
        first = next(e for e in events(r.iter_lines()) if e.name == "messages")
    client.produce("ws-r-p", "b")
    ticket = ticket_of(client, "ws-r")
    with httpx.stream(
        "GET", server.url + "/mq/stream", params={"topic": "ws-r", "consumer": "ws-r-c", "ticket": ticket},
        headers={"Last-Event-ID": str(first.id)}, timeout=httpx.Timeout(20, read=20),
    ) as r:  # fmt: skip
        assert r.headers["x-mq-resume-ack"] == "ok"
        assert next(e for e in events(r.iter_lines()) if e.name == "messages").messages == ["b"]
    client.close()


def test_a_socket_resumes_after_its_last_batch(server: Server) -> None:
    client = setup(server, "ws-m", lockTimeoutS=60)
    for i in range(4):
        client.produce("ws-m-p", f"m{i}")
    with socket(server, "ws-m", client.ctoken, max=2, heartbeat=0.5) as ws:
        first = next_event(ws, "messages")  # gone without acking it
    assert texts(first) == ["m0", "m1"]
    with socket(server, "ws-m", client.ctoken, max=2, heartbeat=0.5, lastEventId=first["id"]) as ws:
        assert json.loads(ws.recv(timeout=20)) == {"event": "resumed", "id": first["id"], "outcome": "ok"}
        second = next_event(ws, "messages")
    assert texts(second) == ["m2", "m3"]  # nothing lost, nothing twice
    # The header and the parameter naming different batches: refused, naming the parameter.
    r = httpx.get(
        server.url + "/mq/stream",
        params={"topic": "ws-m", "consumer": "ws-m-c", "lastEventId": first["id"]},
        headers={"Authorization": f"Bearer {client.ctoken}", "Last-Event-ID": second["id"]},
        timeout=20,
    )
    assert r.status_code == 400 and r.json()["result"]["field"] == "lastEventId", r.text
    client.close()


def test_a_stream_ends_after_its_timeout(server: Server) -> None:
    client = setup(server, "ws-o")
    with socket(server, "ws-o", client.ctoken, heartbeat=0.5, timeout=1) as ws:
        assert next_event(ws, "end")["data"] == {"reason": "timeout"}
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=20)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    with open_stream(client, "ws-o", heartbeat=0.5, timeout=1) as r:
        ends = [e for e in events(r.iter_lines()) if e.name == "end"]  # the answer ends after it
    assert [json.loads(e.data) for e in ends] == [{"reason": "timeout"}]
    r = httpx.get(
        server.url + "/mq/stream",
        params={"topic": "ws-o", "consumer": "ws-o-c", "timeout": "0.5"},
        headers={"Authorization": f"Bearer {client.ctoken}"},
        timeout=20,
    )
    assert r.status_code == 400 and r.json()["result"]["field"] == "timeout", r.text
    client.close()


def test_streams_are_limited_per_consumer_and_given_back(tmp_path: Path) -> None:
    env = {"MQGATE_STREAM_MAX_PER_CONSUMER": "2", "MQGATE_STREAM_MAX_OPEN": "3"}
    srv = Server(tmp_path / "data", env=env).start()
    try:
        a, b = setup(srv, "ws-l"), setup(srv, "ws-k")

        def refused(client: Client, topic: str) -> httpx.Response:
            r = httpx.get(
                srv.url + "/mq/stream",
                params={"topic": topic, "consumer": f"{topic}-c", "heartbeat": 0.5},
                headers={"Authorization": f"Bearer {client.ctoken}"},
                timeout=20,
            )
            assert r.status_code == 429 and r.json()["result"]["field"] == "consumer", r.text
            assert r.headers["retry-after"]
            return r

        with open_stream(a, "ws-l", heartbeat=0.5) as s1, socket(srv, "ws-l", a.ctoken, heartbeat=0.5) as w1:
            assert s1.status_code == 200 and json.loads(w1.recv(timeout=20))["event"] == "open"
            assert "stream_max_per_consumer" in refused(a, "ws-l").json()["message"]  # SSE: a third
            with pytest.raises(InvalidStatus) as over:  # and a WebSocket
                socket(srv, "ws-l", a.ctoken)
            assert over.value.response.status_code == 429
            with open_stream(b, "ws-k", heartbeat=0.5) as s2:
                assert s2.status_code == 200
                assert "stream_max_open" in refused(b, "ws-k").json()["message"]  # the gateway's three

        # Closed, each gives its slot back (the gateway notices a client gone within a heartbeat).
        def opens() -> bool:
            with open_stream(a, "ws-l", heartbeat=0.5) as r1, open_stream(a, "ws-l", heartbeat=0.5) as r2:
                return r1.status_code == 200 and r2.status_code == 200

        wait_until(opens, 20, "the slots given back")
        a.close()
        b.close()
    finally:
        srv.stop()


def test_a_store_fault_ends_a_socket_with_1011_and_is_logged(tmp_path: Path, own_redis: RedisServer) -> None:
    srv = Server(tmp_path / "data", extra_args=["--store", own_redis.url]).start()
    try:
        client = setup(srv, "ws-f")
        client.produce("ws-f-p", "before")
        with socket(srv, "ws-f", client.ctoken, heartbeat=0.5, max=1) as ws:
            assert texts(next_event(ws, "messages")) == ["before"]
            ws.send(json.dumps({"ack": "x"}))  # answered: the socket lives
            assert next_event(ws, "error")["field"] == "ack"
            own_redis.kill9()  # the stream's next pull fails
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=30)
        # Not a normal end: the server says it failed, and says so in its log.
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011, closed.value
        wait_until(lambda: "ended by a fault" in srv.log_tail(), 10, "the fault in the gateway's log")
        client.close()
    finally:
        srv.stop()


def test_a_store_fault_ends_an_sse_stream_with_an_end_event_that_says_why(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    srv = Server(tmp_path / "data", extra_args=["--store", own_redis.url]).start()
    try:
        client = setup(srv, "ws-g")
        client.produce("ws-g-p", "before")
        with open_stream(client, "ws-g", heartbeat=0.5, max=1) as r:
            it = events(r.iter_lines())
            assert next(e for e in it if e.name == "messages").messages == ["before"]
            own_redis.kill9()
            end = next(e for e in it if e.name == "end")
        assert json.loads(end.data)["code"] == "unavailable", end.data
        wait_until(lambda: "ended by a fault" in srv.log_tail(), 10, "the fault in the gateway's log")
        client.close()
    finally:
        srv.stop()
