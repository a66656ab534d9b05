"""Produce throughput of 1, 2 and 4 gateway processes on one Redis and on a 3-master cluster,
CPU per message, and the cost of the replica wait (docs/CLUSTERS.md has the figures).

    PYTHONPATH=src:. .venv/bin/python benchmarks/cluster_bench.py --duration 4

Every server is started here on free ports (tests/clusters.py) and stopped at the end:
one redis-server with one replica (so WAIT 1 can be met), and a 3-master + 3-replica
cluster. Each row: `mqgate serve --workers N` on that store, wrk with `--conns`
HTTP/1.1 connections posting one message per /mq/produce for `--duration` seconds. CPU is read
from /proc (gateway processes, client) and from INFO cpu (every Redis node), in core-seconds
per 1,000 messages. On a 2-core machine the client, the gateways and Redis share 2 cores: the
ceiling is the machine, not the cluster; the per-core figures are what scale.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.clusters import Node, RedisClusterProcs, cluster_port
from tests.conftest import MQGATE, free_port, wait_until

ADMIN = "mqa_bench_admin"
TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """User + system seconds of `pid` and its children so far (those still running)."""
    total = 0.0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
        except OSError:
            pass
    return total


def redis_cpu(ports: list[int]) -> float:
    total = 0.0
    for port in ports:
        with redis.Redis(port=port) as r:
            info = r.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


LUA_DIR = Path(__file__).resolve().parent / "lua"


def client_main(url: str, token: str, conns: int, duration: float) -> tuple[int, int, float]:
    """wrk posting one message per /mq/produce on `conns` connections (2 threads): (ok, failed,
    the client's CPU seconds)."""
    env = {**os.environ, "MQB_LUA_DIR": str(LUA_DIR), "MQB_TOKEN": token, "MQB_PRODUCER": "bench-p"}
    cmd = ["wrk", "-t2", f"-c{conns}", f"-d{max(1, round(duration))}s", "--timeout", "10s"]
    before = os.times()
    done = subprocess.run(
        [*cmd, "-s", str(LUA_DIR / "produce.lua"), url + "/mq/produce"],
        env=env, capture_output=True, text=True, timeout=duration + 60, check=True,
    )  # fmt: skip
    after = os.times()
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MQBENCH "))
    res = json.loads(line[len("MQBENCH ") :])
    failed = res["err_status"] + res["err_connect"] + res["err_read"] + res["err_write"] + res["err_timeout"]
    cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return res["requests"] - res["err_status"], failed, cpu


def run_row(store: str, workers: int, wait: int, redis_ports: list[int], args: Any) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="mqbench"))
    port = free_port()
    env = {
        **os.environ,
        "MQGATE_ADMIN_TOKEN": ADMIN,
        "MQGATE_REDIS_PREFIX": f"bench{port}",
        "MQGATE_REDIS_WAIT_REPLICAS": str(wait),
        "MQGATE_LOG_LEVEL": "warning",
    }
    cmd = [MQGATE, "serve", "--port", str(port), "--data-dir", str(data), "--store", store]
    proc = subprocess.Popen([*cmd, "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, "the gateway")
        h = {"Authorization": f"Bearer {ADMIN}"}
        httpx.post(url + "/admin/topics", json={"name": "bench", "queues": 8}, headers=h).raise_for_status()
        r = httpx.post(url + "/admin/producers", json={"name": "bench-p", "topic": "bench"}, headers=h)
        token = r.json()["result"]["token"]
        # Warm up every worker process (connections, scripts loaded).
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            for i in range(200):
                c.post("/mq/produce", json={"producer": "bench-p", "message": f"w{i}"})
        gw0, rd0 = proc_cpu(proc.pid), redis_cpu(redis_ports)
        started = time.monotonic()
        ok, failed, client_cpu = client_main(url, token, args.conns, args.duration)
        seconds = time.monotonic() - started
        gw, rd = proc_cpu(proc.pid) - gw0, redis_cpu(redis_ports) - rd0
    finally:
        proc.terminate()
        proc.wait(20)
    per_k = 1000 / max(ok, 1)
    return {
        "store": "cluster" if store.startswith("redis+cluster") else "single",
        "workers": workers,
        "wait_replicas": wait,
        "messages": ok,
        "failed": failed,
        "msg_per_s": round(ok / seconds),
        "gateway_cpu_s_per_1k": round(gw * per_k, 3),
        "redis_cpu_s_per_1k": round(rd * per_k, 3),
        "client_cpu_s_per_1k": round(client_cpu * per_k, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--conns", type=int, default=32)
    p.add_argument("--workers", default="1,2,4")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mqbench-redis"))
    taken: set[int] = set()
    pp, rp = cluster_port(taken), cluster_port(taken)
    base = ["--bind", "127.0.0.1", "--dir", ".", "--save", "", "--appendonly", "no"]
    primary = Node(root / "primary", pp, ["--port", str(pp), *base]).start()
    replica = Node(
        root / "replica", rp, ["--port", str(rp), *base, "--replicaof", "127.0.0.1", str(pp)]
    ).start()
    cluster = RedisClusterProcs(root / "cluster").start()
    rows = []
    try:
        single = f"redis://127.0.0.1:{pp}/0"
        cports = [n.port for n in cluster.nodes]
        for workers in (int(w) for w in args.workers.split(",")):
            rows.append(run_row(single, workers, 0, [pp, rp], args))
            rows.append(run_row(cluster.url, workers, 0, cports, args))
        rows.append(run_row(single, 2, 1, [pp, rp], args))
        rows.append(run_row(cluster.url, 2, 1, cports, args))
    finally:
        cluster.stop()
        replica.stop()
        primary.stop()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
