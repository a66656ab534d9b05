"""The servers a benchmark starts: `mqgate serve` gateways and the HTTP baseline (baseline A),
each on a free loopback port; a standard-library HTTP client for them; filling a topic."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procs
from .common import HOST, MQGATE, MSG_BYTES, ROOT, VENV_BIN, BenchFailure, free_port, log, tail


class Http:
    """One keep-alive connection; JSON in and out, with a bearer token."""

    def __init__(self, port: int, token: str | None = None, timeout: float = 30.0) -> None:
        self.port, self.token, self.timeout = port, token, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: dict | bytes | None = None, token: str | None = None
    ) -> tuple[int, Any, bytes]:
        headers = {}
        if token or self.token:
            headers["Authorization"] = f"Bearer {token or self.token}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt == 2:
                    raise
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        return resp.status, payload, raw

    def ok(self, method: str, path: str, body: dict | bytes | None = None, token: str | None = None) -> Any:
        """Call, check the envelope ({status, message, result}), return the result."""
        status, payload, raw = self.request(method, path, body, token)
        if (
            status != 200
            or not isinstance(payload, dict)
            or payload.get("status") != 200
            or "result" not in payload
        ):
            raise BenchFailure(f"{method} {path} -> HTTP {status}: {raw[:400]!r}")
        return payload["result"]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def healthz(port: int) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        c.request("GET", "/healthz")
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_healthz(
    port: int, proc: subprocess.Popen, timeout: float, log_path: Path, poll: float = 0.005
) -> float:
    """Poll GET /healthz until 200; return time.monotonic() when it answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchFailure(f"server exited with {proc.returncode}:\n{tail(log_path)}")
        with contextlib.suppress(OSError):
            if healthz(port)[0] == 200:
                return time.monotonic()
        time.sleep(poll)
    raise BenchFailure(f"/healthz did not answer 200 within {timeout} s:\n{tail(log_path)}")


def wait_all_workers(port: int, workers: int, deadline: float) -> float:
    """Poll /healthz on new connections until `workers` distinct pids answered (a connection
    goes to whichever worker accepts it); return time.monotonic() then."""
    seen: set = set()
    while True:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            status, body = healthz(port)
            if status == 200:
                seen.add(json.loads(body).get("result", {}).get("pid"))
        if len(seen) >= workers:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise BenchFailure(f"only {len(seen)} of {workers} gateway workers answered /healthz")
        time.sleep(0.002)


@dataclass
class Gateway:
    """`mqgate serve` on a free loopback port with a random admin token. Every MQGATE_* variable
    of the calling shell is dropped from its environment, `env` adds some back."""

    data_dir: Path
    store: str = "embedded"  # or a redis:// URL
    fsync: str | None = "always"  # the embedded store's --fsync (None: the gateway's default)
    workers: int | None = None  # None: no --workers flag
    redis_prefix: str = ""  # MQGATE_REDIS_PREFIX
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: "mqa_bench_" + secrets.token_hex(12))
    proc: subprocess.Popen | None = None
    admin: Http | None = None
    all_workers_s: float = 0.0  # spawn → every worker process answered /healthz

    def __post_init__(self) -> None:
        self.log_path = self.log_path or self.data_dir.parent / f"gateway-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def cmd(self) -> list[str]:
        cmd = [
            str(MQGATE),
            "serve",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
        ]
        if self.store == "embedded":
            cmd += ["--fsync", self.fsync] if self.fsync else []
        else:
            cmd += ["--store", self.store]  # its durability is the Redis's own
        return cmd + (["--workers", str(self.workers)] if self.workers is not None else [])

    def start(self, timeout: float = 60.0) -> float:
        """Start; seconds from spawn to /healthz answering 200. With several workers, also wait
        until each of them has answered (`all_workers_s`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQGATE_")}
        env["MQGATE_ADMIN_TOKEN"] = self.token
        if self.redis_prefix:
            env["MQGATE_REDIS_PREFIX"] = self.redis_prefix
        t0 = time.monotonic()
        self.proc = procs.start(self.cmd, self.log_path, {**env, **self.env})
        t1 = wait_healthz(self.port, self.proc, timeout, self.log_path)
        self.all_workers_s = wait_all_workers(self.port, self.workers or 1, t0 + timeout) - t0
        self.admin = Http(self.port, self.token, timeout=120)
        return t1 - t0

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        """An admin API call's result (BenchFailure naming the call otherwise)."""
        assert self.admin is not None
        return self.admin.ok(method, path, body)

    def post(self, path: str, body: dict) -> Any:
        return self.api("POST", path, body)

    def progress(self, consumer: str) -> dict:
        return self.api("GET", f"/admin/consumers/{consumer}/progress")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.admin:
            self.admin.close()
        if self.proc is not None:
            procs.kill_tree(self.proc, sig, timeout=30)

    def kill9(self) -> None:
        """kill -9 the server and every process under it, by PID."""
        assert self.proc is not None
        procs.kill9(self.proc)
        if self.admin:
            self.admin.close()

    def errors_in_log(self) -> list[str]:
        return [
            ln for ln in tail(self.log_path, 2000).splitlines() if re.search(r"Traceback|ERROR|Exception", ln)
        ]


