"""Shared fixtures: real gateway processes on free loopback ports, and service checks."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
MQGATE = str(Path(sys.executable).parent / "mqgate")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.02) -> Any:
    """Poll `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def require_service(host: str, port: int, name: str) -> None:
    """Fail in CI, skip loudly elsewhere, when a server the test needs is not running."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        message = f"{name} is not reachable on {host}:{port}"
        if IN_CI:
            pytest.fail(message + " (required in CI)")
        pytest.skip("SKIPPED LOUDLY: " + message)


@dataclass
class Server:
    data_dir: Path
    port: int = field(default_factory=free_port)
    admin_token: str = field(default_factory=lambda: "mqa_test_" + secrets.token_hex(8))
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> Server:
        env = {**os.environ, "MQGATE_ADMIN_TOKEN": self.admin_token, **self.env}
        log = open(self.data_dir.parent / f"server-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                MQGATE,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                *self.extra_args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout_s, "the gateway to answer /healthz")
        return self

    def log_tail(self) -> str:
        path = self.data_dir.parent / f"server-{self.port}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    # --- admin helpers ------------------------------------------------------------------

    def admin(self, method: str, path: str, **body: Any) -> Any:
        r = httpx.request(
            method,
            self.url + path,
            json=body if method != "GET" else None,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return r.json()["result"]

    def setup_topic(
        self, topic: str, queues: int = 8, consumer_args: dict[str, Any] | None = None
    ) -> tuple[str, str]:
        """Create a topic with producer `<topic>-p` and consumer `<topic>-c`; return their tokens."""
        self.admin("POST", "/admin/topics", name=topic, queues=queues)
        ptoken = self.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
        ctoken = self.admin(
            "POST", "/admin/consumers", name=f"{topic}-c", topic=topic, **(consumer_args or {})
        )["token"]
        return ptoken, ctoken


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("shared") / "data").start()
    yield srv
    srv.stop()


class Client:
    """A thin data-path client used by the tests (the examples/ show other languages)."""

    def __init__(self, server: Server, ptoken: str | None, ctoken: str | None) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.url, timeout=40)
        self.ptoken = ptoken
        self.ctoken = ctoken

    def produce(self, producer: str, message: str, **fields: Any) -> httpx.Response:
        return self.http.post(
            "/mq/produce",
            json={"producer": producer, "message": message, **fields},
            headers={"Authorization": f"Bearer {self.ptoken}"},
        )

    def produce_batch(self, producer: str, messages: list[dict[str, Any]]) -> httpx.Response:
        return self.http.post(
            "/mq/produce/batch",
            json={"producer": producer, "messages": messages},
            headers={"Authorization": f"Bearer {self.ptoken}"},
        )

    def pull(self, topic: str, consumer: str, **params: Any) -> httpx.Response:
        return self.http.get(
            "/mq/message",
            params={"topic": topic, "consumer": consumer, **params},
            headers={"Authorization": f"Bearer {self.ctoken}"},
        )

    def call(self, path: str, **body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers={"Authorization": f"Bearer {self.ctoken}"})

    def close(self) -> None:
        self.http.close()
