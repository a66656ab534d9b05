"""Server-Sent Events consumption through a real gateway (issue 31): batches as events with
their requestId as id, flow control until acked, resume by Last-Event-ID with nothing lost or
repeated beyond at least once, heartbeats, a clean end on shutdown, and the refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Client, Server

pytestmark = pytest.mark.slow


@dataclass
class Event:
    name: str = "message"
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    @property
    def messages(self) -> list[str]:
        return [m["message"] for m in json.loads(self.data)["result"]["msgList"]]


def events(lines: Iterator[str]) -> Iterator[Event]:
    """Events (and the comments before each, heartbeats among them) as an SSE client reads them."""
    e = Event()
    for line in lines:
        if line == "":
            if e.data or e.id or e.name != "message":
                yield e
                e = Event()
            continue
        if line.startswith(":"):
            e.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            e.name = value
        elif name == "id":
            e.id = value
        elif name == "data":
            e.data += value


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("stream") / "data").start()
    yield srv
    srv.stop()


def setup(server: Server, topic: str, **consumer: Any) -> Client:
    server.admin("POST", "/admin/topics", name=topic, queues=1)
    p = server.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    c = server.admin(
        "POST", "/admin/consumers", name=f"{topic}-c", topic=topic, start="earliest", **consumer
    )["token"]
    return Client(server, p, c)


def open_stream(client: Client, topic: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
    return client.http.stream(
        "GET",
        "/mq/stream",
        params={"topic": topic, "consumer": f"{topic}-c", **params},
        headers={"Authorization": f"Bearer {client.ctoken}", **(headers or {})},
        timeout=httpx.Timeout(30, read=30),
    )


def ack(client: Client, topic: str, request_id: str) -> None:
    r = client.call("/mq/ack", consumer=f"{topic}-c", requestId=request_id)
    assert r.status_code == 200, r.text


def test_flow_control_and_resume(server: Server) -> None:
    client = setup(server, "st-b", lockTimeoutS=30)
    for i in range(12):
        client.produce("st-b-p", f"m{i}")
    seen: list[str] = []
    with open_stream(client, "st-b", max=5, heartbeat=0.5) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        lines = r.iter_lines()
        first = next(events(lines))
        assert first.name == "messages" and first.messages == ["m0", "m1", "m2", "m3", "m4"]
        assert first.id == json.loads(first.data)["result"]["requestId"]
        seen += first.messages
        # Nothing more while the five are out: the next lines are comments only, for a while.
        waiting = 0
        for line in lines:
            assert not line.startswith(("event:", "data:")), line
            if line.startswith(": waiting for acks"):
                waiting += 1
                if waiting == 3:
                    break
        ack(client, "st-b", str(first.id))
        second = next(events(lines))
        assert second.messages == ["m5", "m6", "m7", "m8", "m9"]
        seen += second.messages
    # Gone without acking the second: reconnecting with its id acks it, and goes on after it.
    with open_stream(client, "st-b", headers={"Last-Event-ID": str(second.id)}, max=5, heartbeat=0.5) as r:
        assert r.headers["x-mq-resume-ack"] == "ok"
        third = next(events(r.iter_lines()))
        assert third.messages == ["m10", "m11"]
        seen += third.messages
    assert seen == [f"m{i}" for i in range(12)]  # nothing lost, nothing twice
    client.close()


def test_an_unacked_batch_comes_again(server: Server) -> None:
    client = setup(server, "st-c", lockTimeoutS=1)
    client.produce("st-c-p", "again")
    with open_stream(client, "st-c", heartbeat=0.5) as r:
        first = next(events(r.iter_lines()))
    with open_stream(client, "st-c", heartbeat=0.5) as r:
        repeat = next(e for e in events(r.iter_lines()) if e.name == "messages")  # after its lock ran out
    assert first.messages == repeat.messages == ["again"] and first.id != repeat.id
    client.close()


def test_refusals_come_before_the_stream(server: Server) -> None:
    client = setup(server, "st-d")
    server.admin("POST", "/admin/consumers", name="st-d-b", topic="st-d", mode="broadcast")
    server.admin("POST", "/admin/consumers", name="st-d-m", topic="st-d", mode="message")
    tokens = {
        name: server.admin("POST", f"/admin/consumers/{name}/token")["token"] for name in ("st-d-b", "st-d-m")
    }
    for name, field_name in (("st-d-b", "clientId"), ("st-d-m", "consumer")):
        r = httpx.get(server.url + "/mq/stream", params={"topic": "st-d", "consumer": name},
                      headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=10)  # fmt: skip
        assert r.status_code == 400 and r.json()["result"]["field"] == field_name, r.text
    headers = {"Authorization": f"Bearer {client.ctoken}", "Last-Event-ID": "nonsense"}
    r = httpx.get(
        server.url + "/mq/stream", params={"topic": "st-d", "consumer": "st-d-c"}, headers=headers, timeout=10
    )
    assert r.status_code == 400 and r.json()["result"]["field"] == "Last-Event-ID", r.text
    r = httpx.get(server.url + "/mq/stream", params={"topic": "st-d", "consumer": "st-d-c"}, timeout=10)
    assert r.status_code == 401
    client.close()


def test_a_broadcast_client_streams_and_the_stream_ends_on_shutdown(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        srv.admin("POST", "/admin/topics", name="st-e", queues=2)
        p = srv.admin("POST", "/admin/producers", name="st-e-p", topic="st-e")["token"]
        c = srv.admin(
            "POST", "/admin/consumers", name="st-e-c", topic="st-e", mode="broadcast", start="earliest"
        )
        client = Client(srv, p, c["token"])
        client.produce("st-e-p", "to all")
        with open_stream(client, "st-e", clientId="screen-1", heartbeat=0.5) as r:
            it = events(r.iter_lines())
            got = next(it)
            assert got.messages == ["to all"]
            srv.stop()  # SIGTERM: the stream ends with an end event
            rest = list(it)
        assert [e.name for e in rest][-1:] == ["end"], rest
        client.close()
    finally:
        srv.stop()