def register(
    gw: Gateway, topic: str, queues: int, producer: str, consumer: str | None = None, **consumer_fields: Any
) -> tuple[str, str]:
    """A topic, its producer and (if named) consumer: (producer token, consumer token)."""
    t = gw.post("/admin/topics", {"name": topic, "queues": queues})
    if t.get("name") != topic or t.get("queues") != queues:
        raise BenchFailure(f"POST /admin/topics answered {t}")
    p = gw.post("/admin/producers", {"name": producer, "topic": topic})
    c = (
        gw.post("/admin/consumers", {"name": consumer, "topic": topic, **consumer_fields})
        if consumer
        else {"token": "-"}
    )
    if not p.get("token") or not c.get("token"):
        raise BenchFailure(f"registration returned no token: producer {p}, consumer {c}")
    return p["token"], c["token"]


# The gateway's default registry_refresh_s: every worker has reloaded the registry by then.
REGISTRY_REFRESH_S = 5.0


def await_registry(gw: Gateway) -> None:
    """Registration went through one worker; the others learn of it on their next periodic
    refresh (or a rate-limited refresh on a miss, which concurrent first requests can lose:
    they get 404 "not registered"). Wait for the periodic one."""
    if (gw.workers or 1) > 1:
        log(f"  waiting {REGISTRY_REFRESH_S + 0.5:g} s for every worker to see the registration")
        time.sleep(REGISTRY_REFRESH_S + 0.5)


def totals(progress: dict) -> dict:
    qs = progress["queues"]
    return {
        "lag": progress["lag"],
        "max": sum(q["max"] for q in qs),
        "min": sum(q["min"] for q in qs),
        "committed": sum(q["committed"] for q in qs),
        "locked": sum(1 for q in qs if q.get("locked")),
    }


