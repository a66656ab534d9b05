"""Gateway workers on the embedded store (`run.py workers`, issue 28 item 4): the main table's
produce, batch and consume loads (`run.py gateway --only produce,batch,consume`, each run a
gateway of its own on a fresh data directory, fsync always) with `--workers N` — N gateway
processes on one port beside the store process that owns the data directory's files — against
the same loads on one process, in alternating runs (1, N, N, 1, 1, N, ...): the medians of
`--rounds` runs each, and their ratios. Rows `workers.produce`, `workers.batch`,
`workers.consume`.

On a 2-core machine wrk, N workers, the store process and its fsync threads share the two
cores: this measures what the store process costs there, not what N cores would give (see
RESULTS.md for that, from the per-request costs).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from typing import Any

from . import results
from .common import BENCH_DIR, VENV_PY, log

LOADS = {
    "produce": ("produce, 1 msg/request, wrk -t2 -c64", r"produce: (\d+) msgs/s.*p99 ([\d.]+) ms"),
    "batch": ("produce batch of 100, wrk -t2 -c16", r"batch: (\d+) msgs/s.*p99 ([\d.]+) ms"),
    "consume": (
        "consume, pull max=100 + ack via the next requestId, wrk -t2 -c8",
        r"consume: (\d+) acked msgs/s()",
    ),
}
CPU = re.compile(r"(produce|batch): .*server CPU (\d+) µs/request")


def one_run(a: argparse.Namespace, workers: int) -> dict[str, Any]:
    cmd = [
        str(VENV_PY),
        str(BENCH_DIR / "run.py"),
        "gateway",
        "--only",
        "produce,batch,consume",
        "--no-record",
        "--workers",
        str(workers),
        "--duration",
        str(a.duration),
        "--prefill",
        str(a.prefill),
    ]
    log(f"  $ {' '.join(cmd[1:])}")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = done.stdout
    got: dict[str, Any] = {}
    for load, (_, pattern) in LOADS.items():
        found = re.search(pattern, out)
        if found is None:
            raise SystemExit(f"no {load} figure in the run with --workers {workers}:\n{out[-2000:]}")
        got[load] = int(found.group(1))
        got[f"{load}_p99"] = float(found.group(2)) if found.group(2) else None
    for load, micros in CPU.findall(out):
        got[f"{load}_cpu"] = int(micros)
    log(f"  workers {workers}: " + ", ".join(f"{k} {got[k]:,}" for k in LOADS))
    return got


def main(a: argparse.Namespace) -> int:
    runs: dict[int, list[dict[str, Any]]] = {1: [], a.workers: []}
    order = [1, a.workers]
    for r in range(a.rounds):
        for w in order if r % 2 == 0 else reversed(order):
            runs[w].append(one_run(a, w))
    rows = []
    for load, (what, _) in LOADS.items():
        many = [run[load] for run in runs[a.workers]]
        one = [run[load] for run in runs[1]]
        m, o = statistics.median(many), statistics.median(one)
        notes = f"runs {', '.join(f'{x:,}' for x in many)} against {', '.join(f'{x:,}' for x in one)}"
        cpu_many = [run.get(f"{load}_cpu") for run in runs[a.workers] if run.get(f"{load}_cpu")]
        cpu_one = [run.get(f"{load}_cpu") for run in runs[1] if run.get(f"{load}_cpu")]
        if cpu_many and cpu_one:
            notes += (
                f"; server CPU (every process) {statistics.median(cpu_many):.0f} against "
                f"{statistics.median(cpu_one):.0f} µs/request"
            )
        rows.append(
            results.Row(
                f"workers.{load}",
                f"{what}: `--workers {a.workers}` on the embedded store (a store process owns the files)",
                f"{m:,.0f} msgs/s",
                f"one gateway process, alternating runs: {o:,.0f} msgs/s",
                f"{m / o:.2f}",
                f"median of {a.rounds}; {notes}",
            )
        )
    results.record(
        a,
        f"Gateway workers on the embedded store: --workers {a.workers} against 1",
        rows,
        [f"- {a.rounds} runs each, alternating; {a.duration:g} s per load; pre-fill {a.prefill:,}"],
    )
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(sub, common, "workers", __doc__, help="--workers N on the embedded store vs one")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--prefill", type=int, default=1_500_000)
    p.set_defaults(func=main)


if __name__ == "__main__":
    sys.exit("run it as `python benchmarks/run.py workers`")
