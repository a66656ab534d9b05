"""Produce throughput of 1, 2 and 4 gateway processes on one Redis and on a 3-master cluster,
CPU per message, and the cost of the replica wait (`run.py cluster`; docs/CLUSTERS.md).

Every server is started here on free ports (tests/clusters.py) and stopped at the end: one
redis-server with one replica (so WAIT 1 can be met), and a 3-master + 3-replica cluster. Each
row: `mqgate serve --workers N` on that store, wrk with `--conns` connections posting one
message per /mq/produce for `--duration` seconds. CPU is read from /proc (gateway processes,
client) and from INFO cpu (every Redis node), in core-seconds per 1,000 messages. On a 2-core
machine the client, the gateways and Redis share 2 cores: the ceiling is the machine, not the
cluster; the per-core figures are what scale.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import procs, results, wrk
from .common import ROOT, fmt
from .redis import connection
from .servers import Gateway, register


def redis_cpu(ports: list[int]) -> float:
    total = 0.0
    for port in ports:
        with connection(f"redis://127.0.0.1:{port}/0") as c:
            info = c.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def run_row(
    store: str, workers: int, wait: int, redis_ports: list[int], args: Any, work: Path
) -> dict[str, Any]:
    env = {"MQGATE_REDIS_WAIT_REPLICAS": str(wait), "MQGATE_LOG_LEVEL": "warning"}
    gw = Gateway(Path(tempfile.mkdtemp(prefix="mqbench", dir=work)) / "data", store, workers=workers, env=env)
    gw.redis_prefix = f"bench{gw.port}"
    try:
        gw.start(30)
        token, _ = register(gw, "bench", 8, "bench-p")
        for i in range(200):  # warm up every worker process (connections, scripts loaded)
            gw.admin.ok("POST", "/mq/produce", {"producer": "bench-p", "message": f"w{i}"}, token=token)
        gw0, rd0, own0 = procs.tree_cpu_seconds(gw.pid), redis_cpu(redis_ports), procs.own_and_waited_cpu()
        started = time.monotonic()
        res = wrk.wrk(
            "produce.lua",
            gw.url + "/mq/produce",
            args.conns,
            args.duration,
            {"MQB_TOKEN": token, "MQB_PRODUCER": "bench-p"},
            latency=False,
        )
        seconds = time.monotonic() - started
        gw_cpu, rd = procs.tree_cpu_seconds(gw.pid) - gw0, redis_cpu(redis_ports) - rd0
        client_cpu = procs.own_and_waited_cpu() - own0
    finally:
        gw.stop()
    ok = res["ok_requests"]
    per_k = 1000 / max(ok, 1)
    return {
        "store": "cluster" if store.startswith("redis+cluster") else "single",
        "workers": workers,
        "wait_replicas": wait,
        "messages": ok,
        "failed": res["err_status"] + res["socket_errors"],
        "msg_per_s": round(ok / seconds),
        "gateway_cpu_s_per_1k": round(gw_cpu * per_k, 3),
        "redis_cpu_s_per_1k": round(rd * per_k, 3),
        "client_cpu_s_per_1k": round(client_cpu * per_k, 3),
    }


def main(args: argparse.Namespace) -> int:
    wrk.require()
    sys.path.insert(0, str(ROOT))
    from tests.clusters import Node, RedisClusterProcs, cluster_port

    work = Path(tempfile.mkdtemp(prefix="mqbench-redis"))
    taken: set[int] = set()
    pp, rp = cluster_port(taken), cluster_port(taken)
    base = ["--bind", "127.0.0.1", "--dir", ".", "--save", "", "--appendonly", "no"]
    primary = Node(work / "primary", pp, ["--port", str(pp), *base]).start()
    replica = Node(
        work / "replica", rp, ["--port", str(rp), *base, "--replicaof", "127.0.0.1", str(pp)]
    ).start()
    cluster = RedisClusterProcs(work / "cluster").start()
    pairs = []  # (one Redis, cluster) at each number of workers, then with the replica wait
    try:
        single, cports = f"redis://127.0.0.1:{pp}/0", [n.port for n in cluster.nodes]
        for workers, wait in [*((int(w), 0) for w in args.workers.split(",")), (2, 1)]:
            pairs.append(
                [
                    run_row(single, workers, wait, [pp, rp], args, work),
                    run_row(cluster.url, workers, wait, cports, args, work),
                ]
            )
        m = results.machine(work)
    finally:
        cluster.stop()
        replica.stop()
        primary.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for s, c in pairs:
        wait = ", redis_wait_replicas=1" if c["wait_replicas"] else ""
        for r in (s, c):
            cpu = (
                f"core-ms / msg: gateway {r['gateway_cpu_s_per_1k']:.3f}, Redis {r['redis_cpu_s_per_1k']:.3f}"
            )
            rows.append(
                results.Row(
                    f"cluster.w{c['workers']}{'.wait' if wait else ''}" if r is c else "",
                    f"produce through {r['workers']} gateway process(es) on "
                    + ("a 3+3 Redis Cluster" if r is c else "one Redis (+1 replica)")
                    + wait,
                    f"{fmt(r['msg_per_s'])} msgs/s",
                    f"one Redis, same run: {fmt(s['msg_per_s'])} msgs/s" if r is c else "—",
                    f"{c['msg_per_s'] / s['msg_per_s']:.2f}" if r is c else "—",
                    cpu,
                    f"wrk {r['client_cpu_s_per_1k']:.3f} core-ms / msg; {r['failed']} failed",
                )
            )
    results.record(args, "gateways on one Redis and on a 3+3 Redis Cluster", rows, m=m)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub,
        common,
        "cluster",
        __doc__,
        help="gateways on one Redis and on a 3+3 Redis Cluster (needs redis-server)",
    )
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--conns", type=int, default=32)
    p.add_argument("--workers", default="1,2,4")
    p.set_defaults(func=main)
