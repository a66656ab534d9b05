"""Push delivery through a real gateway to a real HTTP receiver (issue 31): every message POSTed
and deleted on a 2xx, signed the Standard Webhooks way; failures retried with backoff and
Retry-After, timeouts too; dead-lettered after maxAttempts; ordering by key; pause; the
endpoint's address checked (no SSRF) and every push setting checked at registration; nothing
lost across kill -9 of the gateway."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.conftest import Server, wait_until

pytestmark = pytest.mark.slow
ALLOW_PRIVATE = {"MQGATE_PUSH_ALLOW_PRIVATE_ENDPOINTS": "true"}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records each POST and answers with `answer(n)` for the
    n-th request: (status, extra headers, seconds to wait before answering)."""

    answer: Callable[[int, Received], tuple[int, dict[str, str], float]] = lambda n, r: (204, {}, 0.0)
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                got = Received(
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                    time.monotonic(),
                )
                with outer.lock:
                    outer.requests.append(got)
                    n = len(outer.requests)
                status, headers, wait = outer.answer(n, got)
                if wait:
                    time.sleep(wait)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook?x=1"

    def bodies(self) -> list[str]:
        with self.lock:
            return [r.body.decode() for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("push") / "data", env=ALLOW_PRIVATE).start()
    yield server
    server.stop()


def register(server: Any, name: str, topic: str, **push: Any) -> dict[str, Any]:
    server.admin("POST", "/admin/topics", name=topic, queues=push.pop("queues", 2))
    result: dict[str, Any] = server.admin(
        "POST", "/admin/consumers", name=name, topic=topic, mode="push", start="earliest", **push
    )
    return result


def admin(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.admin_token}"}


@dataclass
class Producer:
    server: Any  # a Server or a ConsoleServer
    token: str

    def produce(self, producer: str, message: str, **fields: Any) -> httpx.Response:
        return httpx.post(
            self.server.url + "/mq/produce",
            json={"producer": producer, "message": message, **fields},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )


