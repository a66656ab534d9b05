"""What tracing every message costs a produce (issue 11: traced >= 0.85 of untraced), measured
so that the machine's own drift cancels out: one gateway, one topic, and short wrk runs that
alternate untraced and traced (the trace policy added and deleted between them, in A B B A
order), single produces and batches of 100. Each pair gives a ratio; the figure is the median
over the pairs, beside the pooled ratio (all traced messages over all untraced) and the
gateway's CPU per request (its whole process tree, the trace index writer included).

    PYTHONPATH=src .venv/bin/python benchmarks/trace_cost.py [--pairs 4] [--seconds 6]
        [--level info] [--kinds produce,batch] [--connections N] [--results]

--connections: wrk's connections for every kind instead of 64 (single) and 16 (batches): the
figure at another concurrency (with more connections a group-commit round carries more
requests, and the part of tracing's cost paid per round weighs less).
--results appends the table to benchmarks/RESULTS.md with the machine, command, commit, date.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


def _bench() -> ModuleType:
    """benchmarks/run.py, for its gateway, wrk and CPU helpers."""
    sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location("mqbench_run", BENCH_DIR / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run = _bench()
LOADS = {
    # kind: (wrk script, path, connections, messages per request)
    "produce": ("produce.lua", "/mq/produce", 64, 1),
    "batch": ("produce_batch.lua", "/mq/produce/batch", 16, 100),
}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of `pid` and the processes under it, main thread and the others of
    each apart: where a traced request's extra CPU goes."""
    out: dict[str, float] = {}
    for p in [pid, *run.descendants(pid)]:
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            # Python threads keep the process's name: the main thread is the one whose id is
            # the process's (the event loop), the others are the fsync and worker threads.
            where = "gateway" if p == pid else "child"
            key = f"{where} {'main thread' if task.name == str(p) else 'other threads'}"
            out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def measure(gw: Any, token: str, kind: str, seconds: float, conns: int) -> dict[str, float]:
    script, path, _, per_request = LOADS[kind]
    env = {"MQB_TOKEN": token, "MQB_PRODUCER": run.PRODUCER, "MQB_MSG_BYTES": str(run.MSG_BYTES)}
    if per_request > 1:
        env["MQB_BATCH"] = str(per_request)
    before = thread_cpu(gw.proc.pid)
    res = run.wrk_measured(gw.proc.pid, script, f"http://{run.HOST}:{gw.port}{path}", 2, conns, seconds, env)
    after = thread_cpu(gw.proc.pid)
    problems = run.check_wrk_errors(res, kind)
    if problems:
        raise run.BenchFailure("; ".join(problems))
    cpu_s = res["server_cpu_pct"] / 100 * res["cpu_wall_s"]
    requests = max(1, res["ok_requests"])
    per_thread = {k: (after[k] - before.get(k, 0.0)) / requests * 1e6 for k in after}
    return {
        "msgs_per_s": res["ok_requests"] * per_request / res["seconds"],
        "cpu_us": cpu_s / requests * 1e6,
        "p99_ms": res["lat_p99_us"] / 1000,
        **{f"thread {k}": v for k, v in per_thread.items() if v >= 0.5},
    }


def measure_run(
    gw: Any, token: str, kind: str, seconds: float, conns: int, policy: dict[str, str] | None
) -> dict[str, float]:
    """`measure` with `policy` (a trace policy) in force for the run, or untraced (None)."""
    if policy is None:
        return measure(gw, token, kind, seconds, conns)
    policy_id = gw.admin.ok("POST", "/admin/trace-policies", policy)["id"]
    try:
        return measure(gw, token, kind, seconds, conns)
    finally:
        gw.admin.ok("DELETE", f"/admin/trace-policies/{policy_id}")


