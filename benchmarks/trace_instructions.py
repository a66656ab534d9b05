"""What tracing costs a produce in CPU instructions (issue 11), counted by valgrind's callgrind:
about the same count for the same code and inputs whatever else the machine does, where
timings on these machines move by 20 % within a minute (trace_phases.py, trace_cost.py). Not
exact: the group commit's rounds, and so their per-round work, depend on how threads
interleave; repeated runs of a variant have differed by 1-4 %. User space only: the kernel's
work for writes and fsyncs is not counted.

Each variant (trace_phases.py's: off, on, nomatch, nobuild, noseal; and `noindex`, traced but
the trace index never fed) runs a gateway in this process under callgrind twice, driving its
ASGI app with `--small` and then `--large` requests after the same warm-up; the difference of
the two runs' totals over the difference of their requests is the instructions per request,
start-up and shut-down cancelling out. Each group-commit round's fsync is made to last at least
`--round-ms` (wall time): under callgrind the interpreter runs ~50x slower while fsync does not,
so rounds would hold one or two requests, and what tracing does per round (seal, write, one
more file to sync) would weigh per request many times what it does in a busy gateway; with
100 ms and 64 callers a round holds about as many requests as one through HTTP (the table
gives requests per round; 64 callers, 100 ms: rounds of ~63; runs of `off` gave 263k-285k).
The trace index writer runs in a thread of the gateway (so its work is counted) and is fed
once, after the requests, in rounds as large as a busy gateway's (a round every 0.1 s holds
hundreds of produces; under callgrind's 50x slowdown a timed round would hold a few and
inflate the per-round cost).

    PYTHONPATH=src .venv/bin/python benchmarks/trace_instructions.py [--variants off,on]
        [--batch 1] [--small 300] [--large 1500] [--callers 64] [--round-ms 100] [--results]

Needs valgrind (Debian's package). A run of two variants takes about two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WARM_UP = 200


def _slow_syncs(round_ms: float) -> list[int]:
    """Each group-commit round's fsync takes at least `round_ms` (wall time): under callgrind
    the event loop runs ~50x slower while fsync does not, so without it a round holds one or
    two requests and per-round work weighs per request many times what it does in a busy
    gateway. Returns the count of rounds, kept up to date."""
    import time

    from mqgate.durable import group_commit

    rounds = [0]
    fsync_all = group_commit._fsync_all

    def slow(fds: list[int]) -> None:
        until = time.monotonic() + round_ms / 1000
        fsync_all(fds)
        rounds[0] += 1
        time.sleep(max(0.0, until - time.monotonic()))

    group_commit._fsync_all = slow
    return rounds


async def drive(variant: str, batch: int, requests: int, callers: int, round_ms: float) -> None:
    """Inside callgrind: a gateway of `variant`, `WARM_UP` + `requests` requests from `callers`
    concurrent callers, its trace index fed to the end. Prints the rounds of group commit."""
    from trace_cpu_bench import start
    from trace_phases import _ablate

    from mqgate.api.collector import tune_for_serving

    tune_for_serving()  # as `mqgate serve` collects garbage
    rounds = _slow_syncs(round_ms)
    started = await start(variant != "off", batch)
    tracing = started.tracing
    await tracing.indexer.close()  # fed below, in rounds of a busy gateway's size
    _ablate("on" if variant == "noindex" else variant, tracing)
    await started.call_times(callers, WARM_UP + requests)
    print(f"rounds {rounds[0]}", flush=True)
    if variant not in ("off", "noindex"):
        await tracing.recorder.flush()
        while await tracing.indexer.step():
            pass
    await started.stop()


def instructions(variant: str, batch: int, requests: int, callers: int, round_ms: float) -> tuple[int, int]:
    """Instructions and group-commit rounds of one callgrind run of `drive`."""
    env = {**os.environ, "MQGATE_TRACE_INDEX_PROCESS": "false"}
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--inner",
        f"{variant},{batch},{requests},{callers},{round_ms}",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    rounds = re.search(r"^rounds (\d+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None or rounds is None:
        raise SystemExit(f"callgrind run failed ({variant}, {requests}):\n{done.stderr[-3000:]}")
    return int(found.group(1)), int(rounds.group(1))


def per_request(
    variant: str, batch: int, small: int, large: int, callers: int, round_ms: float
) -> tuple[float, float]:
    """(instructions per request, requests per group-commit round)"""
    with ThreadPoolExecutor(2) as pool:  # the two runs of a variant side by side (2 cores)
        low, high = pool.map(lambda n: instructions(variant, batch, n, callers, round_ms), (small, large))
    requests = large - small
    return (high[0] - low[0]) / requests, requests / max(1, high[1] - low[1])


def table(counts: dict[str, tuple[float, float]]) -> list[str]:
    base = counts["off"][0] if "off" in counts else None
    lines = [
        "| variant | instructions per request | vs off | off / variant | requests per round |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant, (n, per_round) in counts.items():
        versus = f"{n - base:+,.0f}" if base else ""
        ratio = f"{base / n:.3f}" if base else ""
        lines.append(f"| {variant} | {n:,.0f} | {versus} | {ratio} | {per_round:.1f} |")
    return lines


def main() -> None:
    from trace_phases import VARIANTS

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--variants", default="off,on", help=", ".join((*VARIANTS, "noindex")))
    parser.add_argument("--batch", type=int, default=1, help="messages per request (1: /mq/produce)")
    parser.add_argument("--small", type=int, default=300, help="requests of the first run")
    parser.add_argument("--large", type=int, default=1500, help="requests of the second run")
    parser.add_argument("--callers", type=int, default=64, help="concurrent callers")
    parser.add_argument(
        "--round-ms",
        type=float,
        default=100.0,
        help="each group-commit round takes at least this long (wall)",
    )
    parser.add_argument("--results", action="store_true", help="append to benchmarks/RESULTS.md")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        variant, batch, requests, callers, round_ms = args.inner.split(",")
        asyncio.run(drive(variant, int(batch), int(requests), int(callers), float(round_ms)))
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    variants = args.variants.split(",")
    unknown = set(variants) - {*VARIANTS, "noindex"}
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    counts = {}
    for variant in variants:
        counts[variant] = found = per_request(
            variant, args.batch, args.small, args.large, args.callers, args.round_ms
        )
        print(f"{variant}: {found[0]:,.0f} instructions per request, {found[1]:.1f} per round", flush=True)
    from trace_cpu_bench import report_table

    command = (
        f"PYTHONPATH=src .venv/bin/python benchmarks/trace_instructions.py --variants {args.variants} "
        f"--batch {args.batch} --small {args.small} --large {args.large} --callers {args.callers} "
        f"--round-ms {args.round_ms:g}"
    )
    title = "what tracing costs a produce in instructions (trace_instructions.py, callgrind)"
    report_table(table(counts), args.results, title, command)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
