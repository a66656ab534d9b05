"""What tracing costs and how its look-ups perform (issue 11, SPEC P2-P6): `run.py trace --what
<measurement>`, each measurement's options listed below (defaults per measurement).

cost          produce traced at info vs untraced through HTTP (target: traced >= 0.85 of
              untraced): one gateway, single produces and batches of 100 with wrk, short runs
              alternating untraced and traced (A B B A, the policy added and deleted between
              runs) after a warm-up of each (the index writer process starts at the first
              traced produce); the median and pooled ratio over --pairs, a 90 % bootstrap
              interval of the median (how far the machine's noise leaves the figure), the
              gateway's CPU per request (--threads: per thread and for the index writer
              process) and the index lag when the load stopped. --connections: wrk's
              connections for every kind instead of 64 (single) and 16 (batches).
              [--pairs 4 --seconds 6 --level info --kinds produce,batch --connections --threads]
cpu           the event loop's CPU per produce, tracing off vs every message traced, in one
              process (the ASGI app called directly by --callers concurrent callers; no HTTP,
              no wrk), median over runs alternating untraced and traced (--pairs, A B B A), a
              new app each run. --against <checkout>: both codes, each run a process of its
              own, taking turns. PYTHONPATH=<another checkout>/src measures that checkout.
              [--batch 1 --callers 64 --seconds 4 --pairs 4 --against]
bytecodes     what tracing adds to a produce in Python bytecodes per function: the
              interpreter's own count (sys.settrace opcode events) while --requests requests
              run untraced, then traced, in one process; deterministic (work in C not counted).
              [--batch 1 --requests 2000 --callers 64 --top 25]
instructions  what tracing costs a produce in CPU instructions, counted by valgrind's callgrind
              (the same count whatever else the machine does). Each variant (see phases, plus
              `noindex`: traced, the index never fed) runs a gateway under callgrind twice,
              --small and --large requests after the same warm-up; the difference of the totals
              over the difference of requests is the instructions per request. The index writer
              runs in a thread (counted), fed once after the requests; each group-commit round's
              fsync lasts at least --round-ms so that rounds under callgrind (~50x slower) hold
              as many requests as through HTTP. Needs valgrind.
              [--variants off,on --batch 1 --small 300 --large 1500 --callers 64 --round-ms 100]
phases        where a traced produce's event loop time goes: several gateways in one process,
              each a variant of tracing (off; on; nomatch: a policy matching nothing; nobuild:
              matched, no trace record built; noseal: records built, never encoded nor
              written), take turns in short phases (A B C ... C B A); event loop CPU and wall
              time per request, each against the first variant. Their order still moves the
              figures (RESULTS 2026-11-27): try several orders, or count instructions.
              [--variants off,nomatch,nobuild,noseal,on --batch 1 --callers 64 --phases 20 --seconds 0.3]
lookups       the writer and the indexer through the embedded store (--pipeline-events, 5 hops a
              message, --writers tasks; the indexer alone; both at once with the index lag), then
              --lookups random look-ups by msgId, requestId and key in an SQLite index of
              --events events (bulk-loaded; warm page cache).
              [--events 1000000 --pipeline-events 200000 --writers 64 --lookups 2000 --dir --keep
               --skip-pipeline]
rounds        look-ups in an index of round records (`TraceRound`, one per group-commit round, as
              a traced gateway writes them), filled through the index writer's own path, then
              random look-ups by msgId and key.
              [--records 20000 --per-round 20 --batch 5 --lookups 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs, results, wrk
from .common import BENCH_DIR, MSG_BYTES, BenchFailure, log, percentile
from .servers import Gateway, register

RUN_PY = str(BENCH_DIR / "run.py")
ADMIN = "admintoken-0123456789abcdef"
VARIANTS = ("off", "on", "nomatch", "nobuild", "noseal")
WHATS: dict[str, dict[str, Any]] = {  # each measurement's options and their defaults
    "cost": dict(pairs=4, seconds=6.0, level="info", kinds="produce,batch", connections=0, threads=False),
    "cpu": dict(batch=1, callers=64, seconds=4.0, pairs=4, against=None),
    "bytecodes": dict(batch=1, requests=2000, callers=64, top=25),
    "instructions": dict(variants="off,on", batch=1, small=300, large=1500, callers=64, round_ms=100.0),
    "phases": dict(variants="off,nomatch,nobuild,noseal,on", batch=1, callers=64, phases=20, seconds=0.3),
    "lookups": dict(
        events=10**6,
        pipeline_events=200_000,
        writers=64,
        lookups=2000,
        dir=None,
        keep=False,
        skip_pipeline=False,
    ),
    "rounds": dict(records=20_000, per_round=20, batch=5, lookups=2000),
}


def code_measured() -> str:
    """The commit of the mqgate code this process imports (PYTHONPATH may name another checkout)."""
    spec = importlib.util.find_spec("mqgate")
    return results.git_commit(Path(spec.origin).parent) if spec and spec.origin else "unknown"


def measured_line(what: str, args: argparse.Namespace) -> str:
    """The command that repeats this measurement (the options in force, defaults included)."""
    opts = " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k in WHATS[what]
        if (v := getattr(args, k)) not in (None, False, True, 0)
    )
    flags = " ".join(f"--{k.replace('_', '-')}" for k in WHATS[what] if getattr(args, k) is True)
    return f"PYTHONPATH=src .venv/bin/python benchmarks/run.py trace --what {what} {opts} {flags}".strip()


# --- a gateway in this process (cpu, bytecodes, instructions, phases) -----------------------------


async def call(app: Any, path: str, body: bytes, token: str) -> tuple[int, bytes]:
    """One POST through the ASGI app, no server."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json")],
        "http_version": "1.1",
        "scheme": "http",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    given = False
    answer: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the request is whole: nothing more comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return int(answer["status"]), bytes(answer["body"])


