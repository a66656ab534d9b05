"""Push delivery with several gateways on one Redis (issue 31): every gateway delivers, each
message reaches the endpoint, two gateways do not send the same message at once (the
message-by-message mode's visibility is their lease), and kill -9 of one gateway loses nothing."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisServer, Server, wait_until
from tests.push.test_push_gateway import ALLOW_PRIVATE, Received, Receiver, producer, register

pytestmark = pytest.mark.slow
ADMIN = "mqa_test_push_admin"


@pytest.fixture
def gateways(own_redis: RedisServer, pg_url: str, tmp_path: Path) -> Iterator[Callable[[], Server]]:
    started: list[Server] = []

    def start() -> Server:
        srv = Server(
            tmp_path / f"gw{len(started)}" / "data",
            admin_token=ADMIN,
            extra_args=["--store", own_redis.url, "--registry", pg_url],
            env={**ALLOW_PRIVATE, "MQGATE_REGISTRY_REFRESH_S": "0.5"},
        )
        srv.data_dir.parent.mkdir(parents=True, exist_ok=True)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


def test_two_gateways_share_the_deliveries_and_survive_a_kill(gateways: Callable[[], Server]) -> None:
    in_flight: collections.Counter[str] = collections.Counter()
    overlaps: list[str] = []
    lock = threading.Lock()

    def answer(n: int, r: Received) -> tuple[int, dict[str, str], float]:
        return 204, {}, 0.05

    receiver = Receiver(answer)
    original = receiver.answer

    def tracking(n: int, r: Received) -> tuple[int, dict[str, str], float]:
        key = r.headers["webhook-id"]
        with lock:
            in_flight[key] += 1
            if in_flight[key] > 1:
                overlaps.append(key)
        try:
            return original(n, r)
        finally:
            with lock:
                in_flight[key] -= 1

    receiver.answer = tracking
    a, b = gateways(), gateways()
    try:
        register(a, "hook-rg", "push-rg", endpoint=receiver.url, timeoutS=5.0, queues=4)
        client = producer(a, "push-rg")
        for i in range(60):
            assert client.produce("push-rg-p", f"m{i}").status_code == 200
        wait_until(lambda: len(set(receiver.bodies())) >= 30, 60, "half the deliveries")
        a.kill9()  # b goes on; a's attempts in flight come back after their visibility
        send = producer_for(b, "push-rg")
        for i in range(60, 80):
            assert send(f"m{i}") == 200
        wanted = {f"m{i}" for i in range(80)}
        wait_until(lambda: wanted <= set(receiver.bodies()), 60, "every message")
        assert overlaps == [], overlaps  # never the same message at the same time
        progress = b.admin("GET", "/admin/consumers/hook-rg/progress")
        wait_until(lambda: b.admin("GET", "/admin/consumers/hook-rg/progress")["lag"] == 0, 30, "the deletes")
        assert progress["mode"] == "push"
    finally:
        receiver.close()


def producer_for(server: Server, topic: str) -> Callable[[str], int]:
    """Produce through `server` with a new token of the topic's producer."""
    token = server.admin("POST", f"/admin/producers/{topic}-p/token")["token"]
    headers = {"Authorization": f"Bearer {token}"}

    def send(message: str) -> int:
        body = {"producer": f"{topic}-p", "message": message}
        return httpx.post(server.url + "/mq/produce", json=body, headers=headers, timeout=30).status_code

    return send
