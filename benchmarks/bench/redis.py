"""Redis for the benchmarks: a minimal RESP2 client (standard library) for the harness's few
calls, the redis-server under test (started, restarted and stopped by PID here, or an existing
one named by URL, of which only this run's keys are touched), and baseline R, the Redis
ceiling: plain redis-py against the same Redis, no gateway (`run.py redis-baseline`).

Baseline R: `--procs` client processes (like `mqgate serve --workers N`) run each phase at
once, started together by a barrier; each uses the synchronous redis-py client (hiredis parser
when installed) on one connection, `transaction=False` pipelines. Phases:
- xadd_single: XADD of one message per command, `--conns` commands in flight over all processes
  (each process pipelines `conns / procs` XADDs per round trip; wrk's produce has 64 connections);
- xadd_batch: XADD of `--batch` messages in one pipeline, all to one stream (as one batch
  produce goes to one queue); one pipeline in flight per process;
- xrange: XRANGE of `--read-max` entries per command, `--read-conns` streams read in one pipeline
  over all processes, walking each stream forward (and round again at its end) over what the
  XADD phases wrote.
Entries look like the gateway's (`t` = timestamp ms, `d` = payload) with a `--payload-bytes`
payload, round-robin over `--queues` streams under `<prefix>:{b}:q:<n>`; per phase messages/s
and the CPU used by Redis (INFO cpu) and the clients (100 % = one core). Only this run's streams
are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procs, results
from .common import HOST, BenchFailure, fmt, free_port, tail


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

    def call(self, *args: Any) -> Any:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))
        return self._read()

    def _read(self) -> Any:
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
        if kind in (b"$", b"*"):
            n = int(rest)
            if n < 0:
                return None
            return self.rfile.read(n + 2)[:-2] if kind == b"$" else [self._read() for _ in range(n)]
        raise ConnectionError(f"unexpected redis reply {line[:100]!r}")

    def info(self, section: str = "") -> dict[str, str]:
        raw = self.call("INFO", section) if section else self.call("INFO")
        return dict(
            ln.split(":", 1)
            for ln in raw.decode(errors="replace").splitlines()
            if ":" in ln and not ln.startswith("#")
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()
            self.sock.close()


@contextlib.contextmanager
def connection(url: str, timeout: float = 30.0) -> Any:
    c = Resp(url, timeout)
    try:
        yield c
    finally:
        c.close()


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
            "--bind",
            HOST,
            "--port",
            str(port),
            "--dir",
            str(d),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            fsync,
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(srv.log_path),
        ]
        return srv

    def start(self, timeout: float = 120.0) -> float:
        """Start our own server (or check an existing one); seconds until PING answers (an
        AOF being loaded answers LOADING until it is done)."""
        t0 = time.monotonic()
        if self.own:
            self.proc = procs.start(self.cmd, self.log_path)
        t1 = self.wait_ready(timeout)
        with connection(self.url) as c:
            self.version = c.info("server").get("redis_version", "?")
            conf = c.call("CONFIG", "GET", "append*") + c.call("CONFIG", "GET", "save")
            self.config = {conf[i].decode(): conf[i + 1].decode() for i in range(0, len(conf), 2)}
        return t1 - t0

    def wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchFailure(f"redis-server exited with {self.proc.returncode}: {tail(self.log_path)}")
            try:
                with connection(self.url, timeout=2) as c:
                    if c.call("PING") == "PONG":
                        return time.monotonic()
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
            return procs.tree_cpu_seconds(self.pid)
        i = self.stats("cpu")
        return sum(float(i.get(k, 0)) for k in ("used_cpu_sys", "used_cpu_user"))

    def local(self) -> bool:
        """Whether its CPU time is spent on this machine (then it is not "other processes")."""
        return self.own or urllib.parse.urlparse(self.url).hostname in (HOST, "localhost", "::1")

    def stats(self, section: str = "") -> dict:
        with connection(self.url) as c:
            return c.info(section)

    def kill9(self) -> None:
        assert self.proc is not None
        procs.kill9(self.proc)

    def delete_prefix(self, prefix: str) -> int:
        """UNLINK every key under `prefix:` (SCAN; never FLUSHDB: the Redis may be shared)."""
        n = 0
        with connection(self.url, timeout=120) as c:
            cursor = b"0"
            while True:
                cursor, keys = c.call("SCAN", cursor, "MATCH", f"{prefix}:*", "COUNT", 1000)
                if keys:
                    n += c.call("UNLINK", *keys)
                if cursor == b"0":
                    return n

    def rewrite_aof(self, timeout: float = 300.0) -> None:
        """BGREWRITEAOF and wait for it: the next load replays only what is left."""
        with connection(self.url) as c:
            with contextlib.suppress(RedisReplyError):  # "already in progress" is fine
                c.call("BGREWRITEAOF")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                i = c.info("persistence")
                if i.get("aof_rewrite_in_progress") == "0" and i.get("aof_rewrite_scheduled") == "0":
                    return
                time.sleep(0.1)
        raise BenchFailure(f"AOF rewrite did not finish within {timeout} s")

    def aof_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.dir.rglob("*") if f.is_file()) if self.dir else 0

    def stop(self) -> None:
        if self.proc is not None:
            procs.kill_tree(self.proc, signal.SIGTERM, timeout=30)
        elif not self.own:
            for prefix in self.prefixes:
                with contextlib.suppress(OSError, RedisReplyError):
                    self.delete_prefix(prefix)


# --- baseline R ----------------------------------------------------------------------------------

PHASES = ("xadd_single", "xadd_batch", "xrange")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _phase(r: Any, phase: str, streams: list[str], a: Any, i: int, deadline: float) -> int:
    """One client's messages of one phase."""
    payload = b"x" * a.payload_bytes
    n, q = 0, i % len(streams)
    if phase == "xrange":
        depth = max(1, -(-a.read_conns // a.procs))
        mine = [streams[(i * depth + k) % len(streams)] for k in range(depth)]
        after = dict.fromkeys(mine, "-")
    while time.perf_counter() < deadline:
        pipe = r.pipeline(transaction=False)
        ts = int(time.time() * 1000)
        if phase == "xrange":
            for s in mine:
                pipe.xrange(s, after[s], "+", count=a.read_max)
            for s, got in zip(mine, pipe.execute(), strict=True):
                if not got:
                    if after[s] == "-":
                        raise SystemExit(f"xrange: stream {s} is empty")
                    after[s] = "-"  # end of the stream: read it again from the start
                    continue
                n += len(got)
                last = got[-1][0]
                after[s] = "(" + (last.decode() if isinstance(last, bytes) else last)
            continue
        batch = a.batch if phase == "xadd_batch" else max(1, -(-a.conns // a.procs))
        for _ in range(batch):
            pipe.xadd(streams[q], {"t": ts, "d": payload})
            q = (q + 1) % len(streams) if phase == "xadd_single" else q
        pipe.execute()
        n += batch
        q = (q + 1) % len(streams) if phase == "xadd_batch" else q
    return n


def _client(a: Any, i: int, streams: list[str], barrier: Any, out: Any) -> None:
    import redis

    r = redis.Redis.from_url(a.url)
    r.ping()
    for phase in PHASES:
        barrier.wait()
        c0, t0 = _own_cpu(), time.perf_counter()
        n = _phase(r, phase, streams, a, i, t0 + a.duration)
        out.put((phase, i, n, time.perf_counter() - t0, _own_cpu() - c0))
    r.close()


def baseline(a: argparse.Namespace) -> dict[str, Any]:
    import redis

    a.prefix = a.prefix or "mqbase-" + secrets.token_hex(4)
    streams = [f"{a.prefix}:{{b}}:q:{q}" for q in range(a.queues)]
    ctl = redis.Redis.from_url(a.url)
    if ctl.exists(*streams):
        raise SystemExit(f"keys under prefix {a.prefix!r} exist already; pick another --prefix")
    ctx = mp.get_context("spawn")  # a fresh interpreter per client: no state shared by fork
    barrier, out = ctx.Barrier(a.procs + 1), ctx.Queue()
    clients = [ctx.Process(target=_client, args=(a, i, streams, barrier, out)) for i in range(a.procs)]
    for p in clients:
        p.start()
    hiredis = ", hiredis" if redis.utils.HIREDIS_AVAILABLE else ""
    result: dict[str, Any] = {
        "procs": a.procs,
        "payload_bytes": a.payload_bytes,
        "prefix": a.prefix,
        "client": f"redis-py {redis.__version__} sync, pipelined{hiredis}",
    }

    def redis_cpu() -> float:
        info = ctl.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    try:
        for phase in PHASES:
            r0 = redis_cpu()
            barrier.wait()
            rows = [out.get(timeout=a.duration + 120) for _ in clients]
            seconds, msgs = max(row[3] for row in rows), sum(row[2] for row in rows)
            result[phase] = {
                "messages": msgs,
                "seconds": round(seconds, 3),
                "messages_per_s": round(msgs / seconds, 1),
                "redis_cpu_pct": round(100 * (redis_cpu() - r0) / seconds, 1),
                "client_cpu_pct": round(100 * sum(row[4] for row in rows) / seconds, 1),
            }
        result["xadd_single"]["in_flight"] = max(1, -(-a.conns // a.procs)) * a.procs
        result["xadd_batch"]["batch"] = a.batch
        result["xrange"]["read_max"] = a.read_max
        result["xrange"]["in_flight"] = max(1, -(-a.read_conns // a.procs)) * a.procs
        result["stream_entries"] = sum(ctl.xlen(s) for s in streams)
    finally:
        for p in clients:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        ctl.unlink(*streams)
        ctl.close()
    return result


def baseline_rows(r: dict, gateway: dict | None = None) -> list[tuple[str, str, str, dict, str]]:
    """(id, what, figure, phase, gateway figure it bounds) of baseline R's phases."""
    who = f"redis-py, {r['procs']} process(es)"
    xs, xb, xr = r["xadd_single"], r["xadd_batch"], r["xrange"]
    return [
        (
            "xadd",
            f"baseline R: XADD 1 msg/command, pipelined, {xs['in_flight']} in flight ({who})",
            fmt(xs["messages_per_s"], " msgs/s"),
            xs,
            "produce",
        ),
        (
            "xadd-batch",
            f"baseline R: {xb['batch']} XADDs in one pipeline, one stream ({who})",
            fmt(xb["messages_per_s"], " msgs/s"),
            xb,
            "batch",
        ),
        (
            "xrange",
            f"baseline R: XRANGE COUNT {xr['read_max']}, {xr['in_flight']} in flight ({who})",
            fmt(xr["messages_per_s"], " msgs/s"),
            xr,
            "consume",
        ),
    ]


def phase_note(r: dict, ph: dict) -> str:
    clients = f"{r['procs']} client process(es) {ph['client_cpu_pct']:.0f} %"
    return f"CPU (100 % = 1 core): redis-server {ph['redis_cpu_pct']:.0f} %, {clients}"


def main(args: argparse.Namespace) -> int:
    r = baseline(args)
    if args.json:
        print(json.dumps(r))
        return 0
    rows = [
        results.Row(f"redis-baseline.{k}", what, figure, more=phase_note(r, ph))
        for k, what, figure, ph, _ in baseline_rows(r)
    ]
    results.record(
        args,
        "baseline R: redis-py against Redis, no gateway",
        rows,
        [f"- Redis at {args.url}; {r['client']}"],
    )
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub,
        common,
        "redis-baseline",
        __doc__,
        help="baseline R: plain redis-py against a Redis (the Redis ceiling)",
    )
    p.add_argument("--url", required=True, help="redis://host:port/db")
    p.add_argument("--prefix", default="", help="key prefix (default: random mqbase-...)")
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--conns", type=int, default=64, help="single XADDs in flight, all processes")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--read-max", type=int, default=100)
    p.add_argument("--read-conns", type=int, default=8, help="XRANGEs in flight, all processes")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument(
        "--json", action="store_true", help="print the raw figures as one JSON line (records nothing)"
    )
    p.set_defaults(func=main)