@dataclass
class Started:
    """A gateway app started in this process, with a topic `bench` and a producer `bp`."""

    variant: str
    app: Any
    tracing: Any
    token: str
    path: str  # what a request posts, and its body
    body: bytes
    lifespan: asyncio.Queue[dict[str, str]]
    running: asyncio.Task[None]
    data_dir: str
    cpu_s: float = 0.0  # phases: summed over this gateway's phases
    wall_s: float = 0.0
    requests: int = 0

    async def _callers(self, conns: int, more: Any) -> int:
        count = 0

        async def caller() -> None:
            nonlocal count
            while more(count):
                count += 1
                status, answer = await call(self.app, self.path, self.body, self.token)
                assert status == 200, answer

        await asyncio.gather(*(caller() for _ in range(conns)))
        return count

    async def drive(self, conns: int, seconds: float) -> int:
        """`conns` callers posting requests for `seconds`: how many were answered (all 200)."""
        until = time.monotonic() + seconds
        return await self._callers(conns, lambda _: time.monotonic() < until)

    async def call_times(self, conns: int, requests: int) -> None:
        """`requests` requests (all 200) from `conns` concurrent callers."""
        await self._callers(conns, lambda count: count < requests)

    async def stop(self) -> None:
        await self.lifespan.put({"type": "lifespan.shutdown"})
        await self.running
        shutil.rmtree(self.data_dir, ignore_errors=True)


async def start(variant: str, batch: int) -> Started:
    """A gateway whose requests produce `batch` messages (1: /mq/produce), every one traced at
    info by a project policy unless `variant` is off, with that variant's ablation."""
    from mqgate.app import build_site
    from mqgate.settings import load_settings

    data_dir = os.environ["MQGATE_DATA_DIR"] = tempfile.mkdtemp(prefix="mqgate-trace-")
    os.environ["MQGATE_ADMIN_TOKEN"] = ADMIN
    built = build_site(load_settings())
    app, tracing = built.site, built.platform.tracing
    lifespan: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        started.set()

    running = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, lifespan_send))
    await lifespan.put({"type": "lifespan.startup"})
    await asyncio.wait_for(started.wait(), 30)

    async def admin(path: str, **fields: Any) -> dict[str, Any]:
        status, body = await call(app, path, json.dumps(fields).encode(), ADMIN)
        assert status == 200, body
        return dict(json.loads(body)["result"])

    await admin("/admin/topics", name="bench", queues=4)
    token = (await admin("/admin/producers", name="bp", topic="bench"))["token"]
    if variant != "off":
        await admin("/admin/trace-policies", mode="project", project="default", level="info")
    message = {"message": "x" * MSG_BYTES}
    if batch == 1:
        path, body = "/mq/produce", json.dumps({"producer": "bp", **message}).encode()
    else:
        path, body = (
            "/mq/produce/batch",
            json.dumps({"producer": "bp", "messages": [message] * batch}).encode(),
        )
    ablate("on" if variant == "noindex" else variant, tracing)
    return Started(variant, app, tracing, token, path, body, lifespan, running, data_dir)


def ablate(variant: str, tracing: Any) -> None:
    """Cut the traced path short where `variant` says (phases and instructions)."""
    from mqgate.tracing.rounds import RoundGroup

    if variant == "nomatch":
        tracing.match = lambda topic, queue, services: None
    elif variant == "nobuild":

        async def nothing_built(*args: Any) -> Any:
            return lambda firsts: {}

        observer = tracing.observer
        observer.records_with = nothing_built
        tracing.observers.detach(observer)  # the data path holds the hooks it was attached with
        tracing.observers.attach(observer)
    elif variant == "noseal":

        class Unwritten(RoundGroup):
            """A round that drops its batches when sealed."""

            __slots__ = ()

            def seal(self) -> list[Any]:
                if not self.is_sealed:
                    self.is_sealed = True
                    self._batches = []
                return []

        recorder = tracing.recorder

        def group(where: tuple[str, int]) -> Any:
            found = recorder._rounds.get(where)
            if found is None or found.is_sealed:
                found = recorder._rounds[where] = Unwritten(recorder.clock_ms, *where)
            return found

        recorder._group = group


def serving_collector() -> None:
    """The garbage collector's thresholds as `mqgate serve` sets them."""
    from mqgate.api.collector import tune_for_serving

    tune_for_serving()


def variants_of(args: argparse.Namespace, allowed: tuple[str, ...]) -> list[str]:
    variants = args.variants.split(",")
    if unknown := set(variants) - set(allowed):
        raise SystemExit(f"unknown variants: {', '.join(sorted(unknown))} (known: {', '.join(allowed)})")
    return variants


# --- cost: through HTTP ---------------------------------------------------------------------------

LOADS = {
    # kind: (wrk script, path, connections, messages per request)
    "produce": ("produce.lua", "/mq/produce", 64, 1),
    "batch": ("produce_batch.lua", "/mq/produce/batch", 16, 100),
}
RESAMPLES = 2_000