def producer(server: Any, topic: str) -> Producer:
    return Producer(server, server.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"])


def verify(secret: str, r: Received) -> bool:
    """Checked by the Standard Webhooks library itself, as a receiver would."""
    try:
        Webhook(secret).verify(r.body, r.headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


def status(server: Server, name: str) -> dict[str, Any]:
    r = httpx.get(server.url + f"/admin/consumers/{name}/push", headers=admin(server), timeout=30)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def test_each_message_is_posted_signed_and_deleted(gateway: Server, receiver: Receiver) -> None:
    out = register(gateway, "hook-a", "push-a", endpoint=receiver.url, headers={"X-Team": "billing"})
    secret = out["signingSecret"]
    assert secret.startswith("whsec_") and out["mode"] == "push"
    client = producer(gateway, "push-a")
    for i in range(20):
        r = client.produce("push-a-p", f"m{i}", keys=[f"k{i}"], properties={"color": "red"})
        assert r.status_code == 200, r.text
    wait_until(lambda: len(receiver.requests) >= 20, 30, "20 deliveries")
    assert sorted(receiver.bodies()) == sorted(f"m{i}" for i in range(20))
    first = receiver.requests[0]
    assert first.path == "/hook?x=1"
    assert first.headers["x-team"] == "billing" and first.headers["mq-property-color"] == "red"
    assert first.headers["mq-topic"] == "push-a" and first.headers["mq-attempt"] == "1"
    assert first.headers["content-type"].startswith("text/plain")
    assert all(verify(secret, r) for r in receiver.requests)
    assert {r.headers["webhook-id"] for r in receiver.requests} == {
        r.headers["mq-message-id"] for r in receiver.requests
    }
    # Deleted on the 2xx: nothing is left, nothing comes twice.
    wait_until(lambda: status(gateway, "hook-a")["state"] == "ok", 10, "the status")
    progress = gateway.admin("GET", "/admin/consumers/hook-a/progress")
    assert progress["lag"] == 0, progress
    assert len(receiver.requests) == 20
    shown = status(gateway, "hook-a")
    assert shown["endpoint"] == receiver.url and shown["headers"] == ["X-Team"]
    assert len(shown["attempts"]) == 20 and {a["outcome"] for a in shown["attempts"]} == {"ok"}

    # A rotation: the new secret signs, and the old one still does during the overlap.
    rotated = httpx.post(
        gateway.url + "/admin/consumers/hook-a/push/rotate-secret",
        json={},
        headers=admin(gateway),
        timeout=30,
    )
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["result"]["signingSecret"]
    assert new != secret and rotated.json()["result"]["previousSecretUntil"] > time.time() * 1000
    client.produce("push-a-p", "after rotation")
    wait_until(lambda: "after rotation" in receiver.bodies(), 30, "a delivery after the rotation")
    last = next(r for r in receiver.requests if r.body == b"after rotation")
    assert verify(new, last) and verify(secret, last)


def test_the_envelope_carries_the_message_s_fields(gateway: Server, receiver: Receiver) -> None:
    register(gateway, "hook-env", "push-env", endpoint=receiver.url, envelope=True)
    producer(gateway, "push-env").produce(
        "push-env-p", '{"total": 20}', keys=["o-1"], tags=["t"], properties={"p": "1"}
    )
    wait_until(lambda: receiver.requests, 30, "a delivery")
    r = receiver.requests[0]
    assert r.headers["content-type"] == "application/json"
    envelope = json.loads(r.body)
    assert envelope["body"] == '{"total": 20}' and envelope["keys"] == ["o-1"] and envelope["tags"] == ["t"]
    assert (
        envelope["properties"] == {"p": "1"} and envelope["topic"] == "push-env" and envelope["attempt"] == 1
    )


def test_failures_are_retried_with_backoff_and_retry_after(gateway: Server) -> None:
    """The issue's receiver: fails the first two attempts, times out once, answers 429 with
    Retry-After, then takes the message: five attempts, exactly."""

    def answer(n: int, r: Received) -> tuple[int, dict[str, str], float]:
        if n in (1, 2):
            return 500, {}, 0.0
        if n == 3:
            return 200, {}, 1.5  # beyond the attempt's 0.5 s timeout: a failure too
        if n == 4:
            return 429, {"Retry-After": "2"}, 0.0
        return 200, {}, 0.0

    receiver = Receiver(answer)
    try:
        register(
            gateway,
            "hook-r",
            "push-r",
            endpoint=receiver.url,
            timeoutS=0.5,
            backoffInitialMs=200,
            backoffMaxMs=5000,
        )
        producer(gateway, "push-r").produce("push-r-p", "retry me")
        wait_until(lambda: len(receiver.requests) >= 5, 60, "five attempts")
        wait_until(
            lambda: gateway.admin("GET", "/admin/consumers/hook-r/progress")["lag"] == 0, 20, "the delete"
        )
        times = [r.at for r in receiver.requests]
        assert [r.headers["mq-attempt"] for r in receiver.requests] == ["1", "2", "3", "4", "5"]
        assert times[1] - times[0] >= 0.1  # the first backoff: 200 ms, half of it at least (jitter)
        assert times[2] - times[1] >= 0.2  # the second: 400 ms, half of it at least
        assert times[4] - times[3] >= 1.9  # Retry-After: 2 s
        outcomes = [a["outcome"] for a in reversed(status(gateway, "hook-r")["attempts"])]
        assert outcomes == ["http_500", "http_500", "timeout", "http_429", "ok"], outcomes
        metrics = httpx.get(gateway.url + "/metrics", timeout=30).text
        assert 'mqgate_push_attempts_total{consumer="hook-r",outcome="timeout"} 1.0' in metrics
    finally:
        receiver.close()


def test_a_message_that_always_fails_is_dead_lettered(gateway: Server) -> None:
    failing = threading.Event()
    failing.set()
    receiver = Receiver(lambda n, r: (503 if failing.is_set() else 204, {}, 0.0))
    try:
        register(
            gateway,
            "hook-d",
            "push-d",
            endpoint=receiver.url,
            maxAttempts=3,
            backoffInitialMs=50,
            backoffMaxMs=100,
        )
        producer(gateway, "push-d").produce("push-d-p", "poison")
        wait_until(
            lambda: gateway.admin("GET", "/admin/consumers/hook-d/progress")["deadLettered"] == 1,
            30,
            "the dead letter",
        )
        assert len(receiver.requests) == 3  # its 3 attempts, no more
        dead = gateway.admin("GET", "/admin/consumers/hook-d/dead-letters")
        assert dead["max"] - dead["min"] == 1
        assert gateway.admin("GET", "/admin/consumers/hook-d/progress")["lag"] == 0
        # Redriven once the endpoint is well again: pushed again, and taken.
        failing.clear()
        redriven = gateway.admin("POST", "/admin/consumers/hook-d/dead-letters/redrive", all=True)
        assert len(redriven["redriven"]) == 1, redriven
        wait_until(lambda: len(receiver.requests) == 4, 30, "the redriven delivery")
        assert receiver.bodies()[-1] == "poison"
        wait_until(lambda: status(gateway, "hook-d")["state"] == "ok", 10, "the good attempt")
    finally:
        receiver.close()


def test_ordering_by_key_delivers_a_key_s_messages_one_after_another_in_order(gateway: Server) -> None:
    receiver = Receiver(lambda n, r: (200, {}, 0.02))
    try:
        register(gateway, "hook-o", "push-o", endpoint=receiver.url, ordering="key", maxInFlight=20, queues=4)
        client = producer(gateway, "push-o")
        for i in range(15):
            for key in ("a", "b", "c"):
                client.produce("push-o-p", f"{key}-{i}", orderKey=key)
        wait_until(lambda: len(receiver.requests) >= 45, 60, "45 deliveries")
        for key in ("a", "b", "c"):
            mine = [r for r in receiver.requests if r.body.decode().startswith(key)]
            assert [r.body.decode() for r in mine] == [f"{key}-{i}" for i in range(15)]
            # One at a time: each sent after the one before was answered.
            assert all(later.at >= earlier.at + 0.015 for earlier, later in itertools.pairwise(mine))
    finally:
        receiver.close()


def test_a_paused_push_consumer_gets_nothing_until_resumed(gateway: Server, receiver: Receiver) -> None:
    register(gateway, "hook-p", "push-p", endpoint=receiver.url)
    gateway.admin("POST", "/admin/consumers/hook-p/pause")
    client = producer(gateway, "push-p")
    client.produce("push-p-p", "held")
    # The loop looks again every second: three of its looks pass with nothing sent.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert receiver.requests == []
        time.sleep(0.1)
    gateway.admin("POST", "/admin/consumers/hook-p/resume")
    wait_until(lambda: receiver.bodies() == ["held"], 30, "the delivery after resume")


def test_push_settings_are_checked(gateway: Server) -> None:
    gateway.admin("POST", "/admin/topics", name="push-bad", queues=1)

    def refused(**body: Any) -> str:
        r = httpx.post(gateway.url + "/admin/consumers", json={"name": "bad", "topic": "push-bad", **body},
                       headers=admin(gateway), timeout=30)  # fmt: skip
        assert r.status_code == 400, r.text
        return str(r.json()["result"]["field"])

    assert refused(mode="push") == "endpoint"
    assert refused(mode="cluster", endpoint="http://example.com/") == "endpoint"
    assert refused(mode="message", maxInFlight=3) == "maxInFlight"
    assert refused(mode="push", endpoint="ftp://example.com/") == "endpoint"
    assert refused(mode="push", endpoint="http://user:pw@example.com/") == "endpoint"
    assert refused(mode="push", endpoint="http://127.0.0.1:1/\r\nX: y") == "endpoint"
    assert refused(mode="push", endpoint="http://127.0.0.1:1/", headers={"Host": "x"}) == "headers"
    assert refused(mode="push", endpoint="http://127.0.0.1:1/", headers={"X-A": "a\r\nb"}) == "headers"
    assert refused(mode="push", endpoint="http://127.0.0.1:1/", maxInFlight=0) == "maxInFlight"
    assert (
        refused(mode="push", endpoint="http://127.0.0.1:1/", backoffInitialMs=500, backoffMaxMs=100)
        == "backoffMaxMs"
    )


def test_private_endpoints_are_refused_unless_allowed(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        server.admin("POST", "/admin/topics", name="ssrf", queues=1)
        for url in (
            "http://127.0.0.1:9/",
            "http://localhost:9/",
            "http://10.1.2.3/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]:9/",
            "http://[::ffff:127.0.0.1]:9/",
            "http://0.0.0.0:9/",
        ):
            body = {"name": "s", "topic": "ssrf", "mode": "push", "endpoint": url}
            r = httpx.post(server.url + "/admin/consumers", json=body, headers=admin(server), timeout=30)
            assert r.status_code == 400 and r.json()["result"]["field"] == "endpoint", (url, r.text)
            assert "push_allow_private_endpoints" in r.json()["message"], r.text
    finally:
        server.stop()


def test_nothing_is_lost_across_kill_9(tmp_path: Path) -> None:
    """The endpoint holds its first answers for longer than the timeout while the gateway is
    killed: every message is delivered after the restart (at least once)."""
    hold = threading.Event()

    def answer(n: int, r: Received) -> tuple[int, dict[str, str], float]:
        if not hold.is_set():
            return 204, {}, 0.0
        return 204, {}, 3.0  # answers too late: the attempts in flight at the kill

    receiver = Receiver(answer)
    server = Server(tmp_path / "data", env=ALLOW_PRIVATE).start()
    try:
        register(server, "hook-k", "push-k", endpoint=receiver.url, timeoutS=1.0, maxInFlight=5, queues=4)
        client = producer(server, "push-k")
        for i in range(10):
            client.produce("push-k-p", f"early-{i}")
        wait_until(lambda: len(receiver.requests) >= 10, 30, "the first deliveries")
        hold.set()
        for i in range(30):
            client.produce("push-k-p", f"late-{i}")
        wait_until(
            lambda: any(r.body.startswith(b"late") for r in receiver.requests), 30, "a late attempt in flight"
        )
        server.kill9()
        hold.clear()
        server.start()
        wanted = {f"early-{i}" for i in range(10)} | {f"late-{i}" for i in range(30)}
        wait_until(lambda: wanted <= set(receiver.bodies()), 60, "every message after the restart")
        wait_until(
            lambda: server.admin("GET", "/admin/consumers/hook-k/progress")["lag"] == 0, 30, "the deletes"
        )
    finally:
        server.stop()
        receiver.close()
