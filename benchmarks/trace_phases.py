"""Where a traced produce's event loop time goes (issue 11), measured so that the machine's drift
cancels: several gateways in one process, each a variant of tracing, take turns in short
phases (A B C … C B A …) of concurrent callers driving their ASGI app directly, and each
variant's event loop CPU and wall time are summed over its phases. trace_cpu_bench.py runs one
gateway per run; on a machine whose speed moves by 20 % within a minute its runs differ by more
than the effects measured here, while phases of 0.3 s see the same machine.

Variants (each but `off` has a project policy tracing every message at info):
  off       tracing off
  on        every message traced, as shipped
  nomatch   the policy in force but matching nothing (a traceparent made, nothing recorded)
  nobuild   matched, the messages carry their traceparent, no trace record built
  noseal    the records built and joined to their round, never encoded nor written

    PYTHONPATH=src .venv/bin/python benchmarks/trace_phases.py [--variants off,on] [--phases 20]

--results appends the table to benchmarks/RESULTS.md with the commit of the code measured.

Caveat (RESULTS.md, 2026-11-27): the gateways' order matters although the phases alternate;
the same code gave `nomatch` +51 µs per batch after `off` and -2 µs when started first, and
traced - untraced from +83 to +164 µs between runs. Compare a variant with the one next to
it in several orders, or count instructions (trace_instructions.py).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from typing import Any

from trace_cpu_bench import Started, report_table, start

from mqgate.api.collector import tune_for_serving
from mqgate.services.tracing import Tracing
from mqgate.tracing.rounds import RoundGroup

VARIANTS = ("off", "on", "nomatch", "nobuild", "noseal")


class _Unwritten(RoundGroup):
    """A round that drops its batches when sealed (`noseal`)."""

    __slots__ = ()

    def seal(self) -> list[Any]:
        if not self.is_sealed:
            self.is_sealed = True
            self._batches = []
        return []


def _ablate(variant: str, tracing: Tracing) -> None:
    if variant == "nomatch":
        tracing.match = lambda topic, queue, services: None  # type: ignore[method-assign]
    elif variant == "nobuild":
        tracing.companions.make = lambda *args: lambda firsts: {}  # type: ignore[method-assign]
    elif variant == "noseal":
        recorder = tracing.recorder

        def group(where: tuple[str, int]) -> RoundGroup:
            found = recorder._rounds.get(where)
            if found is None or found.is_sealed:
                found = recorder._rounds[where] = _Unwritten(recorder.clock_ms, *where)
            return found

        recorder._group = group  # type: ignore[method-assign]


@dataclass
class Gateway:
    variant: str
    started: Started
    cpu_s: float = 0.0
    wall_s: float = 0.0
    requests: int = 0


async def start_variant(variant: str, batch: int) -> Gateway:
    started = await start(variant != "off", batch)
    _ablate(variant, started.tracing)
    return Gateway(variant, started)


async def phase(gw: Gateway, conns: int, seconds: float, counted: bool = True) -> None:
    cpu, wall = time.thread_time(), time.perf_counter()
    count = await gw.started.drive(conns, seconds)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    if counted:
        gw.cpu_s += cpu
        gw.wall_s += wall
        gw.requests += count


async def measure(variants: list[str], batch: int, conns: int, phases: int, seconds: float) -> list[Gateway]:
    gateways = [await start_variant(v, batch) for v in variants]
    try:
        for gw in gateways:
            await phase(gw, conns, 1.5, counted=False)  # warm up (the index writer process starts)
        for k in range(phases):
            for gw in gateways if k % 2 == 0 else gateways[::-1]:
                await phase(gw, conns, seconds)
    finally:
        for gw in gateways:
            await gw.started.stop()
    return gateways


def table(gateways: list[Gateway]) -> list[str]:
    base = gateways[0]
    base_cpu, base_wall = base.cpu_s / base.requests * 1e6, base.wall_s / base.requests * 1e6
    lines = [
        f"| variant | event loop CPU µs/request | vs {base.variant} | wall µs/request | "
        f"throughput vs {base.variant} | requests |",
        "|---|---|---|---|---|---|",
    ]
    for gw in gateways:
        cpu, wall = gw.cpu_s / gw.requests * 1e6, gw.wall_s / gw.requests * 1e6
        lines.append(
            f"| {gw.variant} | {cpu:.1f} | {cpu - base_cpu:+.1f} | {wall:.1f} | {base_wall / wall:.3f} | "
            f"{gw.requests:,} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--variants", default="off,nomatch,nobuild,noseal,on", help=", ".join(VARIANTS))
    parser.add_argument("--batch", type=int, default=1, help="messages per request (1: /mq/produce)")
    parser.add_argument("--conns", type=int, default=64, help="concurrent callers per phase")
    parser.add_argument("--phases", type=int, default=20, help="phases per variant")
    parser.add_argument("--seconds", type=float, default=0.3, help="seconds per phase")
    parser.add_argument("--results", action="store_true", help="append to benchmarks/RESULTS.md")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    tune_for_serving()  # as `mqgate serve` collects garbage
    gateways = asyncio.run(measure(variants, args.batch, args.conns, args.phases, args.seconds))
    command = (
        f"PYTHONPATH=src .venv/bin/python benchmarks/trace_phases.py --variants {args.variants} "
        f"--batch {args.batch} --conns {args.conns} --phases {args.phases} --seconds {args.seconds:g}"
    )
    title = "where a traced produce's event loop time goes (trace_phases.py)"
    report_table(table(gateways), args.results, title, command)


if __name__ == "__main__":
    main()