def median_interval(ratios: list[float], level: float = 0.9) -> tuple[float, float]:
    """A bootstrap interval of the median of `ratios` (seeded: the same pairs give the same
    interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES))
    cut = int((1 - level) / 2 * RESAMPLES)
    return medians[cut], medians[RESAMPLES - 1 - cut]


def cost_run(
    gw: Gateway, token: str, kind: str, seconds: float, conns: int, policy: dict | None
) -> dict[str, float]:
    """One wrk run of `kind` with `policy` (a trace policy) in force, or untraced (None)."""
    script, path, _, per_request = LOADS[kind]
    policy_id = gw.post("/admin/trace-policies", policy)["id"] if policy else None
    try:
        env = {
            "MQB_TOKEN": token,
            "MQB_PRODUCER": "bench-producer",
            "MQB_MSG_BYTES": str(MSG_BYTES),
            "MQB_BATCH": str(per_request),
        }
        before = procs.thread_cpu(gw.pid)
        res = wrk.measured(gw.pid, script, f"{gw.url}{path}", conns, seconds, env)
        after = procs.thread_cpu(gw.pid)
    finally:
        if policy_id:
            gw.api("DELETE", f"/admin/trace-policies/{policy_id}")
    if problems := wrk.check_errors(res, kind):
        raise BenchFailure("; ".join(problems))
    requests = max(1, res["ok_requests"])
    per_thread = {k: (after[k] - before.get(k, 0.0)) / requests * 1e6 for k in after}
    return {
        "msgs_per_s": res["ok_requests"] * per_request / res["seconds"],
        "cpu_us": wrk.server_cpu_per_request(res),
        "p99_ms": res["lat_p99_us"] / 1000,
        **{f"thread {k}": v for k, v in per_thread.items() if v >= 0.5},
    }


def index_lag(gw: Gateway, limit_s: float = 120.0) -> str:
    """The trace index's lag when the load stopped, and how long it took to catch up."""
    t0, first = time.monotonic(), None
    while True:
        _, _, raw = gw.admin.request("GET", "/metrics")
        found = re.search(r"^mqgate_trace_index_lag_events ([0-9.e+]+)$", raw.decode(), re.M)
        lag = float(found.group(1)) if found else 0.0
        first = lag if first is None else first
        if lag == 0 or time.monotonic() - t0 > limit_s:
            took = time.monotonic() - t0
            return f"{first:,.0f} events behind when the load stopped, {lag:,.0f} after {took:.1f} s"
        time.sleep(0.2)


def cost(args: argparse.Namespace) -> int:
    wrk.require()
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - LOADS.keys():
        raise SystemExit(f"unknown kinds {unknown} (produce, batch)")
    conns = {k: args.connections or LOADS[k][2] for k in kinds}
    work = Path(tempfile.mkdtemp(prefix="mqgate-trace-cost-"))
    gw = Gateway(work / "data")
    log(f"gateway up in {gw.start():.2f} s: {' '.join(gw.cmd)}")
    token, _ = register(gw, "bench", 8, "bench-producer", "bench-consumer")
    policy = {"mode": "project", "project": "default", "level": args.level}
    pairs: dict[str, list[tuple[dict, dict]]] = {k: [] for k in kinds}
    try:
        for kind in kinds:
            # Warm up untraced and traced: the trace topic and the index writer process start
            # at the first traced produce, a one-time cost no pair should carry.
            for traced in (False, True):
                cost_run(gw, token, kind, 2, conns[kind], policy if traced else None)
            for pair in range(args.pairs):
                got = {}
                for traced in (False, True) if pair % 2 == 0 else (True, False):
                    got[traced] = cost_run(
                        gw, token, kind, args.seconds, conns[kind], policy if traced else None
                    )
                pairs[kind].append((got[False], got[True]))
                if args.threads:
                    for k in sorted({k for g in got.values() for k in g if k.startswith("thread ")}):
                        log(f"    {k[7:]}: {got[False].get(k, 0):.1f} → {got[True].get(k, 0):.1f} µs/request")
                u, t = got[False], got[True]
                log(
                    f"  {kind} pair {pair + 1}: untraced {u['msgs_per_s']:,.0f} msgs/s ({u['cpu_us']:.0f} "
                    f"µs CPU/request), "
                    f"traced {t['msgs_per_s']:,.0f} ({t['cpu_us']:.0f} µs): ratio "
                    f"{t['msgs_per_s'] / u['msgs_per_s']:.3f}"
                )
        lag = index_lag(gw)
    finally:
        gw.stop()
        m = results.machine(work)  # before the data dir goes: the file system it was on
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for kind, runs in pairs.items():
        ratios = [t["msgs_per_s"] / u["msgs_per_s"] for u, t in runs]
        pooled = sum(t["msgs_per_s"] for _, t in runs) / sum(u["msgs_per_s"] for u, _ in runs)

        def med(key: str, traced: bool, runs: list = runs) -> float:
            return statistics.median(p[traced][key] for p in runs)

        low, high = median_interval(ratios)
        label = "single produce" if kind == "produce" else "batch of 100"
        suffix = f".c{args.connections}" if args.connections else ""
        rows.append(
            results.Row(
                f"trace.cost.{'single' if kind == 'produce' else 'batch'}{suffix}",
                f"{label} traced at {args.level} / untraced, wrk -c{conns[kind]}, median of {len(runs)} "
                f"pairs",
                f"traced {med('msgs_per_s', True):,.0f} msgs/s",
                f"untraced, same gateway, runs alternating: {med('msgs_per_s', False):,.0f} msgs/s",
                f"{statistics.median(ratios):.3f} ({low:.3f}–{high:.3f})",
                f"90 % interval of the median in brackets; pooled {pooled:.3f}; CPU µs/request "
                f"{med('cpu_us', False):.0f} → "
                f"{med('cpu_us', True):.0f}; p99 ms {med('p99_ms', False):.1f} → {med('p99_ms', True):.1f}",
                "pairs traced / untraced msgs/s: "
                + ", ".join(f"{t['msgs_per_s']:,.0f} / {u['msgs_per_s']:,.0f}" for u, t in runs),
            )
        )
    lines = [
        "- one gateway (embedded store, fsync always), topic of 8 queues, 100-byte messages; wrk runs "
        "alternating "
        "untraced and traced (the policy added and deleted between runs, A B B A): "
        + ", ".join(f"{k} {c} connections" for k, c in conns.items()),
        f"- the interval: the median of the pairs resampled with replacement ({RESAMPLES:,} times): how "
        f"far the "
        f"machine's noise leaves the figure; trace index: {lag}",
    ]
    results.record(args, f"produce traced at {args.level} vs untraced (trace --what cost)", rows, lines, m=m)
    return 0


