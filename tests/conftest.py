"""Shared fixtures: real gateway processes on free loopback ports, and service checks."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
MQGATE = str(Path(sys.executable).parent / "mqgate")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_ADMIN_URL = "host=127.0.0.1 port=5432 user=postgres dbname=test"
T = TypeVar("T")


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


def run_bounded(main: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """`asyncio.run(main)`, failing after `timeout_s` with every task's stack printed (and every
    thread's, should the loop itself be stuck): a hang then says where it is, instead of a
    whole-test time-out that shows only the event loop waiting."""

    async def bounded() -> T:
        task = asyncio.ensure_future(main)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            for pending in asyncio.all_tasks():
                if pending is not asyncio.current_task():
                    pending.print_stack(file=sys.stderr)
            task.cancel()
            raise AssertionError(f"not done within {timeout_s:g}s; the tasks' stacks are on stderr")
        return task.result()

    faulthandler.dump_traceback_later(timeout_s + 30, exit=False)
    try:
        return asyncio.run(bounded())
    finally:
        faulthandler.cancel_dump_traceback_later()


def metric_samples(text: str) -> dict[str, float]:
    """Every sample of a /metrics text, by its name and labels as written."""
    found = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def require_service(host: str, port: int, name: str) -> None:
    """Fail in CI, skip loudly elsewhere, when a server the test needs is not running."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        message = f"{name} is not reachable on {host}:{port}"
        if IN_CI:
            pytest.fail(message + " (required in CI)")
        pytest.skip("SKIPPED LOUDLY: " + message)


def kill9(proc: subprocess.Popen[bytes] | None) -> None:
    assert proc is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def terminate(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it is still running after `grace_s`."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class PortInUse(Exception):
    """The gateway could not bind its port: another process took it first."""


def answered_by(pid: int, started: int) -> bool:
    """Whether `pid` is the process `started` or one of its children (a worker)."""
    if pid == started:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The command's name, in parentheses, may hold spaces: the parent's pid follows it.
    return int(stat.rsplit(")", 1)[1].split()[1]) == started


@dataclass
class Server:
    data_dir: Path
    port: int = field(default_factory=free_port)
    admin_token: str = field(default_factory=lambda: "mqa_test_" + secrets.token_hex(8))
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Run in the gateway's process before it starts (a resource limit, say).
    preexec: Callable[[], None] | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0, port_tries: int = 3) -> Server:
        """Start the gateway and wait for its own /healthz. A free port can be taken by another
        test's server between `free_port` and the bind: then the gateway exits at once (it binds
        before it starts) and gets another port, `port_tries` times in all."""
        for _ in range(port_tries - 1):
            try:
                return self._start_once(timeout_s)
            except PortInUse:
                self.port = free_port()
        return self._start_once(timeout_s)

    def _start_once(self, timeout_s: float) -> Server:
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
            preexec_fn=self.preexec,
        )
        log.close()

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = self.log_tail()
                if "address already in use" in tail[-600:].lower():
                    raise PortInUse(self.port)
                raise AssertionError(f"server exited with {self.proc.returncode}: {tail}")
            try:
                r = httpx.get(self.url + "/healthz", timeout=1)
            except httpx.HTTPError:
                return False
            # Only this gateway's answer counts (or its workers'): another server on the port
            # would otherwise be taken for it.
            return r.status_code == 200 and answered_by(r.json()["result"]["pid"], self.proc.pid)

        wait_until(healthy, timeout_s, "the gateway to answer /healthz")
        return self

    def log_tail(self) -> str:
        path = self.data_dir.parent / f"server-{self.port}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill9(self) -> None:
        kill9(self.proc)

    def stop(self) -> None:
        terminate(self.proc, grace_s=15)

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


MACHINE_REDIS = "redis://127.0.0.1:6379/0"
STORES = ("embedded", "redis")


