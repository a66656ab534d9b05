#!/usr/bin/env python3
"""mqgate benchmark suite.

    python benchmarks/run.py [--store embedded|redis|redis://...] [--workers N] [--quick]
                             [--only produce,batch,...]

Starts its own gateway (`.venv/bin/mqgate serve ... --fsync always`) on a free loopback port
with a fresh data directory, registers a topic / producer / consumer through the admin API,
then runs, in order:

  produce   POST /mq/produce, 1 message per request, wrk -t2 -c64        (msgs/s, p50, p99)
  batch     POST /mq/produce/batch, 100 messages per request, wrk        (msgs/s)
  consume   GET /mq/message max=100, each pull acks the previous batch   (acked msgs/s)
  baseline  baseline A: benchmarks/baseline_asgi.py under the gateway's own HTTP server
  redispy   baseline R (Redis only): redis-py pipelined XADD / XRANGE (benchmarks/redis_baseline.py)
  store     baseline B: the store in-process (benchmarks/store_bench.py)
  recovery  1,000,000-message queue, kill -9, restart, time to /healthz (target <= 2 s)

With `--store redis` the harness starts its own `redis-server` (AOF on, `--redis-fsync`
everysec by default, no RDB snapshots) on a free loopback port in the temp directory, and the
gateway runs `--store <its URL> --workers N` (default 2); `--redis-url` (or `--store redis://...`)
uses an existing Redis instead, under a random key prefix whose keys are deleted at the end.

and appends a dated section to benchmarks/RESULTS.md. Uses only the standard library (the
store benchmark runs under the project's venv python). Every process it starts is stopped by
PID at the end, also on failure or Ctrl-C. Exit status is non-zero if any benchmark failed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import http.client
import json
import math
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from machine_info import machine as machine_info
from machine_info import sh

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
VENV_BIN = ROOT / ".venv" / "bin"
VENV_PY = VENV_BIN / "python"
MQGATE = VENV_BIN / "mqgate"
LUA_DIR = BENCH_DIR / "lua"
RESULTS = BENCH_DIR / "RESULTS.md"
HOST = "127.0.0.1"

TOPIC, PRODUCER, CONSUMER = "bench", "bench-producer", "bench-consumer"
REC_TOPIC, REC_PRODUCER, REC_CONSUMER = "recovery", "recovery-producer", "recovery-consumer"
MSG_BYTES = 100

# Targets known for this project. None = no target stated (shown as "—").
TARGETS: dict[str, tuple[str, float | None, str]] = {
    # key: (text shown, numeric bound or None, "<=" or ">=")
    "recovery_healthz_s": ("≤ 2 s", 2.0, "<="),
    "recovery_data_s": ("≤ 2 s", 2.0, "<="),
    "recovery_open_s": ("≤ 2 s", 2.0, "<="),
}
# The Redis issue's targets, stated for `--workers 2` on this (2-core) machine.
REDIS_TARGETS: dict[str, tuple[str, float | None, str]] = {
    "produce_msgs_s": ("≥ 10,000 msgs/s", 10_000, ">="),
    "batch_msgs_s": ("≥ 100,000 msgs/s", 100_000, ">="),
    "consume_msgs_s": ("≥ 400,000 msgs/s", 400_000, ">="),
    "redis_ratio": ("≥ 0.6", 0.6, ">="),
}

ALL = ["produce", "batch", "consume", "baseline", "redispy", "store", "recovery"]
REDIS_ONLY = {"redispy"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class BenchFailure(Exception):
    pass


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------

_started: list[subprocess.Popen] = []


def descendants(pid: int) -> list[int]:
    """PIDs of all live descendants of `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal the process and its descendants by PID; SIGKILL whatever outlives `timeout`."""
    if proc.poll() is not None:
        return
    kids = descendants(proc.pid)
    for pid in [proc.pid, *kids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    for pid in [proc.pid, *kids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _cleanup() -> None:
    for proc in _started:
        kill_tree(proc, signal.SIGTERM, timeout=5)


atexit.register(_cleanup)


def _on_signal(signum, frame):
    raise SystemExit(f"interrupted by signal {signum}")


signal.signal(signal.SIGTERM, _on_signal)


def start(cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
    _started.append(proc)
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# Redis (stdlib: a minimal RESP2 client for the harness's few calls)
# --------------------------------------------------------------------------------------------


class RedisReplyError(Exception):
    pass


class Resp:
    """One connection; `call(*args)` sends a command and returns the decoded RESP2 reply."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        u = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((u.hostname or HOST, u.port or 6379), timeout=timeout)
        self.rfile = self.sock.makefile("rb")
        if u.password:
            user = [urllib.parse.unquote(u.username)] if u.username else []
            self.call("AUTH", *user, urllib.parse.unquote(u.password))
        db = (u.path or "/").strip("/") or "0"
        if db != "0":
            self.call("SELECT", db)

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))
        return self._read()

    def _read(self):
        line = self.rfile.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.rfile.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ConnectionError(f"unexpected redis reply {line[:100]!r}")

    def info(self, section: str = "") -> dict[str, str]:
        raw = self.call("INFO", section) if section else self.call("INFO")
        out = {}
        for ln in raw.decode(errors="replace").splitlines():
            if ":" in ln and not ln.startswith("#"):
                k, v = ln.split(":", 1)
                out[k] = v
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()
            self.sock.close()


@dataclass
class RedisServer:
    """The Redis the gateways use: our own `redis-server` (started, restarted and stopped by
    PID here) or an existing one named by URL (left running; only our keys are deleted)."""

    url: str
    own: bool
    fsync: str = ""
    dir: Path | None = None
    log_path: Path | None = None
    proc: subprocess.Popen | None = None
    cmd: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    version: str = "?"
    config: dict = field(default_factory=dict)

    @classmethod
    def own_server(cls, work: Path, fsync: str) -> RedisServer:
        port = free_port()
        d = work / "redis"
        d.mkdir()
        srv = cls(f"redis://{HOST}:{port}/0", True, fsync, d, work / "redis.log")
        srv.cmd = [
            shutil.which("redis-server") or "redis-server",
            "--bind", HOST,
            "--port", str(port),
            "--dir", str(d),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", fsync,
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(srv.log_path),
        ]  # fmt: skip
        return srv

    def start(self, timeout: float = 120.0) -> float:
        """Start our own server (or check an existing one); seconds until PING answers (an
        AOF being loaded answers LOADING until it is done)."""
        t0 = time.monotonic()
        if self.own:
            self.proc = start(self.cmd, self.log_path)
        t1 = self.wait_ready(timeout)
        c = Resp(self.url)
        try:
            self.version = c.info("server").get("redis_version", "?")
            conf = c.call("CONFIG", "GET", "append*")
            conf += c.call("CONFIG", "GET", "save")
            self.config = {conf[i].decode(): conf[i + 1].decode() for i in range(0, len(conf), 2)}
        finally:
            c.close()
        return t1 - t0

    def wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchFailure(f"redis-server exited with {self.proc.returncode}: {tail(self.log_path)}")
            try:
                c = Resp(self.url, timeout=2)
                try:
                    if c.call("PING") == "PONG":
                        return time.monotonic()
                finally:
                    c.close()
            except (OSError, RedisReplyError) as exc:
                last = str(exc)
            time.sleep(0.005)
        raise BenchFailure(f"redis at {self.url} not ready within {timeout} s: {last}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def cpu_seconds(self) -> float:
        """CPU used so far: our server's process tree (the AOF rewrite child included), or
        INFO cpu of an existing one."""
        if self.pid is not None:
            return tree_cpu_seconds(self.pid)
        c = Resp(self.url)
        try:
            i = c.info("cpu")
        finally:
            c.close()
        return sum(float(i.get(k, 0)) for k in ("used_cpu_sys", "used_cpu_user"))

    def local(self) -> bool:
        """Whether its CPU time is spent on this machine (then it is not "other processes")."""
        return self.own or urllib.parse.urlparse(self.url).hostname in (HOST, "localhost", "::1")

    def stats(self) -> dict:
        c = Resp(self.url)
        try:
            i = c.info()
        finally:
            c.close()
        return i

    def kill9(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def delete_prefix(self, prefix: str) -> int:
        """UNLINK every key under `prefix:` (SCAN; never FLUSHDB: the Redis may be shared)."""
        c = Resp(self.url, timeout=120)
        n = 0
        try:
            cursor = b"0"
            while True:
                cursor, keys = c.call("SCAN", cursor, "MATCH", f"{prefix}:*", "COUNT", 1000)
                if keys:
                    n += c.call("UNLINK", *keys)
                if cursor == b"0":
                    return n
        finally:
            c.close()

    def rewrite_aof(self, timeout: float = 300.0) -> None:
        """BGREWRITEAOF and wait for it: the next load replays only what is left."""
        c = Resp(self.url, timeout=30)
        try:
            with contextlib.suppress(RedisReplyError):  # "already in progress" is fine
                c.call("BGREWRITEAOF")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                i = c.info("persistence")
                if i.get("aof_rewrite_in_progress") == "0" and i.get("aof_rewrite_scheduled") == "0":
                    return
                time.sleep(0.1)
        finally:
            c.close()
        raise BenchFailure(f"AOF rewrite did not finish within {timeout} s")

    def aof_bytes(self) -> int:
        if self.dir is None:
            return 0
        return sum(f.stat().st_size for f in self.dir.rglob("*") if f.is_file())

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc, signal.SIGTERM, timeout=30)
        elif not self.own:
            for prefix in self.prefixes:
                with contextlib.suppress(OSError, RedisReplyError):
                    self.delete_prefix(prefix)


# The Redis under test, if any: its CPU is accounted for beside the gateway's in every run.
REDIS: RedisServer | None = None


# --------------------------------------------------------------------------------------------
# HTTP (stdlib)
# --------------------------------------------------------------------------------------------


class Http:
    def __init__(self, port: int, token: str | None = None, timeout: float = 30.0) -> None:
        self.port, self.token, self.timeout = port, token, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: dict | bytes | None = None, token: str | None = None
    ) -> tuple[int, dict | None, bytes]:
        headers = {}
        tok = token or self.token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
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
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        return resp.status, payload, raw

    def ok(self, method: str, path: str, body=None, token=None) -> dict:
        """Call, check the envelope ({status, message, result}), return result."""
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


def wait_healthz(
    port: int, proc: subprocess.Popen, timeout: float, log_path: Path, poll: float = 0.005
) -> float:
    """Poll GET /healthz until 200; return time.monotonic() when it answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchFailure(f"gateway exited with {proc.returncode}:\n{tail(log_path)}")
        try:
            c = http.client.HTTPConnection(HOST, port, timeout=2)
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return time.monotonic()
        except OSError:
            pass
        time.sleep(poll)
    raise BenchFailure(f"/healthz did not answer 200 within {timeout} s:\n{tail(log_path)}")


# --------------------------------------------------------------------------------------------
# gateway
# --------------------------------------------------------------------------------------------


@dataclass
class Gateway:
    port: int
    data_dir: Path
    admin_token: str
    log_path: Path
    store: str
    workers: int | None = None  # None: no --workers flag (the embedded default)
    redis_prefix: str = ""  # MQGATE_REDIS_PREFIX
    proc: subprocess.Popen | None = None
    cmd: list[str] = field(default_factory=list)
    admin: Http | None = None
    all_workers_s: float = 0.0  # spawn → every worker process answered /healthz

    def command(self) -> list[str]:
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
            cmd += ["--fsync", "always"]  # the Redis store's durability is Redis's own
        if self.store != "embedded" or "--store" in serve_help():
            if "--store" not in serve_help():
                raise BenchFailure(f"--store {self.store} asked, but `mqgate serve` has no --store")
            cmd += ["--store", self.store]
        if self.workers is not None:
            if "--workers" not in serve_help():
                raise BenchFailure("--workers asked, but `mqgate serve` has no --workers")
            cmd += ["--workers", str(self.workers)]
        return cmd

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQGATE_")}
        env["MQGATE_ADMIN_TOKEN"] = self.admin_token
        if self.redis_prefix:
            env["MQGATE_REDIS_PREFIX"] = self.redis_prefix
        return env

    def start(self, health_timeout: float = 60.0) -> float:
        """Start; return seconds from spawn to /healthz answering 200. With several workers,
        also wait until each of them has answered (`all_workers_s`)."""
        self.cmd = self.command()
        t0 = time.monotonic()
        self.proc = start(self.cmd, self.log_path, self.env())
        t1 = wait_healthz(self.port, self.proc, health_timeout, self.log_path)
        self.all_workers_s = wait_all_workers(self.port, self.workers or 1, t0 + health_timeout) - t0
        self.admin = Http(self.port, self.admin_token)
        return t1 - t0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.admin:
            self.admin.close()
        if self.proc is not None:
            kill_tree(self.proc, sig)

    def kill9(self) -> None:
        """kill -9 the server and every process under it, by PID."""
        assert self.proc is not None
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.admin:
            self.admin.close()

    def progress(self, consumer: str = CONSUMER) -> dict:
        return self.admin.ok("GET", f"/admin/consumers/{consumer}/progress")


def wait_all_workers(port: int, workers: int, deadline: float) -> float:
    """Poll /healthz on new connections until `workers` distinct pids answered (a connection
    goes to whichever worker accepts it); return time.monotonic() then."""
    seen: set = set()
    while True:
        with contextlib.suppress(OSError, ValueError):
            c = http.client.HTTPConnection(HOST, port, timeout=2)
            c.request("GET", "/healthz")
            r = c.getresponse()
            body = r.read()
            c.close()
            if r.status == 200:
                seen.add(json.loads(body).get("result", {}).get("pid"))
        if len(seen) >= workers:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise BenchFailure(f"only {len(seen)} of {workers} gateway workers answered /healthz")
        time.sleep(0.002)


_serve_help: str | None = None


def serve_help() -> str:
    global _serve_help
    if _serve_help is None:
        r = subprocess.run(
            [str(MQGATE), "serve", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        if r.returncode != 0:
            raise BenchFailure(f"`mqgate serve --help` failed: {r.stderr[-500:]}")
        _serve_help = r.stdout
    return _serve_help


def register(gw: Gateway, topic: str, queues: int, producer: str, consumer: str) -> tuple[str, str]:
    t = gw.admin.ok("POST", "/admin/topics", {"name": topic, "queues": queues})
    if t.get("name") != topic or t.get("queues") != queues:
        raise BenchFailure(f"POST /admin/topics answered {t}")
    p = gw.admin.ok("POST", "/admin/producers", {"name": producer, "topic": topic})
    c = gw.admin.ok("POST", "/admin/consumers", {"name": consumer, "topic": topic})
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


# --------------------------------------------------------------------------------------------
# wrk
# --------------------------------------------------------------------------------------------


def wrk(
    script: str, url: str, threads: int, conns: int, duration: float, env: dict, latency: bool = True
) -> dict:
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(duration))}s", "--timeout", "10s"]
    if latency:
        cmd.append("--latency")
    cmd += ["-s", str(LUA_DIR / script), url]
    full_env = dict(os.environ, MQB_LUA_DIR=str(LUA_DIR), **env)
    log("  $ " + " ".join(cmd))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, start_new_session=True
    )
    _started.append(proc)
    try:
        out, err = proc.communicate(timeout=duration + 60)
    except subprocess.TimeoutExpired:
        kill_tree(proc, signal.SIGKILL)
        raise BenchFailure(f"wrk did not finish in {duration + 60} s") from None
    line = next((ln for ln in out.splitlines() if ln.startswith("MQBENCH ")), None)
    if proc.returncode != 0 or line is None:
        raise BenchFailure(f"wrk failed (rc {proc.returncode}): {err[-800:]} {out[-800:]}")
    res = json.loads(line[len("MQBENCH ") :])
    res["command"] = " ".join(cmd)
    res["seconds"] = res["duration_us"] / 1e6
    res["ok_requests"] = res["requests"] - res["err_status"]
    res["socket_errors"] = res["err_connect"] + res["err_read"] + res["err_write"] + res["err_timeout"]
    return res


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU seconds used so far by `pid` and its descendants, live ones and those
    already waited for (redis-server's AOF-rewrite forks come and go within a run)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(v) for v in f[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def system_busy_seconds() -> tuple[float, float]:
    """(process CPU seconds: user+nice+system, kernel irq+softirq seconds) of the whole
    machine, from /proc/stat. Loopback networking shows up as softirq, charged to no process."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    return (vals[0] + vals[1] + vals[2]) / hz, (vals[5] + vals[6]) / hz


def own_and_waited_cpu() -> float:
    """CPU seconds of this harness plus its children already waited for (wrk)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


class RedisMeter:
    """CPU and AOF-rewrite forks of the Redis under test over a stretch of time."""

    def __init__(self) -> None:
        self.on = REDIS is not None
        self.cpu0 = REDIS.cpu_seconds() if self.on else 0.0
        self.forks0 = int(REDIS.stats().get("total_forks", 0)) if self.on else 0

    def finish(self, res: dict, wall: float) -> float:
        """Store redis_cpu_pct / redis_forks in `res`; return the CPU seconds to count as
        accounted for (not "other processes")."""
        if not self.on:
            return 0.0
        used = REDIS.cpu_seconds() - self.cpu0
        res["redis_cpu_pct"] = 100.0 * used / wall
        res["redis_forks"] = int(REDIS.stats().get("total_forks", 0)) - self.forks0
        return used if REDIS.local() else 0.0


def wrk_measured(server_pid: int, *args, **kwargs) -> dict:
    """wrk, plus CPU use over the run (100 % = one core busy): the server's process tree, the
    Redis under test if any, wrk (+ this harness), and everything else on the machine
    ("other"), which should be ~0."""
    c0, s0, w0, t0 = (
        tree_cpu_seconds(server_pid),
        system_busy_seconds(),
        own_and_waited_cpu(),
        time.monotonic(),
    )
    rm = RedisMeter()
    res = wrk(*args, **kwargs)
    c1, s1, w1, t1 = (
        tree_cpu_seconds(server_pid),
        system_busy_seconds(),
        own_and_waited_cpu(),
        time.monotonic(),
    )
    wall = t1 - t0
    r = rm.finish(res, wall)
    res["cpu_wall_s"] = wall
    res["server_cpu_pct"] = 100.0 * (c1 - c0) / wall
    res["wrk_cpu_pct"] = 100.0 * (w1 - w0) / wall
    res["softirq_cpu_pct"] = 100.0 * (s1[1] - s0[1]) / wall
    res["other_cpu_pct"] = max(0.0, 100.0 * ((s1[0] - s0[0]) - (c1 - c0) - (w1 - w0) - r) / wall)
    return res


def server_cpu_per_request(res: dict) -> str:
    """The gateway's CPU (its whole process tree: workers, the trace index writer) per answered
    request: steadier than throughput when the load generator shares the cores."""
    used = res["server_cpu_pct"] / 100 * res["cpu_wall_s"]
    return f"server CPU {used / max(1, res['ok_requests']) * 1e6:.0f} µs/request"


def cpu_note(res: dict) -> str:
    def per_request(pct: float) -> str:
        """CPU time per HTTP request, when the run says how many there were."""
        if not res.get("requests") or not res.get("cpu_wall_s"):
            return ""
        return f" ({pct / 100 * res['cpu_wall_s'] / res['requests'] * 1e6:.0f} µs/request)"

    redis = ""
    if res.get("redis_cpu_pct", 0) >= 1:
        redis = f"redis-server {res['redis_cpu_pct']:.0f} %{per_request(res['redis_cpu_pct'])}, "
        if res.get("redis_forks"):
            redis += f"({res['redis_forks']} AOF rewrite fork(s) during the run), "
    server = f"{res['server_cpu_pct']:.0f} %" + (per_request(res["server_cpu_pct"]) if REDIS else "")
    return (
        f"CPU (100 % = 1 core): server {server}, {redis}"
        f"wrk {res['wrk_cpu_pct']:.0f} %, kernel softirq {res['softirq_cpu_pct']:.0f} %, "
        f"other processes {res['other_cpu_pct']:.0f} %"
    )


def note_other_load(ctx: Ctx, what: str, res: dict) -> None:
    if res["other_cpu_pct"] > 15:
        ctx.problems.append(
            f"{what}: other processes used {res['other_cpu_pct']:.0f} % of a core "
            "during the run; its figure is depressed"
        )


def check_wrk_errors(res: dict, what: str, max_fraction: float = 0.001) -> list[str]:
    problems = []
    if res["requests"] == 0:
        raise BenchFailure(f"{what}: wrk completed no request at all")
    if res["err_status"] > max_fraction * res["requests"]:
        raise BenchFailure(f"{what}: {res['err_status']} of {res['requests']} answers were not 2xx")
    if res["err_status"]:
        problems.append(f"{what}: {res['err_status']} non-2xx answers")
    if res["socket_errors"]:
        problems.append(
            f"{what}: socket errors connect={res['err_connect']} read={res['err_read']} "
            f"write={res['err_write']} timeout={res['err_timeout']}"
        )
    return problems


# --------------------------------------------------------------------------------------------
# fill (bounded, stdlib threads)
# --------------------------------------------------------------------------------------------


def fill(
    port: int,
    token: str,
    producer: str,
    count: int,
    batch: int = 1000,
    conns: int = 4,
    timeout: float = 600.0,
) -> float:
    """Produce exactly `count` messages with batch requests; return messages/s."""
    msg = "y" * MSG_BYTES
    left = [count]
    lock = threading.Lock()
    errors: list[str] = []
    bodies: dict[int, bytes] = {}

    def body(n: int) -> bytes:
        if n not in bodies:
            bodies[n] = json.dumps({"producer": producer, "messages": [{"message": msg}] * n}).encode()
        return bodies[n]

    deadline = time.monotonic() + timeout

    def worker() -> None:
        h = Http(port, token, timeout=60)
        try:
            while not errors and time.monotonic() < deadline:
                with lock:
                    n = min(batch, left[0])
                    left[0] -= n
                    if n == 0:
                        return
                    data = body(n)
                r = h.ok("POST", "/mq/produce/batch", data)
                if len(r.get("receipts", [])) != n:
                    errors.append(f"batch of {n} got {len(r.get('receipts', []))} receipts")
        except Exception as exc:
            errors.append(str(exc))
        finally:
            h.close()

    t0 = time.monotonic()
    ths = [threading.Thread(target=worker, daemon=True) for _ in range(conns)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    if errors:
        raise BenchFailure(f"fill failed: {errors[0]}")
    if left[0] > 0:
        raise BenchFailure(f"fill timed out with {left[0]} messages left")
    return count / (time.monotonic() - t0)


# --------------------------------------------------------------------------------------------
# benchmarks
# --------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    duration: float
    results: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    preflight: str = ""
    gw: Gateway | None = None
    ptoken: str = ""
    ctoken: str = ""
    server: dict = field(default_factory=dict)
    busy_before: float = 0.0
    loadavg: str = ""
    gw_prefix: str = ""  # MQGATE_REDIS_PREFIX of the benchmark gateway
    redis_end: dict = field(default_factory=dict)  # INFO of the Redis at the end
    record_bytes: int = 0  # one stored message in Redis (the stream entry's `d`)


def stored_record_bytes(ctx: Ctx) -> int:
    """Size of one stored message in the gateway's Redis stream (its `d` field), for the
    comparison with baseline R's 100-byte entries; 0 if the key layout is not the one known."""
    with contextlib.suppress(OSError, RedisReplyError, IndexError, TypeError, ValueError):
        c = Resp(REDIS.url)
        try:
            entry = c.call("XRANGE", f"{ctx.gw_prefix}:{{t:{TOPIC}}}:q:0", "-", "+", "COUNT", 1)
        finally:
            c.close()
        fields = entry[0][1]
        return len(dict(zip(fields[::2], fields[1::2], strict=True))[b"d"])
    return 0


def settle(gw: Gateway, before_max: int, expect_at_least: int, wait: float = 5.0) -> dict:
    """Wait until stored messages stop growing (in-flight requests at wrk's end)."""
    t_end = time.monotonic() + wait
    prev = None
    while True:
        cur = totals(gw.progress())
        if cur["max"] == prev and cur["max"] - before_max >= expect_at_least:
            return cur
        if time.monotonic() > t_end:
            return cur
        prev = cur["max"]
        time.sleep(0.25)


def preflight(ctx: Ctx) -> None:
    """A few cheap protocol checks (PROTOCOL.md); mismatches are reported, not fatal."""
    gw = ctx.gw
    before = len(ctx.problems)
    h = Http(gw.port)
    body = {"producer": PRODUCER, "message": "preflight"}

    def expect(what: str, status: int, payload, raw: bytes, want: int) -> None:
        if status != want:
            ctx.problems.append(f"protocol: {what}: expected HTTP {want}, got {status}: {raw[:200]!r}")
        elif (
            not isinstance(payload, dict)
            or payload.get("status") != status
            or "message" not in payload
            or "result" not in payload
        ):
            ctx.problems.append(f"protocol: {what}: answer is not the envelope: {raw[:200]!r}")

    try:
        st, pl, raw = h.request("GET", "/healthz")
        expect("GET /healthz", st, pl, raw, 200)
        st, pl, raw = h.request("POST", "/mq/produce", body)
        expect("produce without token", st, pl, raw, 401)
        st, pl, raw = h.request("POST", "/mq/produce", body, token="not-a-token")
        expect("produce with a token that is no one's", st, pl, raw, 401)
        st, pl, raw = h.request("POST", "/mq/produce", body, token=ctx.ctoken)
        expect("produce with the consumer's token", st, pl, raw, 403)
        r = h.ok("POST", "/mq/produce", body, token=ctx.ptoken)
        q = urllib.parse.urlencode({"topic": TOPIC, "consumer": CONSUMER, "max": 1})
        r = h.ok("GET", f"/mq/message?{q}", token=ctx.ctoken)
        if r.get("status") != "FOUND" or not r.get("requestId") or len(r.get("msgList", [])) != 1:
            ctx.problems.append(f"protocol: pull after a produce did not give one FOUND message: {r}")
        else:
            m = r["msgList"][0]
            missing = [
                k
                for k in (
                    "messageId",
                    "message",
                    "keys",
                    "tags",
                    "properties",
                    "timestamp",
                    "broker",
                    "queue",
                    "offset",
                    "reconsumeTimes",
                )
                if k not in m
            ]
            if missing:
                ctx.problems.append(f"protocol: msgList item lacks {missing}: {m}")
            h.ok("POST", "/mq/release", {"requestId": r["requestId"]}, token=ctx.ctoken)
    except BenchFailure as exc:
        ctx.problems.append(f"protocol: preflight: {exc}")
    finally:
        h.close()
    bad = len(ctx.problems) - before
    ctx.preflight = "all passed" if bad == 0 else f"{bad} failed (see Problems seen)"


def trace_index_catch_up(ctx: Ctx, limit_s: float = 300.0) -> None:
    """With --trace: the trace index's lag when the load stopped, and how long it took to catch
    up (the indexer keeps up when this stays small)."""

    def lag() -> tuple[float, float]:
        conn = http.client.HTTPConnection("127.0.0.1", ctx.gw.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        found = dict(re.findall(r"^(mqgate_trace_[a-z_]+?)(?:_total)? ([0-9.e+]+)$", text, re.M))
        return float(found.get("mqgate_trace_index_lag_events", 0)), float(
            found.get("mqgate_trace_events_indexed", 0)
        )

    start = time.monotonic()
    first, indexed0 = lag()
    events = first
    while events > 0 and time.monotonic() - start < limit_s:
        time.sleep(0.5)
        events, indexed = lag()
    took = time.monotonic() - start
    _, indexed = lag()
    log(
        f"  trace index: {first:,.0f} events behind when the load stopped; caught up in {took:.1f} s "
        f"({indexed:,.0f} events indexed in all; "
        f"{(indexed - indexed0) / max(took, 0.001):,.0f} events/s meanwhile)"
    )
    ctx.problems.append(
        f"trace index lag at the end of the load: {first:,.0f} events, caught up in {took:.1f} s"
        + ("" if events == 0 else f" (still {events:,.0f} behind after {limit_s:.0f} s)")
    )


def bench_produce(ctx: Ctx) -> None:
    gw = ctx.gw
    # one request by hand first, to report a protocol problem in words rather than as a count
    h = Http(gw.port, ctx.ptoken)
    r = h.ok("POST", "/mq/produce", {"producer": PRODUCER, "message": "x" * MSG_BYTES})
    h.close()
    for k in ("msgId", "broker", "queue", "offset"):
        if k not in r:
            ctx.problems.append(f"POST /mq/produce receipt lacks {k}: {r}")
    before = totals(gw.progress())
    res = wrk_measured(
        gw.proc.pid,
        "produce.lua",
        f"http://{HOST}:{gw.port}/mq/produce",
        2,
        64,
        ctx.duration,
        {"MQB_TOKEN": ctx.ptoken, "MQB_PRODUCER": PRODUCER, "MQB_MSG_BYTES": str(MSG_BYTES)},
    )
    ctx.problems += check_wrk_errors(res, "produce")
    note_other_load(ctx, "produce", res)
    after = settle(gw, before["max"], res["ok_requests"])
    stored = after["max"] - before["max"]
    res["stored"] = stored
    if stored < res["ok_requests"]:
        raise BenchFailure(
            f"produce: wrk got {res['ok_requests']} 200s but only {stored} "
            "messages were stored (progress max)"
        )
    # wrk does not count the answers in flight when it stops (one per connection); runs here
    # showed exactly one more than that, hence the small margin
    if stored > res["requests"] + 64 + 2:
        ctx.problems.append(f"produce: {stored} stored for {res['requests']} requests")
    res["msgs_per_s"] = res["ok_requests"] / res["seconds"]
    ctx.results["produce"] = res
    log(
        f"  produce: {res['msgs_per_s']:.0f} msgs/s, p50 {res['lat_p50_us'] / 1000:.2f} ms, "
        f"p99 {res['lat_p99_us'] / 1000:.2f} ms (stored {stored}), {server_cpu_per_request(res)}"
    )


def bench_batch(ctx: Ctx) -> None:
    gw = ctx.gw
    n = ctx.args.batch
    before = totals(gw.progress())
    res = wrk_measured(
        gw.proc.pid,
        "produce_batch.lua",
        f"http://{HOST}:{gw.port}/mq/produce/batch",
        2,
        ctx.args.batch_conns,
        ctx.duration,
        {
            "MQB_TOKEN": ctx.ptoken,
            "MQB_PRODUCER": PRODUCER,
            "MQB_BATCH": str(n),
            "MQB_MSG_BYTES": str(MSG_BYTES),
        },
    )
    ctx.problems += check_wrk_errors(res, "batch")
    note_other_load(ctx, "batch", res)
    after = settle(gw, before["max"], res["ok_requests"] * n)
    stored = after["max"] - before["max"]
    res["stored"] = stored
    if stored < res["ok_requests"] * n:
        raise BenchFailure(
            f"batch: {res['ok_requests']} batches of {n} answered 200 but only {stored} messages were stored"
        )
    res["msgs_per_s"] = res["ok_requests"] * n / res["seconds"]
    ctx.results["batch"] = res
    log(
        f"  batch: {res['msgs_per_s']:.0f} msgs/s ({res['ok_requests'] / res['seconds']:.0f} req/s), "
        f"p50 {res['lat_p50_us'] / 1000:.2f} ms, p99 {res['lat_p99_us'] / 1000:.2f} ms, "
        f"{server_cpu_per_request(res)}"
    )


def bench_consume(ctx: Ctx) -> None:
    gw = ctx.gw
    before = totals(gw.progress())
    want = ctx.args.prefill
    if before["lag"] < want:
        log(f"  pre-filling {want - before['lag']} messages (lag is {before['lag']})")
        rate = fill(gw.port, ctx.ptoken, PRODUCER, want - before["lag"])
        log(f"  pre-fill at {rate:.0f} msgs/s")
        before = totals(gw.progress())
    if before["lag"] <= 0:
        raise BenchFailure("consume: nothing to consume (lag 0 after pre-fill)")
    res = wrk_measured(
        gw.proc.pid,
        "consume.lua",
        f"http://{HOST}:{gw.port}/",
        2,
        ctx.args.consume_conns,
        ctx.duration,
        {
            "MQB_TOKEN": ctx.ctoken,
            "MQB_TOPIC": TOPIC,
            "MQB_CONSUMER": CONSUMER,
            "MQB_MAX": str(ctx.args.pull_max),
            "MQB_TARGET": str(math.ceil(before["lag"] / 2)),
            "MQB_EMPTY_STOP": "50",
        },
    )
    note_other_load(ctx, "consume", res)
    time.sleep(0.5)
    after = totals(gw.progress())
    committed = after["committed"] - before["committed"]
    lag_drop = before["lag"] - after["lag"]
    res.update(
        lag_before=before["lag"],
        lag_after=after["lag"],
        committed=committed,
        lag_drop=lag_drop,
        locked_after=after["locked"],
    )
    if res["received"] == 0 or committed <= 0 or lag_drop <= 0:
        raise BenchFailure(
            f"consume: consumed nothing — received {res['received']} messages, committed "
            f"{committed}, lag {before['lag']} -> {after['lag']}; first error: {res['first_err']!r}"
        )
    if res["http_err"] or res["other"]:
        ctx.problems.append(
            f"consume: {res['http_err']} non-200 answers, {res['other']} other "
            f"result.status; first: {res['first_err']!r}"
        )
    if res["acks_bad"]:
        ctx.problems.append(f"consume: {res['acks_bad']} acks failed; e.g. {res['bad_ack']!r}")
    if res["no_token"]:
        ctx.problems.append(f"consume: {res['no_token']} FOUND answers without requestId")
    if lag_drop != committed:
        ctx.problems.append(f"consume: lag dropped by {lag_drop} but committed offsets moved by {committed}")
    slack = (res["unacked_tokens"] + res["acks_bad"] + ctx.args.consume_conns) * ctx.args.pull_max
    if not (res["received"] - slack <= committed <= res["received"]):
        ctx.problems.append(
            f"consume: received {res['received']} but committed {committed} "
            f"(unacked tokens {res['unacked_tokens']})"
        )
    # rate window: the whole run, or up to the last FOUND answer if the backlog drained
    window = res["seconds"]
    if res["drained"] and res["t_last_found"] > res["t_start"]:
        window = res["t_last_found"] - res["t_start"]
        ctx.notes.append(
            f"consume: the backlog drained after {window:.1f} s of the {res['seconds']:.0f} s run; "
            "the rate is over that window (more with --prefill)"
        )
    res["window_s"] = window
    res["msgs_per_s"] = committed / window
    res["delivered_per_s"] = res["received"] / window
    res["pulls_per_s"] = (res["found"] + res["empty"]) / window
    ctx.results["consume"] = res
    log(
        f"  consume: {res['msgs_per_s']:.0f} acked msgs/s ({res['delivered_per_s']:.0f} delivered/s), "
        f"lag {before['lag']} -> {after['lag']}, acks ok {res['acks_ok']}, failed {res['acks_bad']}"
    )


def detect_server(gw: Gateway) -> dict:
    """Which HTTP server `mqgate serve` really runs, read from the live process tree."""
    pids = [gw.proc.pid, *descendants(gw.proc.pid)]
    maps = ""
    for pid in pids:
        with contextlib.suppress(OSError):
            maps += Path(f"/proc/{pid}/maps").read_text()
    info: dict = {"pids": len(pids)}
    # worker processes: the children, less multiprocessing's resource tracker
    kids = 0
    for pid in pids[1:]:
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                kids += 1
    info["workers"] = max(1, kids)
    info["server"] = "granian" if "_granian" in maps or "/granian/" in maps else "uvicorn"
    info["uvloop"] = "uvloop" in maps
    info["httptools"] = "httptools" in maps
    # granian runtime settings, if the serve code passes any
    src = ""
    for p in (ROOT / "src" / "mqgate").rglob("*.py"):
        txt = p.read_text(errors="replace")
        if "granian" in txt.lower():
            src += txt
    for opt in ("runtime_threads", "runtime_mode", "blocking_threads", "loop"):
        m = re.search(rf"{opt}\s*=\s*['\"]?([\w.]+)", src)
        if m:
            info[opt] = m.group(1).split(".")[-1]
    return info


def baseline_command(server: dict, port: int) -> list[str]:
    if server["server"] == "granian":
        cmd = [
            str(VENV_BIN / "granian"),
            "--interface",
            "asgi",
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            str(server["workers"]),
            "--no-access-log",
            "--log-level",
            "warning",
            "--no-ws",
        ]
        if server.get("runtime_mode"):
            cmd += ["--runtime-mode", server["runtime_mode"].lower()]
        if server.get("runtime_threads", "").isdigit():
            cmd += ["--runtime-threads", server["runtime_threads"]]
        if server.get("uvloop"):
            cmd += ["--loop", "uvloop"]
        return [*cmd, "benchmarks.baseline_asgi:app"]
    cmd = [
        str(VENV_BIN / "uvicorn"),
        "benchmarks.baseline_asgi:app",
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
    if server.get("httptools"):
        cmd += ["--http", "httptools"]
    if server.get("uvloop"):
        cmd += ["--loop", "uvloop"]
    return cmd


def bench_baseline(ctx: Ctx) -> None:
    port = free_port()
    cmd = baseline_command(ctx.server, port)
    log("  baseline A: " + " ".join(cmd))
    lp = ctx.work / "baseline.log"
    proc = start(cmd, lp)
    try:
        wait_healthz_any(port, proc, lp)
        res = wrk_measured(
            proc.pid,
            "produce.lua",
            f"http://{HOST}:{port}/mq/produce",
            2,
            64,
            ctx.duration,
            {"MQB_TOKEN": "baseline", "MQB_PRODUCER": PRODUCER, "MQB_MSG_BYTES": str(MSG_BYTES)},
        )
    finally:
        kill_tree(proc)
    ctx.problems += check_wrk_errors(res, "baseline A")
    note_other_load(ctx, "baseline A", res)
    res["server_command"] = " ".join(cmd)
    res["req_per_s"] = res["ok_requests"] / res["seconds"]
    ctx.results["baseline"] = res
    log(
        f"  baseline A: {res['req_per_s']:.0f} req/s, p50 {res['lat_p50_us'] / 1000:.2f} ms, "
        f"p99 {res['lat_p99_us'] / 1000:.2f} ms"
    )


def wait_healthz_any(port: int, proc: subprocess.Popen, lp: Path) -> None:
    """The baseline answers every path; wait for it to accept a request."""
    wait_healthz(port, proc, 30, lp, poll=0.05)


def bench_store(ctx: Ctx) -> None:
    d = ctx.work / "store-bench"
    d.mkdir()
    where = ["--data-dir", str(d)]
    if REDIS is not None:
        # RedisStore in as many processes as gateway workers, readers as many as consume's
        # connections (a Redis read is a round trip: one sequential reader would idle)
        where = [
            "--store",
            REDIS.url,
            "--procs",
            str(ctx.args.workers),
            "--read-tasks",
            str(ctx.args.consume_conns),
        ]
    cmd = [
        str(VENV_PY),
        str(BENCH_DIR / "store_bench.py"),
        "throughput",
        *where,
        "--duration",
        str(ctx.duration),
        "--concurrency",
        "64",
        "--batch",
        str(ctx.args.batch),
        "--batch-concurrency",
        str(ctx.args.batch_conns),
        "--read-max",
        str(ctx.args.pull_max),
    ]
    log("  $ " + " ".join(cmd))
    s0, w0, t0 = system_busy_seconds(), own_and_waited_cpu(), time.monotonic()
    rm = RedisMeter()
    r = run_json(cmd, timeout=ctx.duration * 6 + 120)
    s1, w1, t1 = system_busy_seconds(), own_and_waited_cpu(), time.monotonic()
    used = rm.finish(r, t1 - t0)
    r["store_cpu_pct"] = 100.0 * (w1 - w0) / (t1 - t0)
    r["other_cpu_pct"] = max(0.0, 100.0 * ((s1[0] - s0[0]) - (w1 - w0) - used) / (t1 - t0))
    note_other_load(ctx, "store", r)
    r["command"] = " ".join(cmd)
    ctx.results["store"] = r
    shutil.rmtree(d, ignore_errors=True)
    log(
        f"  store: append 1 (64 tasks) {r['append_single_conc']['messages_per_s']:.0f}/s, "
        f"append 1 (1 task) {r['append_single_seq']['messages_per_s']:.0f}/s, "
        f"append {ctx.args.batch} {r['append_batch']['messages_per_s']:.0f} msgs/s, "
        f"read {ctx.args.pull_max} {r['read']['messages_per_s']:.0f} msgs/s, "
        f"read_raw {r.get('read_raw', {}).get('messages_per_s', 0):.0f} msgs/s"
    )


def bench_redispy(ctx: Ctx) -> None:
    """Baseline R: plain redis-py against the same Redis, as many client processes as gateway
    workers, in flight as many commands as wrk has connections."""
    cmd = [
        str(VENV_PY),
        str(BENCH_DIR / "redis_baseline.py"),
        "--url",
        REDIS.url,
        "--procs",
        str(ctx.args.workers),
        "--duration",
        str(ctx.duration),
        "--conns",
        "64",
        "--batch",
        str(ctx.args.batch),
        "--read-max",
        str(ctx.args.pull_max),
        "--read-conns",
        str(ctx.args.consume_conns),
        "--payload-bytes",
        str(MSG_BYTES),
    ]
    log("  $ " + " ".join(cmd))
    s0, w0, t0 = system_busy_seconds(), own_and_waited_cpu(), time.monotonic()
    rm = RedisMeter()
    r = run_json(cmd, timeout=ctx.duration * 4 + 180)
    s1, w1, t1 = system_busy_seconds(), own_and_waited_cpu(), time.monotonic()
    used = rm.finish(r, t1 - t0)
    r["other_cpu_pct"] = max(0.0, 100.0 * ((s1[0] - s0[0]) - (w1 - w0) - used) / (t1 - t0))
    note_other_load(ctx, "baseline R", r)
    r["command"] = " ".join(cmd)
    ctx.results["redispy"] = r
    log(
        f"  baseline R: XADD 1 {r['xadd_single']['messages_per_s']:.0f}/s, "
        f"XADD batch {r['xadd_batch']['messages_per_s']:.0f} msgs/s, "
        f"XRANGE {r['xrange']['messages_per_s']:.0f} msgs/s"
    )


def run_json(cmd: list[str], timeout: float) -> dict:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    _started.append(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc, signal.SIGKILL)
        raise BenchFailure(f"{cmd[1]} did not finish in {timeout} s") from None
    if proc.returncode != 0:
        raise BenchFailure(f"{' '.join(cmd)} failed (rc {proc.returncode}): {err[-1500:]}")
    return json.loads(out.strip().splitlines()[-1])


def bench_recovery_redis(ctx: Ctx) -> None:
    """No local data to recover: time a restart of the gateway (every worker killed -9), then,
    on our own Redis, a kill -9 and restart of redis-server (AOF load) under the gateway."""
    n = ctx.args.recovery_messages
    prefix = f"{ctx.gw_prefix}-rec"
    REDIS.prefixes.append(prefix)
    if REDIS.own and ctx.gw_prefix:
        # the other benchmarks' keys go, and the AOF is rewritten: the restart below then
        # loads the recovery data only
        dropped = REDIS.delete_prefix(ctx.gw_prefix)
        REDIS.rewrite_aof()
        log(f"  dropped {dropped} keys of the earlier benchmarks, AOF rewritten")
    gw = Gateway(
        free_port(),
        ctx.work / "recovery-data",
        secrets.token_urlsafe(24),
        ctx.work / "recovery-gateway.log",
        REDIS.url,
        workers=ctx.args.workers,
        redis_prefix=prefix,
    )
    res: dict = {"messages": n, "redis": True}
    ctx.notes.append(
        "recovery: the Redis store keeps no state in the gateway, so instead of a crash recovery "
        "this times a restart of the gateway (every worker killed -9)"
        + (" and a kill -9 + restart of redis-server under the running gateway" if REDIS.own else "")
    )
    try:
        gw.start()
        ptoken, _ = register(gw, REC_TOPIC, 1, REC_PRODUCER, REC_CONSUMER)
        await_registry(gw)
        log(f"  filling a 1-queue topic with {n} messages")
        res["fill_msgs_per_s"] = fill(gw.port, ptoken, REC_PRODUCER, n)
        p = totals(gw.progress(REC_CONSUMER))
        if p["max"] != n:
            raise BenchFailure(f"recovery: after filling {n}, progress max is {p['max']}")
        log(f"  filled at {res['fill_msgs_per_s']:.0f} msgs/s; kill -9 of the gateway")
        gw.kill9()
        t0 = time.monotonic()
        res["healthz_s"] = gw.start()
        res["all_workers_s"] = gw.all_workers_s
        res["data_s"] = wait_progress(gw, n, t0, 60) - t0
        log(
            f"  gateway restart: /healthz after {res['healthz_s']:.3f} s, all {ctx.args.workers} "
            f"workers after {res['all_workers_s']:.3f} s, all {n} messages visible after "
            f"{res['data_s']:.3f} s"
        )
        h = Http(gw.port, ptoken)
        h.ok("POST", "/mq/produce", {"producer": REC_PRODUCER, "message": "after restart"})
        if REDIS.own:
            # everysec: give the last second's writes time to reach the AOF, so this measures
            # the load time (a loss would be reported below, not hidden)
            time.sleep(1.5)
            res["aof_bytes"] = REDIS.aof_bytes()
            log(f"  kill -9 of redis-server ({res['aof_bytes'] / 1e6:.0f} MB of AOF)")
            REDIS.kill9()
            t0 = time.monotonic()
            res["redis_ready_s"] = REDIS.start(timeout=300)
            res["redis_data_s"] = wait_progress(gw, n + 1, t0, 120) - t0
            t2 = time.monotonic()
            while True:  # the gateway's pooled connections died with Redis: first write back
                try:
                    h.ok("POST", "/mq/produce", {"producer": REC_PRODUCER, "message": "after redis"})
                    break
                except BenchFailure:
                    if time.monotonic() - t2 > 30:
                        raise
                    time.sleep(0.01)
            res["redis_produce_s"] = time.monotonic() - t0
            log(
                f"  redis restart: PING after {res['redis_ready_s']:.3f} s, all messages visible "
                f"through the gateway after {res['redis_data_s']:.3f} s, a produce after "
                f"{res['redis_produce_s']:.3f} s"
            )
        h.close()
    finally:
        gw.stop()
        res["gateway_command"] = " ".join(gw.cmd)
        ctx.results["recovery"] = res


def wait_progress(gw: Gateway, n: int, t0: float, timeout: float) -> float:
    """Poll progress until `max` is `n` (errors while a backend comes back are retried)."""
    last = ""
    while time.monotonic() - t0 < timeout:
        try:
            got = totals(gw.progress(REC_CONSUMER))["max"]
        except (BenchFailure, OSError, http.client.HTTPException) as exc:
            last = str(exc)
        else:
            if got == n:
                return time.monotonic()
            if got > n:
                raise BenchFailure(f"recovery: progress max is {got}, expected {n}")
            last = f"progress max {got}, expected {n}"
        time.sleep(0.002)
    raise BenchFailure(f"recovery: not all messages visible after {timeout} s: {last[:300]}")


def bench_recovery(ctx: Ctx) -> None:
    if REDIS is not None:
        bench_recovery_redis(ctx)
        return
    n = ctx.args.recovery_messages
    d = ctx.work / "recovery-data"
    gw = Gateway(free_port(), d, secrets.token_urlsafe(24), ctx.work / "recovery-gateway.log", ctx.args.store)
    res: dict = {"messages": n}
    try:
        gw.start()
        ptoken, _ = register(gw, REC_TOPIC, 1, REC_PRODUCER, REC_CONSUMER)
        log(f"  filling a 1-queue topic with {n} messages")
        res["fill_msgs_per_s"] = fill(gw.port, ptoken, REC_PRODUCER, n)
        p = totals(gw.progress(REC_CONSUMER))
        if p["max"] != n:
            raise BenchFailure(f"recovery: after filling {n}, progress max is {p['max']}")
        log(f"  filled at {res['fill_msgs_per_s']:.0f} msgs/s; kill -9")
        gw.kill9()
        res["data_bytes"] = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        crash_copy = ctx.work / "recovery-crash-copy"
        shutil.copytree(d, crash_copy)
        t0 = time.monotonic()
        res["healthz_s"] = gw.start()
        # first successful data-path answer: progress showing every message back
        while True:
            p = totals(gw.progress(REC_CONSUMER))
            if p["max"] == n:
                break
            if time.monotonic() - t0 > 60:
                raise BenchFailure(f"recovery: after restart progress max is {p['max']}, not {n}")
            time.sleep(0.002)
        res["data_s"] = time.monotonic() - t0
        h = Http(gw.port, ptoken)
        h.ok("POST", "/mq/produce", {"producer": REC_PRODUCER, "message": "after restart"})
        h.close()
        res["produce_after_restart_s"] = time.monotonic() - t0
        log(
            f"  restart: /healthz after {res['healthz_s']:.3f} s, all {n} messages visible "
            f"after {res['data_s']:.3f} s"
        )
        gw.stop()
        cmd = [str(VENV_PY), str(BENCH_DIR / "store_bench.py"), "open", "--data-dir", str(crash_copy)]
        log("  $ " + " ".join(cmd))
        o = run_json(cmd, timeout=120)
        res["open_s"] = o["open_s"]
        res["open_messages"] = o["messages"]
        res["open_bytes_cut"] = o["recovered_bytes_cut"]
        res["open_command"] = " ".join(cmd)
        if o["messages"].get(REC_TOPIC) != n:
            ctx.problems.append(
                f"recovery: in-process open of the crash copy saw {o['messages']} messages, expected {n}"
            )
        log(f"  in-process EmbeddedStore.open() on the crash copy: {o['open_s']:.3f} s")
        shutil.rmtree(crash_copy, ignore_errors=True)
    finally:
        gw.stop()
        res["gateway_command"] = " ".join(gw.cmd)
        ctx.results["recovery"] = res


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def machine(data_dir: Path) -> dict:
    return {**machine_info(data_dir, VENV_PY), "wrk": sh(["sh", "-c", "wrk -v 2>&1 | head -1"])}


def cpu_busy(seconds: float = 1.0) -> float:
    """Percent of all CPUs busy over `seconds` (other load on the box skews every figure)."""

    def sample() -> tuple[int, int]:
        vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = vals[3] + vals[4]
        return sum(vals), idle

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))


def fmt(x: float, unit: str = "") -> str:
    if x >= 100:
        s = f"{x:,.0f}"
    elif x >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.3g}"
    return s + unit


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "—"
    return f"{a / b:.2f}"


def target_cell(key: str, value: float | None, table: dict | None = None) -> str:
    t = (TARGETS if table is None else table).get(key)
    if t is None:
        return "—"
    text, bound, op = t
    if bound is None or value is None:
        return text
    met = value <= bound if op == "<=" else value >= bound
    return f"{text} {'✅' if met else '❌'}"


def redis_lines(ctx: Ctx) -> list[str]:
    """The Redis under test, for the header."""
    if REDIS is None:
        return []
    a = ctx.args
    conf = REDIS.config
    persistence = (
        f"appendonly {conf.get('appendonly', '?')}, appendfsync {conf.get('appendfsync', '?')}, "
        f"save '{conf.get('save', '?')}'"
    )
    if REDIS.own:
        where = (
            f"started by the harness on {REDIS.url} (data in the temp dir, stopped by PID at the "
            f"end): `{' '.join(shlex_quote(c) for c in REDIS.cmd)}`"
        )
    else:
        where = f"an existing Redis at {REDIS.url} (keys under this run's prefixes, deleted at the end)"
    out = [
        f"- redis: redis-server {REDIS.version}, {where}; {persistence}. "
        "The embedded store's figures in other sections are fsync=always (every produce and ack "
        "answered after fsync); here a produce is answered once Redis has it in memory and "
        + (
            "not on disk at all (no AOF: a Redis crash loses what the last snapshot lacks)"
            if conf.get("appendonly") != "yes"
            else "in the AOF, fsynced before Redis answers (appendfsync always)"
            if conf.get("appendfsync") == "always"
            else "the AOF is fsynced about once a second (a Redis crash may lose up to ~1 s of "
            "acknowledged writes)"
        ),
        f"- gateways: {a.workers} worker process(es) on one port (`--workers {a.workers}`), registry "
        f"SQLite in the data dir, MQGATE_REDIS_PREFIX `{ctx.gw_prefix}`",
        f"- CPU: the machine's {os.cpu_count()} cores are shared by wrk, the gateway workers and "
        "redis-server (and by the client processes of the baselines); each row's note splits the use",
    ]
    e = ctx.redis_end
    if e:
        out.append(
            "- redis after the load benchmarks and baselines (before benchmark 6): "
            f"{e.get('used_memory_human', '?')} used, {e.get('total_forks', '?')} fork(s) for "
            f"{e.get('aof_rewrites', '?')} automatic AOF rewrite(s)"
            + (
                f", AOF on disk {e['aof_bytes_now'] / 1e6:.0f} MB"
                if REDIS.own and e.get("aof_bytes_now")
                else ""
            )
        )
    return out


def shlex_quote(s: str) -> str:
    return s if s and re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\"'\"'") + "'"


def report(ctx: Ctx, cmdline: str, started: dt.datetime, failures: dict[str, str]) -> str:
    R = ctx.results
    m = machine(ctx.work)
    a = ctx.args
    redis = REDIS is not None
    lines = [
        f"## {started.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} — {'quick' if a.quick else 'full'} run"
        f"{', store redis, --workers ' + str(a.workers) if redis else ''}"
        f"{' (FAILURES)' if failures else ''}",
        "",
        f"- command: `{cmdline}`",
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, kernel {m['kernel']}, "
        f"data dir on {m['fs']}; load generator on the same machine, loopback; CPU busy before "
        f"the run {ctx.busy_before:.0f} % (load average {ctx.loadavg})",
        f"- software: Python {m['python']}; {m['wrk']}",
        f"- code: git {m['git']}, src/mqgate sha1 {m['src_sha1']} (uncommitted work tree)",
        f"- gateway: `{' '.join(ctx.gw.cmd) if ctx.gw and ctx.gw.cmd else '?'}` "
        f"(MQGATE_ADMIN_TOKEN set), store `{a.store}`",
        *redis_lines(ctx),
    ]
    if ctx.server:
        lines.append(
            f"- HTTP server detected in the gateway process: {ctx.server.get('server')}, "
            f"{ctx.server.get('workers')} worker(s), uvloop={ctx.server.get('uvloop')}, "
            f"httptools={ctx.server.get('httptools')}"
        )
    if ctx.preflight:
        lines.append(
            "- pre-flight protocol checks (envelope, 401/403 on data path, pull fields, release): "
            + ctx.preflight
        )
    lines.append(
        f"- durations: {ctx.duration:g} s per load run; topic `{TOPIC}` with 8 queues; "
        f"messages of {MSG_BYTES} bytes"
        + (
            f" (stored in Redis as a {ctx.record_bytes}-byte JSON record; baseline R writes the "
            f"{MSG_BYTES}-byte payload alone)"
            if ctx.record_bytes
            else ""
        )
    )
    if redis and a.workers != 2:
        lines.append("- the Redis targets are stated for `--workers 2`; shown here for comparison only")
    lines += ["", "| # | benchmark | figure | target | ratio |", "|---|---|---:|---|---|"]

    def row(num, name, figure, target="—", rat="—"):
        lines.append(f"| {num} | {name} | {figure} | {target} | {rat} |")

    base = R.get("baseline", {}).get("req_per_s")
    st = R.get("store", {})
    rp = R.get("redispy", {})
    store_name = "RedisStore" if redis else "store"

    def vs_redis(value: float, key: str, what: str) -> str:
        """'x.xx of baseline R <what> (goal ≥ 0.6 ✅)' or '' without baseline R."""
        ref = rp.get(key, {}).get("messages_per_s")
        if not ref:
            return ""
        return (
            f"**{ratio(value, ref)} of baseline R {what}** "
            f"(goal {target_cell('redis_ratio', value / ref, REDIS_TARGETS)}); "
        )

    def tgt(key: str, value: float) -> str:
        return target_cell(key, value, REDIS_TARGETS) if redis else "—"

    if "produce" in R:
        p = R["produce"]
        row(
            1,
            "produce, 1 msg/request, wrk -t2 -c64",
            fmt(p["msgs_per_s"], " msgs/s"),
            tgt("produce_msgs_s", p["msgs_per_s"]),
            vs_redis(p["msgs_per_s"], "xadd_single", "XADD")
            + f"{ratio(p['msgs_per_s'], base)} of baseline A; "
            f"{ratio(p['msgs_per_s'], st.get('append_single_conc', {}).get('messages_per_s'))} "
            f"of {store_name} single append (64 tasks)",
        )
        row(
            1,
            "produce latency p50 / p99",
            f"{p['lat_p50_us'] / 1000:.2f} ms / {p['lat_p99_us'] / 1000:.2f} ms",
            "—",
            cpu_note(p),
        )
    elif "produce" in failures:
        row(1, "produce", f"FAILED: {failures['produce']}")
    if "batch" in R:
        b = R["batch"]
        row(
            2,
            f"produce batch of {a.batch}, wrk -t2 -c{a.batch_conns}",
            fmt(b["msgs_per_s"], " msgs/s"),
            tgt("batch_msgs_s", b["msgs_per_s"]),
            vs_redis(b["msgs_per_s"], "xadd_batch", "XADD batches")
            + f"{ratio(b['msgs_per_s'], st.get('append_batch', {}).get('messages_per_s'))} "
            f"of {store_name} batched append",
        )
        row(
            2,
            "batch requests/s, p50 / p99",
            f"{fmt(b['ok_requests'] / b['seconds'])} req/s, "
            f"{b['lat_p50_us'] / 1000:.2f} ms / {b['lat_p99_us'] / 1000:.2f} ms",
            "—",
            cpu_note(b),
        )
    elif "batch" in failures:
        row(2, "produce batch", f"FAILED: {failures['batch']}")
    if "consume" in R:
        c = R["consume"]
        row(
            3,
            f"consume, pull max={a.pull_max} + ack via next requestId, wrk -t2 -c{a.consume_conns}",
            fmt(c["msgs_per_s"], " msgs/s acked"),
            tgt("consume_msgs_s", c["msgs_per_s"]),
            vs_redis(c["msgs_per_s"], "xrange", "XRANGE")
            + f"{ratio(c['msgs_per_s'], st.get('read_raw', st.get('read', {})).get('messages_per_s'))} "
            f"of {store_name} reads",
        )
        row(
            3,
            "consume check (progress)",
            f"lag {c['lag_before']:,} → {c['lag_after']:,} (−{c['lag_drop']:,}); delivered "
            f"{c['received']:,}; acks ok {c['acks_ok']:,} / failed {c['acks_bad']}; "
            f"{fmt(c['pulls_per_s'])} pulls/s over {c['window_s']:.1f} s",
            "—",
            cpu_note(c),
        )
    elif "consume" in failures:
        row(3, "consume", f"FAILED: {failures['consume']}")
    if "baseline" in R:
        b = R["baseline"]
        row(
            4,
            "baseline A: raw ASGI app, same server, same wrk as 1",
            fmt(b["req_per_s"], " req/s"),
            "—",
            f"gateway/baseline = {ratio(R.get('produce', {}).get('msgs_per_s'), b['req_per_s'])}",
        )
        row(
            4,
            "baseline A latency p50 / p99",
            f"{b['lat_p50_us'] / 1000:.2f} ms / {b['lat_p99_us'] / 1000:.2f} ms",
            "—",
            cpu_note(b),
        )
    elif "baseline" in failures:
        row(4, "baseline A", f"FAILED: {failures['baseline']}")
    if rp:

        def rp_note(ph: dict) -> str:
            return (
                f"CPU (100 % = 1 core): redis-server {ph['redis_cpu_pct']:.0f} %, "
                f"{rp['procs']} client process(es) {ph['client_cpu_pct']:.0f} %"
            )

        def gw_rate(name: str) -> float | None:
            return R.get(name, {}).get("msgs_per_s")

        xs, xb, xr = rp["xadd_single"], rp["xadd_batch"], rp["xrange"]
        who = f"redis-py, {rp['procs']} process(es)"
        row(
            "R",
            f"baseline R: XADD 1 msg/command, pipelined, {xs['in_flight']} in flight ({who})",
            fmt(xs["messages_per_s"], " msgs/s"),
            "—",
            f"gateway produce/baseline = {ratio(gw_rate('produce'), xs['messages_per_s'])}; {rp_note(xs)}",
        )
        row(
            "R",
            f"baseline R: {xb['batch']} XADDs in one pipeline, one stream ({who})",
            fmt(xb["messages_per_s"], " msgs/s"),
            "—",
            f"gateway batch/baseline = {ratio(gw_rate('batch'), xb['messages_per_s'])}; {rp_note(xb)}",
        )
        row(
            "R",
            f"baseline R: XRANGE COUNT {xr['read_max']}, {xr['in_flight']} in flight ({who})",
            fmt(xr["messages_per_s"], " msgs/s"),
            "—",
            f"gateway consume/baseline = {ratio(gw_rate('consume'), xr['messages_per_s'])}; {rp_note(xr)}",
        )
    elif "redispy" in failures:
        row("R", "baseline R", f"FAILED: {failures['redispy']}")
    if st:
        s1, s0, sb, rd = st["append_single_conc"], st["append_single_seq"], st["append_batch"], st["read"]
        if redis:
            label = f"baseline B: RedisStore in-process ({st.get('procs', 1)} process(es)), {st.get('fsync')}"
            single = f"{label}: append 1 msg, {s1['tasks']} tasks"
            seq = f"baseline B: RedisStore append 1 msg, {s0['tasks']} task(s) (1 per process)"
        else:
            single = "baseline B: store append 1 msg, 64 tasks, fsync always"
            seq = "baseline B: store append 1 msg, 1 task (fsync per append)"
        row(
            5,
            single,
            fmt(s1["messages_per_s"], " appends/s"),
            "—",
            f"gateway produce/store = {ratio(R.get('produce', {}).get('msgs_per_s'), s1['messages_per_s'])}",
        )
        store_cpu = f"store run CPU {st['store_cpu_pct']:.0f} %" + (
            f", redis-server {st['redis_cpu_pct']:.0f} %" if "redis_cpu_pct" in st else ""
        )
        row(
            5,
            seq,
            fmt(s0["messages_per_s"], " appends/s"),
            "—",
            f"p50 {s0['p50_ms']:.3f} ms; {store_cpu}, other processes {st['other_cpu_pct']:.0f} % of a core",
        )
        row(
            5,
            f"baseline B: {store_name} append batch of {sb['batch']}, {sb['tasks']} tasks",
            fmt(sb["messages_per_s"], " msgs/s"),
            "—",
            f"gateway batch/store = {ratio(R.get('batch', {}).get('msgs_per_s'), sb['messages_per_s'])}",
        )
        rr = st.get("read_raw")
        gw_read = rr or rd  # the gateway's pull uses read_raw when the store has it
        readers = f", {rd['tasks']} readers" if rd.get("tasks", 1) > 1 else ""
        row(
            5,
            f"baseline B: {store_name} read {rd['read_max']} msgs{readers}, decoded (`read`)",
            fmt(rd["messages_per_s"], " msgs/s"),
            "—",
            f"{fmt(rd['calls_per_s'])} reads/s"
            + (
                ""
                if rr
                else "; gateway consume/store = "
                f"{ratio(R.get('consume', {}).get('msgs_per_s'), rd['messages_per_s'])}"
            ),
        )
        if rr:
            row(
                5,
                f"baseline B: {store_name} read {rr['read_max']} msgs{readers}, raw bytes "
                "(`read_raw`, used by pulls)",
                fmt(rr["messages_per_s"], " msgs/s"),
                "—",
                "gateway consume/store = "
                f"{ratio(R.get('consume', {}).get('msgs_per_s'), gw_read['messages_per_s'])}"
                f"; {fmt(rr['calls_per_s'])} reads/s",
            )
    elif "store" in failures:
        row(5, "baseline B", f"FAILED: {failures['store']}")
    rec = R.get("recovery", {})
    if rec.get("redis") and "healthz_s" in rec:
        w = a.workers
        row(
            6,
            f"gateway restart: {rec['messages']:,}-msg queue in Redis, kill -9 of all {w} workers, "
            "process start → /healthz 200",
            f"{rec['healthz_s']:.3f} s",
            target_cell("recovery_healthz_s", rec["healthz_s"]),
            f"all {w} workers answer after {rec['all_workers_s']:.3f} s",
        )
        if "data_s" in rec:
            row(
                6,
                "gateway restart: process start → progress shows all messages",
                f"{rec['data_s']:.3f} s",
                target_cell("recovery_data_s", rec["data_s"]),
            )
        if "redis_ready_s" in rec:
            row(
                6,
                f"redis-server kill -9 and restart: start → PING (AOF of {rec['aof_bytes'] / 1e6:.0f} MB "
                "loaded)",
                f"{rec['redis_ready_s']:.3f} s",
                "—",
                "the gateway stays up meanwhile",
            )
        if "redis_data_s" in rec:
            row(
                6,
                "redis restart: start → gateway progress shows all messages",
                f"{rec['redis_data_s']:.3f} s",
                "—",
                f"first produce through the gateway after {rec['redis_produce_s']:.3f} s; no message lost",
            )
    elif "healthz_s" in rec:
        r = rec
        row(
            6,
            f"recovery: {r['messages']:,}-msg queue, kill -9, process start → /healthz 200",
            f"{r['healthz_s']:.3f} s",
            target_cell("recovery_healthz_s", r["healthz_s"]),
        )
        if "data_s" in r:
            row(
                6,
                "recovery: process start → progress shows all messages",
                f"{r['data_s']:.3f} s",
                target_cell("recovery_data_s", r["data_s"]),
            )
        if "open_s" in r:
            row(
                6,
                "recovery: EmbeddedStore.open() in-process on the crashed data dir",
                f"{r['open_s']:.3f} s",
                target_cell("recovery_open_s", r["open_s"]),
                f"{r['data_bytes'] / 1e6:.0f} MB on disk; {r['open_bytes_cut']} bytes cut",
            )
    if "recovery" in failures:
        row(6, "recovery", f"FAILED: {failures['recovery']}")
    lines.append("")
    if ctx.notes:
        lines.append("Notes:")
        lines += [f"- {n}" for n in ctx.notes]
        lines.append("")
    if failures or ctx.problems:
        lines.append("Problems seen:")
        lines += [f"- FAILED {k}: {v}" for k, v in failures.items()]
        lines += [f"- {p}" for p in ctx.problems]
        lines.append("")
    cmds = []
    for k in ("produce", "batch", "consume", "baseline"):
        if k in R:
            cmds.append(f"    {R[k]['command']}")
    if "baseline" in R:
        cmds.append(f"    # baseline A server: {R['baseline']['server_command']}")
    if rp:
        cmds.append(f"    {rp['command']}")
    if st:
        cmds.append(f"    {st['command']}")
    if "open_command" in rec:
        cmds.append(f"    {rec['open_command']}")
    if cmds:
        lines += ["Load commands (ports and paths are per run):", "", *cmds, ""]
    return "\n".join(lines) + "\n"


def append_results(section: str) -> None:
    header = (
        "# mqgate benchmark results\n\nOne section per run of `python benchmarks/run.py`, "
        "newest last. See benchmarks/README.md for what each figure means.\n\n"
    )
    existing = RESULTS.read_text() if RESULTS.exists() else header
    if not existing.endswith("\n\n"):
        existing = existing.rstrip("\n") + "\n\n"
    RESULTS.write_text(existing + section)


# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description="mqgate benchmark suite")
    ap.add_argument(
        "--store",
        default="embedded",
        help="embedded (default), redis (a redis-server of its own) or a redis:// URL (an existing Redis)",
    )
    ap.add_argument("--redis-url", help="with --store redis: use this existing Redis, do not start one")
    ap.add_argument(
        "--redis-fsync",
        choices=["always", "everysec"],
        default="everysec",
        help="appendfsync of the redis-server the harness starts (default everysec)",
    )
    ap.add_argument("--workers", type=int, help="gateway processes (default: 2 with Redis, 1 embedded)")
    ap.add_argument("--quick", action="store_true", help="short runs (3 s, smaller fills)")
    ap.add_argument("--only", default="", help=f"comma list out of {','.join(ALL)}")
    ap.add_argument("--duration", type=float, help="seconds per load run (default 10, quick 3)")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batch-conns", type=int, default=16)
    ap.add_argument(
        "--consume-conns",
        type=int,
        default=8,
        help="connections for consume (≤ queues, so no pull finds every queue locked)",
    )
    ap.add_argument("--pull-max", type=int, default=100)
    ap.add_argument("--prefill", type=int, help="backlog before consume (default 4,000,000; quick 800,000)")
    ap.add_argument(
        "--recovery-messages",
        type=int,
        help="messages in the recovery queue (default 1,000,000; quick 200,000)",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="wait up to this many seconds for the machine to be idle before starting",
    )
    ap.add_argument(
        "--idle-below", type=float, default=15.0, help="percent CPU busy counted as idle (default 15)"
    )
    ap.add_argument(
        "--trace", choices=("info", "error", "debug"), help="trace every message of the benchmark topic"
    )
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    if a.store.startswith("redis://"):
        a.store, a.redis_url = "redis", a.store
    if a.store not in ("embedded", "redis"):
        ap.error(f"--store must be embedded, redis or a redis:// URL, not {a.store!r}")
    if a.redis_url and (a.store != "redis" or not a.redis_url.startswith("redis://")):
        ap.error("--redis-url takes a redis:// URL and goes with --store redis")
    if a.store == "redis" and a.workers is None:
        a.workers = 2
    if a.store == "redis" and not a.redis_url and shutil.which("redis-server") is None:
        ap.error("redis-server is not installed (apt-get install -y redis-server), or give --redis-url")
    a.duration = a.duration or (3.0 if a.quick else 10.0)
    a.prefill = a.prefill or (800_000 if a.quick else 4_000_000)
    a.recovery_messages = a.recovery_messages or (200_000 if a.quick else 1_000_000)
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = set(only) - set(ALL)
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if a.store == "embedded" and set(only) & REDIS_ONLY:
        ap.error(f"{', '.join(sorted(set(only) & REDIS_ONLY))} needs --store redis")
    only = only or [b for b in ALL if a.store == "redis" or b not in REDIS_ONLY]
    if shutil.which("wrk") is None:
        ap.error("wrk is not installed (apt-get install -y wrk)")
    if not MQGATE.exists():
        ap.error(f"{MQGATE} not found (pip install -e . in the venv)")

    cmdline = "python benchmarks/run.py" + "".join(f" {x}" for x in sys.argv[1:])
    started = dt.datetime.now().astimezone()
    work = Path(tempfile.mkdtemp(prefix="mqgate-bench-"))
    ctx = Ctx(a, work, a.duration)
    failures: dict[str, str] = {}
    log(f"work dir {work}")
    # idle = three 2-second samples in a row below the threshold
    t_wait = time.monotonic()
    quiet = 0
    while True:
        ctx.busy_before = cpu_busy(2.0)
        quiet = quiet + 1 if ctx.busy_before <= a.idle_below else 0
        waited = time.monotonic() - t_wait
        if quiet >= 3 or waited >= a.wait_idle:
            break
        if quiet == 0:
            log(
                f"machine {ctx.busy_before:.0f} % busy; waiting for < {a.idle_below:.0f} % "
                f"({waited:.0f}/{a.wait_idle:.0f} s)"
            )
    ctx.loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    if ctx.busy_before > a.idle_below:
        log(f"warning: the machine is {ctx.busy_before:.0f} % busy before the run; figures will be low")
    global REDIS
    try:
        if a.store == "redis":
            if a.redis_url:
                REDIS = RedisServer(a.redis_url, own=False)
            else:
                REDIS = RedisServer.own_server(work, a.redis_fsync)
            try:
                t = REDIS.start()
            except (BenchFailure, OSError, RedisReplyError) as exc:
                for b in only:
                    failures[b] = f"redis setup: {exc}"
                only = []
            else:
                log(f"redis {REDIS.version} at {REDIS.url} ready in {t:.2f} s: {REDIS.config}")
            ctx.gw_prefix = "mqbench-" + secrets.token_hex(4)
            REDIS.prefixes.append(ctx.gw_prefix)
        needs_gateway = [b for b in only if b in ("produce", "batch", "consume", "baseline")]
        if needs_gateway:
            ctx.gw = Gateway(
                free_port(),
                work / "data",
                secrets.token_urlsafe(24),
                work / "gateway.log",
                REDIS.url if REDIS else a.store,
                workers=a.workers,
                redis_prefix=ctx.gw_prefix,
            )
            try:
                t = ctx.gw.start()
                log(f"gateway up on port {ctx.gw.port} in {t:.2f} s: {' '.join(ctx.gw.cmd)}")
                ctx.server = detect_server(ctx.gw)
                log(f"gateway HTTP server: {ctx.server}")
                ctx.ptoken, ctx.ctoken = register(ctx.gw, TOPIC, 8, PRODUCER, CONSUMER)
                if a.trace:
                    # Every message of the benchmark topic traced (SPEC P2): a project policy.
                    policy = {"mode": "project", "project": "default", "level": a.trace}
                    ctx.gw.admin.ok("POST", "/admin/trace-policies", policy)
                    log(f"  tracing every message at {a.trace}")
                await_registry(ctx.gw)
                preflight(ctx)
            except BenchFailure as exc:
                for b in needs_gateway:
                    failures[b] = f"gateway setup: {exc}"
            for name, fn in (("produce", bench_produce), ("batch", bench_batch), ("consume", bench_consume)):
                if name in only and name not in failures:
                    log(f"{name} ...")
                    try:
                        fn(ctx)
                    except BenchFailure as exc:
                        failures[name] = str(exc)
                        log(f"  FAILED: {exc}")
            if REDIS is not None:
                ctx.record_bytes = stored_record_bytes(ctx)
            if a.trace:
                trace_index_catch_up(ctx)
            if ctx.gw.proc is not None and ctx.gw.proc.poll() is not None:
                ctx.problems.append(
                    f"gateway exited during the run with {ctx.gw.proc.returncode}: "
                    f"{tail(ctx.gw.log_path, 10)}"
                )
            ctx.gw.stop()
            errs = [
                ln
                for ln in tail(ctx.gw.log_path, 2000).splitlines()
                if re.search(r"Traceback|ERROR|Exception", ln)
            ]
            if errs:
                ctx.problems.append(f"gateway log has {len(errs)} error lines, first: {errs[0][:300]}")
        for name, fn in (
            ("baseline", bench_baseline),
            ("redispy", bench_redispy),
            ("store", bench_store),
            ("recovery", bench_recovery),
        ):
            if name in only and name not in failures:
                log(f"{name} ...")
                if name == "recovery" and REDIS is not None and not ctx.redis_end:
                    with contextlib.suppress(OSError, RedisReplyError, ValueError):
                        ctx.redis_end = REDIS.stats()
                        ctx.redis_end["aof_bytes_now"] = REDIS.aof_bytes()
                try:
                    if name == "baseline" and not ctx.server:
                        raise BenchFailure("no gateway server detected")
                    fn(ctx)
                except BenchFailure as exc:
                    failures[name] = str(exc)
                    log(f"  FAILED: {exc}")
    finally:
        if REDIS is not None:
            if not ctx.redis_end:
                with contextlib.suppress(OSError, RedisReplyError, ValueError):
                    ctx.redis_end = REDIS.stats()
                    ctx.redis_end["aof_bytes_now"] = REDIS.aof_bytes()
            REDIS.stop()
        _cleanup()
        section = report(ctx, cmdline, started, failures)
        print()
        print(section)
        if not a.no_results:
            append_results(section)
            log(f"appended to {RESULTS}")
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