# --- cpu: one process ---------------------------------------------------------------------------


async def cpu_run(variant: str, batch: int, conns: int, seconds: float) -> tuple[float, str]:
    """(event loop CPU µs per request, a line for the log) of a new gateway."""
    gw = await start(variant, batch)
    await gw.drive(conns, 1.0)  # warm up
    before, main_before, t0 = os.times(), time.thread_time(), time.monotonic()
    count = await gw.drive(conns, seconds)
    after, main_after, t1 = os.times(), time.thread_time(), time.monotonic()
    await gw.stop()
    main_us = (main_after - main_before) / count * 1e6
    process_us = (after.user - before.user + after.system - before.system) / count * 1e6
    line = (
        f"trace={variant} batch={batch}: {count * batch / (t1 - t0):,.0f} msgs/s, event loop CPU "
        f"{main_us:.1f} µs/request, process {process_us:.0f} µs/request"
    )
    return main_us, line


def cpu(args: argparse.Namespace) -> int:
    codes = {"this": None}
    if args.against:
        codes = {"this": str(BENCH_DIR.parent / "src"), "against": str(Path(args.against).resolve() / "src")}
    got: dict[tuple[str, str], list[float]] = {(c, v): [] for c in codes for v in ("off", "on")}
    inner = [
        sys.executable,
        RUN_PY,
        "trace",
        "--what",
        "cpu",
        "--batch",
        str(args.batch),
        "--callers",
        str(args.callers),
    ]
    for r in range(args.pairs):
        order = [(c, v) for c in codes for v in ("off", "on")]
        for code, variant in order if r % 2 == 0 else order[::-1]:
            if codes[code] is None:
                main_us, line = asyncio.run(cpu_run(variant, args.batch, args.callers, args.seconds))
            else:  # a process of its own with that checkout's code
                command = [*inner, "--seconds", str(args.seconds), "--inner", variant]
                out = (
                    procs.run_output(command, 600, {**os.environ, "PYTHONPATH": codes[code]})
                    .strip()
                    .splitlines()
                )
                main_us, line = json.loads(out[-1]), out[-2]
            got[(code, variant)].append(main_us)
            log(f"{code}: {line}")
    rows = []
    for code, where in codes.items():
        off, on = statistics.median(got[(code, "off")]), statistics.median(got[(code, "on")])
        commit = results.git_commit(Path(where)) if where else code_measured()
        rows.append(
            results.Row(
                f"trace.cpu.b{args.batch}" if code == "this" else "",
                f"event loop CPU per traced produce of {args.batch}, "
                f"in one process, {args.callers} callers, median of {args.pairs} pairs; code {code} "
                f"({commit})",
                f"traced {on:.1f} µs/request",
                f"untraced, runs alternating: {off:.1f} µs/request",
                f"{off / on:.3f}",
                f"+{on - off:.1f} µs; ratio untraced / traced CPU",
            )
        )
    title = "traced produce, event loop CPU in one process" + (
        ", two codes taking turns" if args.against else ""
    )
    measured = [f"- command measured: `{measured_line('cpu', args)}`"]
    results.record(args, title, rows, measured, commit=code_measured())
    return 0


# --- bytecodes --------------------------------------------------------------------------------------


