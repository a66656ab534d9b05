"""The gateway's CPU per produce with tracing off vs every message traced (issue 11), measured in
one process: the ASGI app driven directly by concurrent callers, no HTTP and no load generator
sharing the CPU, so the figure moves far less with the machine's other load than wrk's
throughput does. The figure is the event loop's own CPU time per request (the thread that
limits a gateway's throughput; fsync threads and the trace index writer process apart), as the
median over runs alternating untraced and traced (A B B A), a new app each run.

    PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --batch 1 --conns 64 [--rounds 8]
    PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --batch 100 --conns 16
    PYTHONPATH=<another checkout>/src .venv/bin/python benchmarks/trace_cpu_bench.py  (its code)
    PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --against <another checkout>
        (both codes, each run a process of its own, taking turns)

--results appends the figures to benchmarks/RESULTS.md with the commit of the code measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mqgate
from mqgate.api.app import build_app
from mqgate.services.tracing import Tracing
from mqgate.settings import load_settings

ADMIN = "admintoken-0123456789abcdef"


async def call(app: Any, path: str, body: bytes, token: str) -> tuple[int, bytes]:
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

    app: Any
    tracing: Tracing
    token: str
    path: str  # what a request posts, and its body
    body: bytes
    lifespan: asyncio.Queue[dict[str, str]]
    running: asyncio.Task[None]
    data_dir: str

    async def drive(self, conns: int, seconds: float) -> int:
        """`conns` callers posting requests for `seconds`: how many were answered (all 200)."""
        count = 0
        until = time.monotonic() + seconds

        async def caller() -> None:
            nonlocal count
            while time.monotonic() < until:
                status, answer = await call(self.app, self.path, self.body, self.token)
                assert status == 200, answer
                count += 1

        await asyncio.gather(*(caller() for _ in range(conns)))
        return count

    async def call_times(self, conns: int, requests: int) -> None:
        """`requests` requests (all 200) from `conns` concurrent callers."""
        left = requests

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                status, answer = await call(self.app, self.path, self.body, self.token)
                assert status == 200, answer

        await asyncio.gather(*(caller() for _ in range(conns)))

    async def stop(self) -> None:
        await self.lifespan.put({"type": "lifespan.shutdown"})
        await self.running
        shutil.rmtree(self.data_dir, ignore_errors=True)


async def start(trace: bool, batch: int) -> Started:
    """A gateway whose requests produce `batch` messages (1: /mq/produce), every one traced at
    info by a project policy when `trace`."""
    data_dir = os.environ["MQGATE_DATA_DIR"] = tempfile.mkdtemp(prefix="mqgate-trace-cpu-")
    os.environ["MQGATE_ADMIN_TOKEN"] = ADMIN
    before = {id(o) for o in gc.get_objects() if isinstance(o, Tracing)}
    app = build_app(load_settings())
    [tracing] = [o for o in gc.get_objects() if isinstance(o, Tracing) and id(o) not in before]
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
    if trace:
        await admin("/admin/trace-policies", mode="project", project="default", level="info")
    message = {"message": "x" * 100}
    if batch == 1:
        path, body = "/mq/produce", json.dumps({"producer": "bp", **message}).encode()
    else:
        many = {"producer": "bp", "messages": [message] * batch}
        path, body = "/mq/produce/batch", json.dumps(many).encode()
    return Started(app, tracing, token, path, body, lifespan, running, data_dir)


async def measure(trace: bool, batch: int, conns: int, seconds: float) -> tuple[float, float, str]:
    """(main thread CPU µs per request, messages per second, a line for the log)."""
    gw = await start(trace, batch)
    await gw.drive(conns, 1.0)  # warm up
    before, main_before, t0 = os.times(), time.thread_time(), time.monotonic()
    count = await gw.drive(conns, seconds)
    after, main_after, t1 = os.times(), time.thread_time(), time.monotonic()
    await gw.stop()
    main_us = (main_after - main_before) / count * 1e6
    process_us = (after.user - before.user + after.system - before.system) / count * 1e6
    rate = count * batch / (t1 - t0)
    line = (
        f"trace={'on' if trace else 'off'} batch={batch}: {rate:,.0f} msgs/s, event loop CPU "
        f"{main_us:.1f} µs/request, process {process_us:.0f} µs/request"
    )
    return main_us, rate, line


def code_commit(src: Path | None = None) -> str:
    """The commit of the mqgate code measured (PYTHONPATH may name another checkout), or of the
    checkout whose source folder is `src`."""
    where = Path(mqgate.__file__).resolve().parent if src is None else src
    try:
        found = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--", "."], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return found.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="messages per request (1: /mq/produce)")
    parser.add_argument("--conns", type=int, default=64, help="concurrent callers")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run")
    parser.add_argument("--rounds", type=int, default=4, help="off/on pairs (A B B A)")
    parser.add_argument("--results", action="store_true", help="append to benchmarks/RESULTS.md")
    parser.add_argument(
        "--against", help="another checkout: each run a process of its own, the two codes taking turns"
    )
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        main_us, _, line = asyncio.run(measure(args.inner == "on", args.batch, args.conns, args.seconds))
        print(line, file=sys.stderr)
        print(json.dumps(main_us))
        return
    if args.against:
        compare(args)
        return
    got: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for trace in (False, True) if r % 2 == 0 else (True, False):
            main_us, _, line = asyncio.run(measure(trace, args.batch, args.conns, args.seconds))
            got[trace].append(main_us)
            print(line, flush=True)
    off, on = statistics.median(got[False]), statistics.median(got[True])
    summary = (
        f"batch={args.batch}, {args.rounds} pairs: event loop CPU per request untraced {off:.1f} µs, "
        f"traced {on:.1f} µs (+{on - off:.1f}); ratio {off / on:.3f}"
    )
    print(summary)
    if args.results:
        command = (
            f"PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --batch {args.batch} "
            f"--conns {args.conns} --rounds {args.rounds} --seconds {args.seconds:g}"
        )
        append_results(
            "traced produce, event loop CPU in one process (trace_cpu_bench.py)", command, f"- {summary}"
        )


def compare(args: argparse.Namespace) -> None:
    """This code and the checkout `args.against`, each run a process of its own: per round, both
    codes untraced and traced (the order reversed every other round), so that the machine's
    drift falls on both alike."""
    here = Path(__file__).resolve()
    codes = {"this": str(here.parent.parent / "src"), "against": str(Path(args.against).resolve() / "src")}
    got: dict[tuple[str, str], list[float]] = {(c, v): [] for c in codes for v in ("off", "on")}
    for r in range(args.rounds):
        order = [(c, v) for c in codes for v in ("off", "on")]
        for code, variant in order if r % 2 == 0 else order[::-1]:
            inner = [sys.executable, str(here), "--inner", variant, "--batch", str(args.batch)]
            inner += ["--conns", str(args.conns), "--seconds", str(args.seconds)]
            done = subprocess.run(
                inner,
                env={**os.environ, "PYTHONPATH": codes[code]},
                capture_output=True,
                text=True,
                check=True,
            )
            got[(code, variant)].append(float(done.stdout.strip().splitlines()[-1]))
            print(f"{code}: {done.stderr.strip().splitlines()[-1]}", flush=True)
    lines = [
        "| code | event loop CPU µs/request untraced | traced | extra | untraced/traced |",
        "|---|---:|---:|---:|---:|",
    ]
    for code, where in codes.items():
        off, on = statistics.median(got[(code, "off")]), statistics.median(got[(code, "on")])
        name = f"{code} ({code_commit(Path(where))})"
        lines.append(f"| {name} | {off:.1f} | {on:.1f} | +{on - off:.1f} | {off / on:.3f} |")
    command = (
        f"PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --against {args.against} "
        f"--batch {args.batch} --conns {args.conns} --rounds {args.rounds} --seconds {args.seconds:g}"
    )
    title = "traced produce, event loop CPU in one process, two codes taking turns (trace_cpu_bench.py)"
    report_table(lines, args.results, title, command)


def report_table(lines: list[str], results: bool, title: str, command: str) -> None:
    """Print a Markdown table; with `results`, append it to RESULTS.md as `append_results` does."""
    print("\n".join(lines))
    if results:
        append_results(title, command, "\n" + "\n".join(lines))


def append_results(title: str, command: str, body: str) -> None:
    """A dated section of benchmarks/RESULTS.md: the command, the measured code's commit, `body`."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(Path(__file__).resolve().parent / "RESULTS.md", "a", encoding="utf-8") as out:
        out.write(
            f"\n## {when} — {title}\n\n"
            f"- command: `{command}`; code measured: git {code_commit()}; {os.cpu_count()} CPUs\n"
            f"{body}\n"
        )


if __name__ == "__main__":
    main()
