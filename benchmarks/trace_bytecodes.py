"""What tracing adds to a produce, counted in Python bytecodes per function (issue 11): the
interpreter's own count of the instructions it executed (`sys.settrace` with opcode events), the
same for the same code and inputs whatever the machine does. Through HTTP and in one process a
traced request's extra event loop time has followed its extra bytecodes (~27 ns each on the
machines of 2026-11-27), so this table says where a change saves and where it only moves work.

A gateway runs in this process (trace_cpu_bench.py's harness: its ASGI app driven directly by
`--callers` concurrent callers) untraced and then with every message traced at info; after a
warm-up, `--requests` requests are counted. The table lists the functions whose count per
request changed most. Work in C (JSON, checksums, writes, fsync threads) is not counted; the
trace index writer process is not in this process.

    PYTHONPATH=src .venv/bin/python benchmarks/trace_bytecodes.py [--batch 1] [--requests 2000]
        [--callers 64] [--top 25] [--results]
    PYTHONPATH=<another checkout>/src .venv/bin/python benchmarks/trace_bytecodes.py  (its code)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

WARM_UP = 300


class BytecodeCounter:
    """Bytecodes executed per function (file, first line, name) while `on`."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, int, str]] = Counter()

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            self.counts[(os.path.basename(code.co_filename), code.co_firstlineno, code.co_name)] += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local

    def on(self) -> None:
        sys.settrace(self._global)

    def off(self) -> None:
        sys.settrace(None)


async def count(trace: bool, batch: int, requests: int, callers: int) -> dict[tuple[str, int, str], float]:
    """Bytecodes per request by function, of a gateway traced or not."""
    from trace_cpu_bench import start

    from mqgate.api.collector import tune_for_serving

    tune_for_serving()
    gw = await start(trace, batch)
    await gw.call_times(callers, WARM_UP)
    counter = BytecodeCounter()
    counter.on()
    try:
        await gw.call_times(callers, requests)
    finally:
        counter.off()
    await gw.stop()
    return {where: n / requests for where, n in counter.counts.items()}


def table(
    off: dict[tuple[str, int, str], float], on: dict[tuple[str, int, str], float], top: int
) -> list[str]:
    total_off, total_on = sum(off.values()), sum(on.values())
    lines = [
        f"- bytecodes per request: untraced {total_off:,.0f}, traced {total_on:,.0f} "
        f"(+{total_on - total_off:,.0f}, untraced/traced {total_off / total_on:.3f})",
        "",
        "| function (file:line name) | untraced | traced | difference |",
        "|---|---:|---:|---:|",
    ]
    changes = sorted(
        ((on.get(k, 0.0) - off.get(k, 0.0), k) for k in off.keys() | on.keys()),
        key=lambda change: -abs(change[0]),
    )
    for difference, (file, line, name) in changes[:top]:
        lines.append(
            f"| {file}:{line} {name} | {off.get((file, line, name), 0.0):.1f} | "
            f"{on.get((file, line, name), 0.0):.1f} | {difference:+.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="messages per request (1: /mq/produce)")
    parser.add_argument("--requests", type=int, default=2000, help="requests counted per variant")
    parser.add_argument("--callers", type=int, default=64, help="concurrent callers")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--results", action="store_true", help="append to benchmarks/RESULTS.md")
    args = parser.parse_args()
    off = asyncio.run(count(False, args.batch, args.requests, args.callers))
    on = asyncio.run(count(True, args.batch, args.requests, args.callers))
    from trace_cpu_bench import report_table

    command = (
        f"PYTHONPATH=src .venv/bin/python benchmarks/trace_bytecodes.py --batch {args.batch} "
        f"--requests {args.requests} --callers {args.callers} --top {args.top}"
    )
    title = "what tracing adds to a produce in Python bytecodes (trace_bytecodes.py)"
    report_table(table(off, on, args.top), args.results, title, command)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