class BytecodeCounter:
    """Bytecodes executed per function (file, first line, name) while on."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, int, str]] = Counter()

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            self.counts[(os.path.basename(code.co_filename), code.co_firstlineno, code.co_name)] += 1
        return self._local

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local


async def count_bytecodes(
    variant: str, batch: int, requests: int, callers: int
) -> dict[tuple[str, int, str], float]:
    """Bytecodes per request by function, of a gateway traced or not."""
    serving_collector()
    gw = await start(variant, batch)
    await gw.call_times(callers, 300)  # warm up
    counter = BytecodeCounter()
    sys.settrace(counter._global)
    try:
        await gw.call_times(callers, requests)
    finally:
        sys.settrace(None)
    await gw.stop()
    return {where: n / requests for where, n in counter.counts.items()}


def bytecodes(args: argparse.Namespace) -> int:
    off = asyncio.run(count_bytecodes("off", args.batch, args.requests, args.callers))
    on = asyncio.run(count_bytecodes("on", args.batch, args.requests, args.callers))
    total_off, total_on = sum(off.values()), sum(on.values())
    rows = [
        results.Row(
            f"trace.bytecodes.b{args.batch}",
            f"Python bytecodes per traced produce of {args.batch} (deterministic)",
            f"traced {total_on:,.0f}",
            f"untraced: {total_off:,.0f}",
            f"{total_off / total_on:.3f}",
            f"+{total_on - total_off:,.0f}; ratio untraced / traced",
        )
    ]
    changes = sorted(
        ((on.get(k, 0.0) - off.get(k, 0.0), k) for k in off.keys() | on.keys()), key=lambda c: -abs(c[0])
    )
    for d, where in changes[: args.top]:
        name = f"{where[0]}:{where[1]} {where[2]}"
        rows.append(
            results.Row(
                "",
                name,
                f"{on.get(where, 0.0):.1f}",
                f"untraced: {off.get(where, 0.0):.1f}",
                notes=f"{d:+.1f}",
            )
        )
    measured = [
        f"- command measured: `{measured_line('bytecodes', args)}`; per function: bytecodes per request "
        f"traced"
    ]
    results.record(
        args, "what tracing adds to a produce in Python bytecodes", rows, measured, commit=code_measured()
    )
    return 0


# --- instructions (callgrind) ------------------------------------------------------------------------


def slow_syncs(round_ms: float) -> list[int]:
    """Each group-commit round's fsync takes at least `round_ms` (wall time): under callgrind
    the event loop runs ~50x slower while fsync does not, so without it a round holds one or
    two requests and per-round work weighs per request many times what it does in a busy
    gateway. Returns the count of rounds, kept up to date."""
    from mqgate.durable import group_commit

    rounds, fsync_all = [0], group_commit._fsync_all

    def slow(fds: list[int]) -> None:
        until = time.monotonic() + round_ms / 1000
        fsync_all(fds)
        rounds[0] += 1
        time.sleep(max(0.0, until - time.monotonic()))

    group_commit._fsync_all = slow
    return rounds


async def drive_for_callgrind(variant: str, batch: int, requests: int, callers: int, round_ms: float) -> None:
    """Inside callgrind: a gateway of `variant`, 200 + `requests` requests from `callers`
    concurrent callers, its trace index fed to the end. Prints the rounds of group commit."""
    serving_collector()
    rounds = slow_syncs(round_ms)
    started = await start(variant, batch)
    tracing = started.tracing
    await tracing.indexer.close()  # fed below, in rounds of a busy gateway's size
    await started.call_times(callers, 200 + requests)
    print(f"rounds {rounds[0]}", flush=True)
    if variant not in ("off", "noindex"):
        await tracing.recorder.flush()
        while await tracing.indexer.step():
            pass
    await started.stop()


def callgrind(variant: str, args: argparse.Namespace, requests: int) -> tuple[int, int]:
    """Instructions and group-commit rounds of one callgrind run."""
    inner = f"{variant},{args.batch},{requests},{args.callers},{args.round_ms}"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        RUN_PY,
        "trace",
        "--what",
        "instructions",
        "--inner",
        inner,
    ]
    env = {**os.environ, "MQGATE_TRACE_INDEX_PROCESS": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    rounds = re.search(r"^rounds (\d+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None or rounds is None:
        raise SystemExit(f"callgrind run failed ({variant}, {requests}):\n{done.stderr[-3000:]}")
    return int(found.group(1)), int(rounds.group(1))


def instructions(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if args.large <= args.small:
        raise SystemExit("--large must be more than --small")
    counts: dict[str, tuple[float, float]] = {}
    for variant in variants_of(args, (*VARIANTS, "noindex")):
        with ThreadPoolExecutor(2) as pool:  # the two runs of a variant side by side (2 cores)
            low, high = pool.map(lambda n, v=variant: callgrind(v, args, n), (args.small, args.large))
        requests = args.large - args.small
        counts[variant] = ((high[0] - low[0]) / requests, requests / max(1, high[1] - low[1]))
        log(
            f"{variant}: {counts[variant][0]:,.0f} instructions per request, {counts[variant][1]:.1f} per "
            f"round"
        )
    base = counts.get("off", (0.0,))[0]
    rows = [
        results.Row(
            f"trace.instructions.b{args.batch}" if v == "on" and base else "",
            f"CPU instructions per produce of {args.batch}, variant {v} (callgrind, user space, one process)",
            f"{n:,.0f}",
            f"off: {base:,.0f}" if base else "—",
            f"{base / n:.3f}" if base else "—",
            f"{n - base:+,.0f} over off; {per:.1f} requests per round"
            if base
            else f"{per:.1f} requests per round",
        )
        for v, (n, per) in counts.items()
    ]
    measured = [
        f"- command measured: `{measured_line('instructions', args)}`; repeated runs agree within 1–4 %"
    ]
    results.record(
        args,
        "what tracing costs a produce in instructions (callgrind)",
        rows,
        measured,
        commit=code_measured(),
    )
    return 0


# --- phases -----------------------------------------------------------------------------------------


async def phase(gw: Started, conns: int, seconds: float, counted: bool = True) -> None:
    cpu, wall = time.thread_time(), time.perf_counter()
    count = await gw.drive(conns, seconds)
    if counted:
        gw.cpu_s += time.thread_time() - cpu
        gw.wall_s += time.perf_counter() - wall
        gw.requests += count


async def run_phases(variants: list[str], args: argparse.Namespace) -> list[Started]:
    gateways = [await start(v, args.batch) for v in variants]
    try:
        for gw in gateways:
            await phase(gw, args.callers, 1.5, counted=False)  # warm up (the index writer process starts)
        for k in range(args.phases):
            for gw in gateways if k % 2 == 0 else gateways[::-1]:
                await phase(gw, args.callers, args.seconds)
    finally:
        for gw in gateways:
            await gw.stop()
    return gateways


def phases(args: argparse.Namespace) -> int:
    variants = variants_of(args, VARIANTS)
    serving_collector()
    gateways = asyncio.run(run_phases(variants, args))
    base = gateways[0]
    base_cpu, base_wall = base.cpu_s / base.requests * 1e6, base.wall_s / base.requests * 1e6
    rows = []
    for gw in gateways:
        cpu_us, wall = gw.cpu_s / gw.requests * 1e6, gw.wall_s / gw.requests * 1e6
        rows.append(
            results.Row(
                f"trace.phases.b{args.batch}" if gw is gateways[-1] and gw is not base else "",
                f"event loop CPU per produce of {args.batch}, variant {gw.variant}, phases taking turns in "
                f"one process",
                f"{cpu_us:.1f} µs/request",
                f"{base.variant}: {base_cpu:.1f} µs/request",
                f"{base_wall / wall:.3f}",
                f"{cpu_us - base_cpu:+.1f} µs; ratio: throughput against {base.variant}",
                f"wall {wall:.1f} µs/request; {gw.requests:,} requests; the variants' order moves the "
                f"figures",
            )
        )
    measured = [f"- command measured: `{measured_line('phases', args)}`"]
    results.record(
        args, "where a traced produce's event loop time goes", rows, measured, commit=code_measured()
    )
    return 0


# --- lookups: the writer, the indexer, a big index of events ------------------------------------------

PROJECT, HOPS_PER_MESSAGE, HOT_KEYS = "bench", 5, 10  # hot keys: carried by every 1000th message


def request_id(n: int) -> str:
    return f"{(n * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF:016x}"  # random order in the index


def message_key(n: int, messages: int) -> str:
    return f"order-{n % max(1, messages // 4)}"  # about 4 messages per key


def hop_maker(project: str = PROJECT) -> Any:
    """`hops(n, msg_id, messages, t0)`: the 5 trace events of message n of a load-test trace."""
    from mqgate.tracing.events import Resource, TraceEvent

    resource = Resource("gw-bench-1", "bench-host", "mqgate", 8080)
    context = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"

    def hops(n: int, msg_id: str, messages: int, t0: int) -> list[Any]:
        keys = [message_key(n, messages)] + ([f"hot-{n // 1000 % HOT_KEYS}"] if n % 1000 == 0 else [])
        req = request_id(n)
        common: dict[str, Any] = {"project": project, "topic": "orders", "resource": resource, "keys": keys}
        plan: list[tuple[Any, int, dict[str, Any]]] = [
            ("accepted", 0, {"producer": "web", "traceparent": context}),
            ("stored", 1, {"queue": n % 8, "offset": n // 8}),
            ("delivered", 20, {"consumer": "billing", "client_id": "w-3", "request_id": req}),
            ("acked", 35, {"consumer": "billing", "client_id": "w-3", "request_id": req}),
            ("committed", 60, {"consumer": "spark-job"}),
        ]
        return [TraceEvent(msg_id=msg_id, hop=h, time_ms=t0 + dt, **common, **f) for h, dt, f in plan]

    return hops


async def write_all(recorder: Any, messages: int, writers: int, project: str = PROJECT) -> float:
    from mqgate.core.ids import new_message_ids

    t0 = int(time.time() * 1000)
    ids = new_message_ids(t0, messages)
    hops = hop_maker(project)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(messages):
        queue.put_nowait(n)

    async def writer() -> None:
        while not queue.empty():
            n = queue.get_nowait()
            await recorder.record(hops(n, ids[n], messages, t0 + n))

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - started


async def write_and_index(work: Path, events: int, writers: int) -> dict[str, float]:
    from mqgate.store.backends.embedded import EmbeddedStore
    from mqgate.tracing.events import trace_topic
    from mqgate.tracing.index import TraceIndex
    from mqgate.tracing.indexer import TraceIndexer
    from mqgate.tracing.recorder import TraceRecorder

    messages = events // HOPS_PER_MESSAGE
    out: dict[str, float] = {}
    store = EmbeddedStore(work / "store")
    await store.open()
    try:
        recorder = TraceRecorder(store)
        out["writer_events_s"] = messages * HOPS_PER_MESSAGE / await write_all(recorder, messages, writers)
        out["writer_appends"] = recorder.counters.appends
        await recorder.close()

        index = TraceIndex(f"sqlite:///{work}/alone.sqlite")
        index.create_schema()
        indexer = TraceIndexer(store, index)
        indexer.add_topic(trace_topic(PROJECT))
        started = time.perf_counter()
        await indexer.run_until_caught_up(timeout_s=3600)
        out["indexer_events_s"] = indexer.counters.indexed / (time.perf_counter() - started)
        index.dispose()

        # Together: a new project's topic, so the indexer starts at zero while the writer runs.
        index = TraceIndex(f"sqlite:///{work}/together.sqlite")
        index.create_schema()
        indexer = TraceIndexer(store, index, idle_wait_s=0.05)
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        max_lag = 0
        indexer.start()
        writing = asyncio.create_task(write_all(recorder, messages, writers, PROJECT + "-2"))
        while not writing.done():
            await asyncio.sleep(0.05)
            max_lag = max(max_lag, (await indexer.lag_now()).events)
        write_s = await writing
        wrote_at = time.perf_counter()
        while (await indexer.lag_now()).events > 0:
            await asyncio.sleep(0.01)
        out["together_writer_events_s"] = messages * HOPS_PER_MESSAGE / write_s
        out["together_max_lag_events"] = max_lag
        out["together_catch_up_s"] = time.perf_counter() - wrote_at
        await indexer.close()
        await recorder.close()
        index.dispose()
    finally:
        await store.close()
    return out


def fill_events(index: Any, events: int) -> tuple[float, list[str]]:
    """Bulk-load `events` events; return the seconds taken and the message ids."""
    from mqgate.core.ids import new_message_ids
    from mqgate.tracing.events import encode_event
    from mqgate.tracing.index import IndexRow

    messages = events // HOPS_PER_MESSAGE
    t0 = int(time.time() * 1000) - 3_600_000
    ids = new_message_ids(t0, messages)
    hops = hop_maker()
    started, next_id, chunk = time.perf_counter(), 1, 20_000  # messages per transaction (100,000 events)
    for low in range(0, messages, chunk):
        rows = []
        for n in range(low, min(messages, low + chunk)):
            for e in hops(n, ids[n], messages, t0 + n // 100):
                rows.append(
                    (next_id, IndexRow(e.msg_id, e.request_id, e.time_ms, e.keys, encode_event(e).decode()))
                )
                next_id += 1
        index.bulk_load(rows)
        if low % (chunk * 25) == 0:
            log(f"  filled {next_id - 1:,} events")
    return time.perf_counter() - started, ids


def timed(lookup: Any, values: list[Any]) -> list[float]:
    """Milliseconds of each look-up (each must find something)."""
    ms = []
    for value in values:
        t0 = time.perf_counter()
        assert lookup(value), value
        ms.append((time.perf_counter() - t0) * 1000)
    return ms


def spread(ms: list[float]) -> str:
    return f"p50 {statistics.median(ms):.2f} ms · p99 {percentile(ms, 0.99):.2f} ms · max {max(ms):.2f} ms"


def lookups(args: argparse.Namespace) -> int:
    from mqgate.tracing.index import TraceIndex

    work = args.dir or Path(tempfile.mkdtemp(prefix="trace-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    table: list[list[str]] = []
    found: dict[str, list[float]] = {}
    try:
        if not args.skip_pipeline:
            p = asyncio.run(write_and_index(work, args.pipeline_events, args.writers))
            table += [
                ["writer (record, 5 hops per call, embedded store)", f"{p['writer_events_s']:,.0f} events/s"],
                ["writer store appends", f"{p['writer_appends']:,.0f}"],
                ["indexer alone (store → SQLite)", f"{p['indexer_events_s']:,.0f} events/s"],
                ["writer while indexing", f"{p['together_writer_events_s']:,.0f} events/s"],
                ["index lag while writing (max)", f"{p['together_max_lag_events']:,.0f} events"],
                ["index caught up after the last write", f"{p['together_catch_up_s'] * 1000:,.0f} ms"],
            ]
        db = work / "lookup.sqlite"
        index = TraceIndex(f"sqlite:///{db}")
        index.create_schema()
        seconds, ids = fill_events(index, args.events)
        table += [
            ["bulk fill", f"{args.events:,} events in {seconds:,.0f} s ({args.events / seconds:,.0f}/s)"],
            ["index file", f"{db.stat().st_size / 2**30:.2f} GiB"],
        ]
        index.dispose()
        index = TraceIndex(f"sqlite:///{db}")  # a fresh engine: nothing cached in Python
        rng, messages = random.Random(11), len(ids)
        found = {"msgId": [], "requestId": [], "key": [], "hot key": []}
        for _ in range(args.lookups):
            n = rng.randrange(messages)
            for name, kwargs in (
                ("msgId", {"msg_id": ids[n]}),
                ("requestId", {"request_id": request_id(n)}),
                ("key", {"key": message_key(n, messages)}),
            ):
                started = time.perf_counter()
                paths = index.paths(**kwargs)
                found[name].append((time.perf_counter() - started) * 1000)
                assert paths and all(len(p.hops) == HOPS_PER_MESSAGE for p in paths), (name, kwargs)
        found["hot key"] = timed(
            lambda k: index.paths(key=f"hot-{k}"),
            [rng.randrange(HOT_KEYS) for _ in range(max(10, args.lookups // 20))],
        )
        table += [[f"lookup by {name} ({len(ms)})", spread(ms)] for name, ms in found.items()]
        index.dispose()
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    row = results.Row(
        "trace.lookups",
        f"trace look-up by msgId in an SQLite index of {args.events:,} events",
        f"p99 {percentile(found['msgId'], 0.99):.2f} ms",
        "—",
        "—",
        f"by requestId p99 {percentile(found['requestId'], 0.99):.2f} ms, by key p99 "
        f"{percentile(found['key'], 0.99):.2f} ms "
        "(targets p99 < 50 / 200 ms)",
    )
    rows = [row, *(results.Row("", name, value) for name, value in table)]
    results.record(args, "trace writer, indexer and look-ups (trace --what lookups)", rows)
    return 0


def rounds(args: argparse.Namespace) -> int:
    """Look-ups in an index of round records, filled through the index writer's own path."""
    from mqgate.core.ids import new_message_ids
    from mqgate.tracing.batch import TraceBatch, TraceRound
    from mqgate.tracing.events import Resource
    from mqgate.tracing.index import PositionMove, TraceIndex
    from mqgate.tracing.index_writer import decode_and_write
    from mqgate.tracing.recorder import encode_for_store

    gateway, context = Resource("bench:8080", "bench", "mqgate", 8080), f"00-{'1' * 32}-{'2' * 16}-01"
    with tempfile.TemporaryDirectory(prefix="mqgate-round-bench-") as work:
        index = TraceIndex(f"sqlite:///{work}/trace-index.sqlite")
        index.create_schema()
        every: list[str] = []
        ts, offset, position, pending = 1_700_000_000_000, 0, None, []
        t0 = time.perf_counter()
        for r in range(args.records):
            batches = []
            for _ in range(args.per_round):
                ids = new_message_ids(ts, args.batch)
                ts += 1
                every += ids
                batches.append(
                    TraceBatch(
                        kind="batch",
                        hops=["accepted", "stored"],
                        time_ms=ts,
                        last_ms=ts + 1,
                        project="bench",
                        topic="orders",
                        resource=gateway,
                        msg_ids=ids,
                        queue=0,
                        first_offset=offset,
                        producer="bench-p",
                        keys=[[f"k{i}"] for i in ids],
                        traceparent=context,
                        bodies=["x" * 100] * args.batch,
                    )
                )
                offset += args.batch
            pending.append(encode_for_store(TraceRound(kind="round", batches=batches), ts))
            if len(pending) == 500 or r == args.records - 1:
                moved = (position or 0) + len(pending)
                decode_and_write(index, pending, {("%TRACE%bench", 0): PositionMove(position, moved)})
                position, pending = moved, []
        seconds = time.perf_counter() - t0
        size = os.path.getsize(f"{work}/trace-index.sqlite")
        sample = random.sample(every, args.lookups)
        by_id = timed(lambda m: index.paths(msg_id=m), sample)
        by_key = timed(lambda m: index.paths(key=f"k{m}"), sample[: args.lookups // 4])
        index.dispose()
    table = [
        ["messages (events)", f"{len(every):,} ({2 * len(every):,})"],
        ["fill (encode + index writer path)", f"{2 * len(every) / seconds:,.0f} events/s"],
        ["index file", f"{size / 2**20:,.0f} MiB"],
        ["lookup by msgId", spread(by_id)],
        ["lookup by key", spread(by_key)],
    ]
    row = results.Row(
        "trace.rounds",
        f"trace look-up by msgId in an index of {args.records:,} round records ({len(every):,} messages)",
        f"p99 {percentile(by_id, 0.99):.2f} ms",
        "—",
        "—",
        f"by key p99 {percentile(by_key, 0.99):.2f} ms",
    )
    rows = [row, *(results.Row("", name, value) for name, value in table)]
    results.record(args, "trace look-ups in an index of round records (trace --what rounds)", rows)
    return 0


# --- the subcommand ---------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    given = {
        k for k, v in vars(args).items() if v not in (None, False) and any(k in d for d in WHATS.values())
    }
    if wrong := given - WHATS[args.what].keys():
        raise SystemExit(
            f"--what {args.what} takes no {', '.join('--' + w.replace('_', '-') for w in sorted(wrong))}"
        )
    for k, v in WHATS[args.what].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.inner:  # a run inside another process (cpu --against, instructions under callgrind)
        if args.what == "cpu":
            main_us, line = asyncio.run(cpu_run(args.inner, args.batch, args.callers, args.seconds))
            print(line, json.dumps(main_us), sep="\n")
        else:
            v, b, r, c, ms = args.inner.split(",")
            asyncio.run(drive_for_callgrind(v, int(b), int(r), int(c), float(ms)))
        return 0
    return {
        "cost": cost,
        "cpu": cpu,
        "bytecodes": bytecodes,
        "instructions": instructions,
        "phases": phases,
        "lookups": lookups,
        "rounds": rounds,
    }[args.what](args)


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "trace", __doc__, help="what tracing costs a produce, and trace look-ups (--what ...)"
    )
    p.add_argument("--what", choices=list(WHATS), default="cost", help="the measurement (default cost)")
    p.add_argument("--pairs", type=int, help="cost, cpu: untraced/traced pairs (A B B A)")
    p.add_argument(
        "--seconds", type=float, help="cost: per wrk run; cpu: per measured run; phases: per phase"
    )
    p.add_argument("--level", choices=("info", "error", "debug"), help="cost: the trace policy's level")
    p.add_argument("--kinds", help="cost: produce,batch")
    p.add_argument(
        "--connections", type=int, help="cost: wrk connections for every kind (default 64 single, 16 batch)"
    )
    p.add_argument(
        "--threads", action="store_true", default=None, help="cost: log the CPU per request of each thread"
    )
    p.add_argument("--batch", type=int, help="messages per request (1: /mq/produce)")
    p.add_argument(
        "--callers", "--conns", type=int, help="cpu, bytecodes, instructions, phases: concurrent callers"
    )
    p.add_argument(
        "--against", help="cpu: another checkout; each run a process of its own, the two codes taking turns"
    )
    p.add_argument("--requests", type=int, help="bytecodes: requests counted per variant")
    p.add_argument("--top", type=int, help="bytecodes: functions listed")
    p.add_argument(
        "--variants", help=f"instructions, phases: out of {', '.join(VARIANTS)} (instructions also noindex)"
    )
    p.add_argument("--small", type=int, help="instructions: requests of the first run")
    p.add_argument("--large", type=int, help="instructions: requests of the second run")
    p.add_argument(
        "--round-ms", type=float, help="instructions: each group-commit round lasts at least this long (wall)"
    )
    p.add_argument("--phases", type=int, help="phases: phases per variant")
    p.add_argument("--events", type=int, help="lookups: events in the look-up index")
    p.add_argument("--pipeline-events", type=int, help="lookups: events through the writer and indexer")
    p.add_argument("--writers", type=int, help="lookups: concurrent writer tasks")
    p.add_argument("--lookups", type=int, help="lookups, rounds: random look-ups")
    p.add_argument("--dir", type=Path, help="lookups: work directory (default: a temp one)")
    p.add_argument("--keep", action="store_true", default=None, help="lookups: keep the work directory")
    p.add_argument("--skip-pipeline", action="store_true", default=None, help="lookups: only the look-ups")
    p.add_argument("--records", type=int, help="rounds: round records")
    p.add_argument("--per-round", type=int, help="rounds: requests (batches) per round record")
    p.add_argument("--inner", help=argparse.SUPPRESS)
    p.set_defaults(func=main)