def connections(kind: str, args: argparse.Namespace) -> int:
    """wrk's connections for `kind`: --connections, else LOADS'."""
    return int(args.connections or LOADS[kind][2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="untraced/traced pairs per kind")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per wrk run")
    parser.add_argument("--level", default="info", choices=("info", "error", "debug"))
    parser.add_argument("--kinds", default="produce,batch")
    parser.add_argument("--results", action="store_true", help="append to benchmarks/RESULTS.md")
    parser.add_argument("--threads", action="store_true", help="log the CPU per request of each thread")
    parser.add_argument(
        "--connections", type=int, default=0, help="wrk connections for every kind (default: LOADS')"
    )
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    work = Path(tempfile.mkdtemp(prefix="mqgate-trace-cost-"))
    gw = run.Gateway(
        run.free_port(), work / "data", secrets.token_urlsafe(24), work / "gateway.log", "embedded"
    )
    started = gw.start()
    run.log(f"gateway up in {started:.2f} s: {' '.join(gw.cmd)}")
    token, _ = run.register(gw, run.TOPIC, 8, run.PRODUCER, run.CONSUMER)
    policy = {"mode": "project", "project": "default", "level": args.level}
    rows: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {k: [] for k in kinds}
    try:
        for kind in kinds:
            # Warm up untraced and traced: the trace topic and the index writer process start
            # at the first traced produce, a one-time cost no pair should carry.
            for traced in (False, True):
                measure_run(gw, token, kind, 2, connections(kind, args), policy if traced else None)
            for pair in range(args.pairs):
                got: dict[bool, dict[str, float]] = {}
                for traced in (False, True) if pair % 2 == 0 else (True, False):
                    got[traced] = measure_run(
                        gw, token, kind, args.seconds, connections(kind, args), policy if traced else None
                    )
                rows[kind].append((got[False], got[True]))
                if args.threads:
                    names = sorted({k for g in got.values() for k in g if k.startswith("thread ")})
                    for k in names:
                        run.log(
                            f"    {k[7:]}: {got[False].get(k, 0):.1f} → {got[True].get(k, 0):.1f} µs/request"
                        )
                ratio = got[True]["msgs_per_s"] / got[False]["msgs_per_s"]
                run.log(
                    f"  {kind} pair {pair + 1}: untraced {got[False]['msgs_per_s']:,.0f} msgs/s "
                    f"({got[False]['cpu_us']:.0f} µs CPU/request), traced {got[True]['msgs_per_s']:,.0f} "
                    f"({got[True]['cpu_us']:.0f} µs): ratio {ratio:.3f}"
                )
        lag = index_lag(gw)
    finally:
        gw.stop()
        m = run.machine(work)  # before the data dir goes: the file system it was on
        shutil.rmtree(work, ignore_errors=True)
    table = report(rows, args, lag)
    print(table)
    if args.results:
        with open(run.RESULTS, "a", encoding="utf-8") as out:
            out.write(f"\n{table}\n- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, kernel ")
            out.write(f"{m['kernel']}, data dir on {m['fs']}; Python {m['python']}\n")


def index_lag(gw: Any, limit_s: float = 120.0) -> str:
    """The trace index's lag when the load stopped, and how long it took to catch up."""
    t0 = time.monotonic()
    first = None
    while True:
        _, _, raw = gw.admin.request("GET", "/metrics")
        line = next(
            (ln for ln in raw.decode().splitlines() if ln.startswith("mqgate_trace_index_lag_events ")), ""
        )
        lag = float(line.split()[-1]) if line else 0.0
        first = lag if first is None else first
        if lag == 0 or time.monotonic() - t0 > limit_s:
            took = time.monotonic() - t0
            return f"{first:,.0f} events behind when the load stopped, {lag:,.0f} after {took:.1f} s"
        time.sleep(0.2)


def report(
    rows: dict[str, list[tuple[dict[str, float], dict[str, float]]]], args: argparse.Namespace, lag: str
) -> str:
    commit = run.sh(["git", "-C", str(run.ROOT), "rev-parse", "--short", "HEAD"])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"## {when} — produce traced at {args.level} vs untraced (benchmarks/trace_cost.py)",
        "",
        f"- command: `PYTHONPATH=src .venv/bin/python benchmarks/trace_cost.py --pairs {args.pairs} "
        f"--seconds {args.seconds:g} --level {args.level}"
        + (f" --connections {args.connections}" if args.connections else "")
        + f"`; code: git {commit}",
        "- one gateway (embedded store, fsync always), topic of 8 queues, 100-byte messages; wrk runs "
        "alternating untraced and traced (the policy added and deleted between runs, A B B A); "
        + ", ".join(f"{k} {connections(k, args)} connections" for k in rows),
        "",
        "| load | pairs: traced / untraced msgs/s | median ratio | 90 % interval of the median "
        "| pooled ratio | CPU µs/request untraced → traced | p99 ms untraced → traced |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for kind, pairs in rows.items():
        ratios = [t["msgs_per_s"] / u["msgs_per_s"] for u, t in pairs]
        pooled = sum(t["msgs_per_s"] for _, t in pairs) / sum(u["msgs_per_s"] for u, _ in pairs)
        cpu_u = statistics.median(u["cpu_us"] for u, _ in pairs)
        cpu_t = statistics.median(t["cpu_us"] for _, t in pairs)
        p99_u = statistics.median(u["p99_ms"] for u, _ in pairs)
        p99_t = statistics.median(t["p99_ms"] for _, t in pairs)
        each = ", ".join(f"{t['msgs_per_s']:,.0f} / {u['msgs_per_s']:,.0f}" for u, t in pairs)
        label = "single produce" if kind == "produce" else "batch of 100"
        low, high = median_interval(ratios)
        lines.append(
            f"| {label} | {each} | {statistics.median(ratios):.3f} | {low:.3f}–{high:.3f} | {pooled:.3f} | "
            f"{cpu_u:.0f} → {cpu_t:.0f} | {p99_u:.1f} → {p99_t:.1f} |"
        )
    lines += [
        "",
        "- the interval: the median of the pairs resampled with replacement "
        f"({RESAMPLES:,} times): how far the machine's noise leaves the figure",
        f"- trace index: {lag}",
    ]
    return "\n".join(lines)


RESAMPLES = 2_000


def median_interval(ratios: list[float], level: float = 0.9) -> tuple[float, float]:
    """A bootstrap interval of the median of `ratios` (seeded: the same pairs give the same
    interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES))
    cut = int((1 - level) / 2 * RESAMPLES)
    return medians[cut], medians[RESAMPLES - 1 - cut]


if __name__ == "__main__":
    main()