def store_server(data_dir: Path, store: str) -> tuple[Server, Any]:
    """A gateway on the given store, and what to call after it stopped: on the machine's Redis
    each gateway gets its own key prefix, deleted afterwards."""
    if store == "embedded":
        return Server(data_dir), lambda: None
    require_service("127.0.0.1", 6379, "Redis")
    prefix = "mqtest" + secrets.token_hex(6)

    def drop_keys() -> None:
        import redis

        with redis.Redis.from_url(MACHINE_REDIS) as r:
            keys = list(r.scan_iter(match=prefix + ":*", count=1000))
            for i in range(0, len(keys), 500):
                r.delete(*keys[i : i + 500])

    srv = Server(data_dir, extra_args=["--store", MACHINE_REDIS], env={"MQGATE_REDIS_PREFIX": prefix})
    return srv, drop_keys


@pytest.fixture(autouse=True)
def _unmeasured_when_no_cover(request: pytest.FixtureRequest) -> None:
    """A test marked `no_cover` (pytest-cov: this process not measured while it runs, since
    coverage's tracing slows it) starts its processes unmeasured too, should pyproject.toml's
    [tool.coverage.run] measure subprocesses (`patch = ["subprocess"]`): an empty
    COVERAGE_PROCESS_CONFIG in their environment."""
    if request.node.get_closest_marker("no_cover"):
        request.getfixturevalue("monkeypatch").setenv("COVERAGE_PROCESS_CONFIG", "")


@pytest.fixture(params=STORES)
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    srv, cleanup = store_server(tmp_path / "data", request.param)
    srv.start()
    yield srv
    srv.stop()
    cleanup()


@pytest.fixture(scope="module", params=STORES)
def shared_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    srv, cleanup = store_server(tmp_path_factory.mktemp("shared") / "data", request.param)
    srv.start()
    yield srv
    srv.stop()
    cleanup()


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


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database per test (the machine's server), dropped afterwards."""
    require_service("127.0.0.1", 5432, "PostgreSQL")
    import psycopg

    name = f"mqgate_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@dataclass
class RedisServer:
    """A `redis-server` of the test's own on a free loopback port, durable (AOF, fsync always),
    so tests can kill it and start it again on the same files."""

    directory: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> Self:
        binary = shutil.which("redis-server")
        if binary is None:
            if IN_CI:
                pytest.fail("redis-server is not installed (required in CI)")
            pytest.skip("SKIPPED LOUDLY: redis-server is not installed")
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--protected-mode", "yes",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(64).startswith(b"+PONG")
            except OSError:
                return False

        wait_until(answers, timeout_s, "redis-server to answer PING")
        return self

    def kill9(self) -> None:
        kill9(self.proc)

    def stop(self) -> None:
        terminate(self.proc, grace_s=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


# Suites that run Spark (a JVM each, with its Python workers): one process runs them one after
# another, as a serial run does, so two or three JVMs never compete for the machine's cores.
_SPARK_DIRS = ("tests/spark/", "tests/analytics/", "tests/pipeline/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How `make test` spreads the suite over processes (pytest-xdist, `--dist loadscope`): a
    module's tests stay in one process, in their order, so its module-scoped gateway starts
    once; the Spark suites share one process. (xdist's own `loadgroup` cannot be used: it marks
    groups by rewriting node ids, which pytest 9.2 ignores, pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return "spark" if module.startswith(_SPARK_DIRS) else module

    return ByModule(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Spark suites first, then the modules with slow tests, so a parallel run does not end
    waiting on one of them. Only the order of modules changes, never the order within one."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def rank(tests: list[pytest.Item]) -> int:
        if tests[0].nodeid.startswith(_SPARK_DIRS):
            return 0
        return 1 if any(t.get_closest_marker("slow") for t in tests) else 2

    items[:] = [item for module in sorted(modules.values(), key=rank) for item in module]


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (its own browser download cannot work here)."""
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium, or `make browser`)"
        if IN_CI:
            pytest.fail(message + " (required in CI)")
        pytest.skip("SKIPPED LOUDLY: " + message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # No background connections: this machine's closed network refuses them, noisily.
        quiet = ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", *quiet])
        yield b
        b.close()