def produce_batches(
    port: int,
    token: str,
    producer: str,
    count: int,
    batch: int = 1000,
    conns: int = 4,
    messages: Any = None,
    check: Any = None,
    timeout: float = 600.0,
) -> float:
    """Produce exactly `count` messages with batch requests over `conns` connections; return
    the seconds taken. `messages(first, n)` makes a request's messages (default: n of 100
    bytes); `check(result, n)` may name what is wrong with an answer (default: n receipts)."""
    bodies: dict[int, bytes] = {}

    def body(first: int, n: int) -> bytes:
        if messages is not None:
            return json.dumps({"producer": producer, "messages": messages(first, n)}).encode()
        if n not in bodies:
            bodies[n] = json.dumps(
                {"producer": producer, "messages": [{"message": "y" * MSG_BYTES}] * n}
            ).encode()
        return bodies[n]

    def receipts(result: dict, n: int) -> str | None:
        got = len(result.get("receipts", []))
        return None if got == n else f"batch of {n} got {got} receipts"

    check = check or receipts
    nxt, lock, errors = [0], threading.Lock(), []
    deadline = time.monotonic() + timeout

    def worker() -> None:
        h = Http(port, token, timeout=120)
        try:
            while not errors and time.monotonic() < deadline:
                with lock:
                    first, n = nxt[0], min(batch, count - nxt[0])
                    nxt[0] += n
                if n == 0:
                    return
                wrong = check(h.ok("POST", "/mq/produce/batch", body(first, n)), n)
                if wrong:
                    errors.append(wrong)
        except Exception as exc:
            errors.append(str(exc))
        finally:
            h.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchFailure(f"producing failed: {errors[0]}")
    if nxt[0] < count:
        raise BenchFailure(f"producing timed out with {count - nxt[0]} messages left")
    return time.monotonic() - t0


# --- baseline A: the HTTP ceiling ----------------------------------------------------------------


def detect_server(gw: Gateway) -> dict:
    """Which HTTP server `mqgate serve` really runs, read from the live process tree."""
    pids = [gw.pid, *procs.descendants(gw.pid)]
    maps = ""
    for pid in pids:
        with contextlib.suppress(OSError):
            maps += Path(f"/proc/{pid}/maps").read_text()
    # worker processes: the children, less multiprocessing's resource tracker
    kids = 0
    for pid in pids[1:]:
        with contextlib.suppress(OSError):
            kids += b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    info: dict = {"pids": len(pids), "workers": max(1, kids)}
    info["server"] = "granian" if "_granian" in maps or "/granian/" in maps else "uvicorn"
    info["uvloop"] = "uvloop" in maps
    info["httptools"] = "httptools" in maps
    # granian runtime settings, if the serve code passes any
    src = "".join(
        t
        for p in (ROOT / "src" / "mqgate").rglob("*.py")
        if "granian" in (t := p.read_text(errors="replace")).lower()
    )
    for opt in ("runtime_threads", "runtime_mode", "blocking_threads", "loop"):
        m = re.search(rf"{opt}\s*=\s*['\"]?([\w.]+)", src)
        if m:
            info[opt] = m.group(1).split(".")[-1]
    return info


BASELINE_APP = "benchmarks.bench.baseline_asgi:app"
DURABLE_APP = "benchmarks.bench.baseline_durable:app"


def baseline_command(server: dict, port: int, app: str = BASELINE_APP) -> list[str]:
    """Baseline A's app (or D's: `app`) under the server (and its settings) the gateway runs."""
    common = [
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        str(server["workers"]),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    if server["server"] == "granian":
        cmd = [str(VENV_BIN / "granian"), "--interface", "asgi", *common, "--no-ws"]
        if server.get("runtime_mode"):
            cmd += ["--runtime-mode", server["runtime_mode"].lower()]
        if server.get("runtime_threads", "").isdigit():
            cmd += ["--runtime-threads", server["runtime_threads"]]
        return [*cmd, *(["--loop", "uvloop"] if server.get("uvloop") else []), app]
    cmd = [str(VENV_BIN / "uvicorn"), app, *common]
    cmd += ["--http", "httptools"] if server.get("httptools") else []
    return cmd + (["--loop", "uvloop"] if server.get("uvloop") else [])


@contextlib.contextmanager
def baseline_server(cmd_for_port: Any, log_path: Path, env: dict[str, str] | None = None) -> Any:
    """(port, process) of baseline A started with `cmd_for_port(port)` (`env`: added to the
    environment); stopped after."""
    port = free_port()
    proc = procs.start(cmd_for_port(port), log_path, {**os.environ, **env} if env else None)
    try:
        wait_healthz(port, proc, 30, log_path, poll=0.05)  # it answers every path
        yield port, proc
    finally:
        procs.kill_tree(proc)
