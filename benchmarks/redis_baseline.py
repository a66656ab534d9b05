"""Baseline R, the Redis ceiling: plain redis-py against the Redis the gateway uses, no gateway.

Run by benchmarks/run.py (`--store redis`) in its own process tree, or by hand:

    .venv/bin/python benchmarks/redis_baseline.py --url redis://127.0.0.1:6379/0 --duration 5

`--procs` client processes (default 2, like `mqgate serve --workers 2`) run each phase at once,
started together by a barrier; each uses the synchronous redis-py client (hiredis parser when
installed) on one connection, `transaction=False` pipelines. Phases:

- xadd_single: XADD of one message per command, `--conns` commands in flight over all processes
  (each process pipelines `conns / procs` XADDs per round trip; wrk's produce has 64 connections);
- xadd_batch: XADD of `--batch` messages in one pipeline, all to one stream (as one batch
  produce goes to one queue); one pipeline in flight per process;
- xrange: XRANGE of `--read-max` entries per command, `--read-conns` streams read in one pipeline
  over all processes, walking each stream forward (and round again at its end) over what the
  XADD phases wrote.

Entries look like the gateway's (`t` = timestamp ms, `d` = payload) with a `--payload-bytes`
payload, round-robin over `--queues` streams under `<prefix>:{b}:q:<n>`. Prints one JSON object:
per phase messages, seconds, messages/s, and the CPU used over the phase by Redis (INFO cpu, so
its AOF fsync thread too) and by the client processes (100 % = one core). The streams are deleted
at the end (only this run's keys: `--prefix` defaults to a random one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import sys
import time
from typing import Any

import redis

PHASES = ("xadd_single", "xadd_batch", "xrange")


def _redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _xadd_single(r: redis.Redis, streams: list[str], a: argparse.Namespace, i: int, deadline: float) -> int:
    payload = b"x" * a.payload_bytes
    depth = max(1, -(-a.conns // a.procs))
    q = i % len(streams)
    n = 0
    while time.perf_counter() < deadline:
        pipe = r.pipeline(transaction=False)
        ts = int(time.time() * 1000)
        for _ in range(depth):
            pipe.xadd(streams[q], {"t": ts, "d": payload})
            q = (q + 1) % len(streams)
        pipe.execute()
        n += depth
    return n


def _xadd_batch(r: redis.Redis, streams: list[str], a: argparse.Namespace, i: int, deadline: float) -> int:
    payload = b"x" * a.payload_bytes
    q = i % len(streams)
    n = 0
    while time.perf_counter() < deadline:
        pipe = r.pipeline(transaction=False)
        ts = int(time.time() * 1000)
        for _ in range(a.batch):
            pipe.xadd(streams[q], {"t": ts, "d": payload})
        pipe.execute()
        n += a.batch
        q = (q + 1) % len(streams)
    return n


def _xrange(r: redis.Redis, streams: list[str], a: argparse.Namespace, i: int, deadline: float) -> int:
    depth = max(1, -(-a.read_conns // a.procs))
    mine = [streams[(i * depth + k) % len(streams)] for k in range(depth)]
    after: dict[str, str] = {s: "-" for s in mine}
    n = 0
    while time.perf_counter() < deadline:
        pipe = r.pipeline(transaction=False)
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
    return n


_RUNNERS = {"xadd_single": _xadd_single, "xadd_batch": _xadd_batch, "xrange": _xrange}


def _client(a: argparse.Namespace, i: int, streams: list[str], barrier: Any, out: Any) -> None:
    r = redis.Redis.from_url(a.url)
    r.ping()
    for phase in PHASES:
        barrier.wait()
        c0, t0 = _own_cpu(), time.perf_counter()
        n = _RUNNERS[phase](r, streams, a, i, t0 + a.duration)
        out.put((phase, i, n, time.perf_counter() - t0, _own_cpu() - c0))
    r.close()


def run(a: argparse.Namespace) -> dict[str, Any]:
    streams = [f"{a.prefix}:{{b}}:q:{q}" for q in range(a.queues)]
    ctl = redis.Redis.from_url(a.url)
    if ctl.exists(*streams):
        raise SystemExit(f"keys under prefix {a.prefix!r} exist already; pick another --prefix")
    ctx = mp.get_context("spawn")  # a fresh interpreter per client: no state shared by fork
    barrier = ctx.Barrier(a.procs + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(a, i, streams, barrier, out)) for i in range(a.procs)]
    for p in procs:
        p.start()
    result: dict[str, Any] = {
        "procs": a.procs,
        "payload_bytes": a.payload_bytes,
        "client": f"redis-py {redis.__version__} sync, pipelined"
        + (", hiredis" if redis.utils.HIREDIS_AVAILABLE else ""),
        "prefix": a.prefix,
    }
    try:
        for phase in PHASES:
            r0 = _redis_cpu(ctl)
            barrier.wait()
            rows = [out.get(timeout=a.duration + 120) for _ in procs]
            r1 = _redis_cpu(ctl)
            seconds = max(row[3] for row in rows)
            msgs = sum(row[2] for row in rows)
            result[phase] = {
                "messages": msgs,
                "seconds": round(seconds, 3),
                "messages_per_s": round(msgs / seconds, 1),
                "redis_cpu_pct": round(100 * (r1 - r0) / seconds, 1),
                "client_cpu_pct": round(100 * sum(row[4] for row in rows) / seconds, 1),
            }
        result["xadd_single"]["in_flight"] = max(1, -(-a.conns // a.procs)) * a.procs
        result["xadd_batch"]["batch"] = a.batch
        result["xrange"]["read_max"] = a.read_max
        result["xrange"]["in_flight"] = max(1, -(-a.read_conns // a.procs)) * a.procs
        result["stream_entries"] = sum(ctl.xlen(s) for s in streams)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        ctl.unlink(*streams)
        ctl.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="redis://host:port/db")
    ap.add_argument("--prefix", default="", help="key prefix (default: random mqbase-...)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--conns", type=int, default=64, help="single XADDs in flight, all processes")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--read-max", type=int, default=100)
    ap.add_argument("--read-conns", type=int, default=8, help="XRANGEs in flight, all processes")
    ap.add_argument("--payload-bytes", type=int, default=100)
    a = ap.parse_args()
    a.prefix = a.prefix or "mqbase-" + secrets.token_hex(4)
    json.dump(run(a), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
