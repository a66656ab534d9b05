"""Load generation with wrk (the Lua scripts in benchmarks/lua print one `MQBENCH {json}`
line) and the CPU accounting of a load run."""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from . import procs
from .common import LUA_DIR, BenchFailure, log


def require() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")


def wrk(
    script: str, url: str, conns: int, duration: float, env: dict, threads: int = 2, latency: bool = True
) -> dict:
    """One wrk run of `script` against `url`: its MQBENCH figures, plus `command`, `seconds`,
    `ok_requests` (2xx) and `socket_errors`."""
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(duration))}s", "--timeout", "10s"]
    cmd += ["--latency"] if latency else []
    cmd += ["-s", str(LUA_DIR / script), url]
    log("  $ " + " ".join(cmd))
    out = procs.run_output(cmd, duration + 60, dict(os.environ, MQB_LUA_DIR=str(LUA_DIR), **env))
    line = next((ln for ln in out.splitlines() if ln.startswith("MQBENCH ")), None)
    if line is None:
        raise BenchFailure(f"wrk printed no MQBENCH line: {out[-800:]}")
    res = json.loads(line[len("MQBENCH ") :])
    res["command"] = " ".join(cmd)
    res["seconds"] = res["duration_us"] / 1e6
    res["ok_requests"] = res["requests"] - res["err_status"]
    res["socket_errors"] = sum(res[k] for k in ("err_connect", "err_read", "err_write", "err_timeout"))
    return res


def measured(server_pid: int, *args: Any, redis: Any = None, **kwargs: Any) -> dict:
    """`wrk`, plus the CPU used over the run (100 % = one core busy): the server's process
    tree, the Redis under test if any (a RedisServer), wrk (+ this harness), kernel softirq
    and everything else on the machine ("other", which should be ~0)."""
    meter = CpuMeter(server_pid, redis)
    res = wrk(*args, **kwargs)
    meter.finish(res)
    return res


class CpuMeter:
    """CPU use over a stretch of time; `finish` adds `*_cpu_pct` figures to a result."""

    def __init__(self, server_pid: int | None = None, redis: Any = None) -> None:
        self.pid, self.redis = server_pid, redis
        self.server0 = procs.tree_cpu_seconds(server_pid) if server_pid else 0.0
        self.sys0, self.own0, self.t0 = (
            procs.system_busy_seconds(),
            procs.own_and_waited_cpu(),
            time.monotonic(),
        )
        self.redis0 = redis.cpu_seconds() if redis else 0.0
        self.forks0 = int(redis.stats().get("total_forks", 0)) if redis else 0

    def finish(self, res: dict, own_key: str = "wrk_cpu_pct") -> dict:
        wall = time.monotonic() - self.t0
        server = procs.tree_cpu_seconds(self.pid) - self.server0 if self.pid else 0.0
        own = procs.own_and_waited_cpu() - self.own0
        sys1 = procs.system_busy_seconds()
        redis = 0.0
        if self.redis:
            used = self.redis.cpu_seconds() - self.redis0
            res["redis_cpu_pct"] = 100.0 * used / wall
            res["redis_forks"] = int(self.redis.stats().get("total_forks", 0)) - self.forks0
            redis = used if self.redis.local() else 0.0
        res["cpu_wall_s"] = wall
        if self.pid:
            res["server_cpu_pct"] = 100.0 * server / wall
        res[own_key] = 100.0 * own / wall
        res["softirq_cpu_pct"] = 100.0 * (sys1[1] - self.sys0[1]) / wall
        res["other_cpu_pct"] = max(0.0, 100.0 * ((sys1[0] - self.sys0[0]) - server - own - redis) / wall)
        return res


def check_errors(res: dict, what: str, max_fraction: float = 0.001) -> list[str]:
    """Fail on no requests or too many non-2xx answers; name the smaller problems."""
    if res["requests"] == 0:
        raise BenchFailure(f"{what}: wrk completed no request at all")
    if res["err_status"] > max_fraction * res["requests"]:
        raise BenchFailure(f"{what}: {res['err_status']} of {res['requests']} answers were not 2xx")
    problems = [f"{what}: {res['err_status']} non-2xx answers"] if res["err_status"] else []
    if res["socket_errors"]:
        problems.append(
            f"{what}: socket errors connect={res['err_connect']} read={res['err_read']} "
            f"write={res['err_write']} timeout={res['err_timeout']}"
        )
    return problems


def other_load(what: str, res: dict) -> list[str]:
    """A figure depressed by other work on the machine (on 2 cores it shows directly)."""
    if res.get("other_cpu_pct", 0) <= 15:
        return []
    return [
        f"{what}: other processes used {res['other_cpu_pct']:.0f} % of a core during the run; its figure "
        f"is depressed"
    ]


def server_cpu_per_request(res: dict) -> float:
    """The server's CPU (its whole process tree) per answered request, in µs: steadier than
    throughput when the load generator shares the cores."""
    return res["server_cpu_pct"] / 100 * res["cpu_wall_s"] / max(1, res["ok_requests"]) * 1e6


def cpu_note(res: dict, per_request: bool = False) -> str:
    def each(pct: float) -> str:
        """CPU time per HTTP request, when the run says how many there were."""
        if not per_request or not res.get("requests") or not res.get("cpu_wall_s"):
            return ""
        return f" ({pct / 100 * res['cpu_wall_s'] / res['requests'] * 1e6:.0f} µs/request)"

    redis = ""
    if res.get("redis_cpu_pct", 0) >= 1:
        redis = f"redis-server {res['redis_cpu_pct']:.0f} %{each(res['redis_cpu_pct'])}, "
        if res.get("redis_forks"):
            redis += f"({res['redis_forks']} AOF rewrite fork(s) during the run), "
    return (
        f"CPU (100 % = 1 core): server {res['server_cpu_pct']:.0f} %{each(res['server_cpu_pct'])}, {redis}"
        f"wrk {res['wrk_cpu_pct']:.0f} %, kernel softirq {res['softirq_cpu_pct']:.0f} %, "
        f"other processes {res['other_cpu_pct']:.0f} %"
    )
