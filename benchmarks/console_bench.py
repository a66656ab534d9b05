"""Console page times at scale (issue 13): a gateway with 1,000 topics and 5,000 consumers,
every console page's server time (p50/p95 over N requests) and size.

    .venv/bin/python benchmarks/console_bench.py                       # 1,000 topics, 5,000 consumers
    .venv/bin/python benchmarks/console_bench.py --topics 100 --consumers 500 --requests 20
    .venv/bin/python benchmarks/console_bench.py --results benchmarks/RESULTS.md   # append a section
    .venv/bin/python benchmarks/console_bench.py --keep     # keeps the temp directory, then:
    .venv/bin/python benchmarks/console_bench.py --reuse /tmp/mqgate-console-bench-XXXX/data  # measure again

What it does:
1. starts `python -m mqgate.cli serve` (embedded store, fsync interval:50, SQLite registry) in a
   temp directory and adds an admin console user with `mqgate.cli.user`;
2. through the admin API (as an operator's scripts would, so every change is also audited),
   with `--conns` concurrent connections: `--projects` projects, `--topics` topics (2 queues,
   spread over the projects), one producer per topic, `--consumers` consumers (spread evenly
   over the topics; every 10th with an alert threshold), then 20 messages into each of the
   first 50 topics (lag and messages to browse);
3. signs in through the form and GETs each page `--requests` times one after another (after 3
   unmeasured ones), reading the page's own server time from its `Server-Timing` header (the
   console's time from the request read to the page made) and the client's time to the last
   byte; prints a Markdown table: p50/p95/max server ms, p95 client ms, bytes, and whether
   the page meets the targets (p95 < 100 ms, at most 500 KB).

Everything targets 127.0.0.1; the client shares the machine with the gateway.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import ROOT, machine

PASSWORD = "bench password 1"
P95_TARGET_MS = 100.0
SIZE_TARGET = 500 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Gateway:
    def __init__(self, root: Path, data: Path | None = None) -> None:
        self.root = root
        self.data = data or root / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = "mqa_bench_" + secrets.token_hex(8)
        self.env = {**os.environ, "MQGATE_ADMIN_TOKEN": self.token, "PYTHONPATH": str(ROOT / "src")}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, fresh: bool = True) -> None:
        if fresh:
            self.add_user()
        self.serve()

    def add_user(self) -> None:
        self.data.mkdir(parents=True)
        user = [sys.executable, "-m", "mqgate.cli.user", "add", "bench", "--role", "admin",
                "--password-stdin", "--data-dir", str(self.data)]  # fmt: skip
        subprocess.run(user, input=PASSWORD + "\n", text=True, check=True, env=self.env, capture_output=True)

    def serve(self) -> None:
        log = open(self.root / "gateway.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from mqgate.cli import main; sys.exit(main())", "serve",
             "--host", "127.0.0.1", "--port", str(self.port),
             "--data-dir", str(self.data), "--fsync", "interval:50"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the gateway exited: {(self.root / 'gateway.log').read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("the gateway did not answer /healthz within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def fill(gw: Gateway, args: argparse.Namespace) -> dict[str, Any]:
    """Projects, topics, producers, consumers and some messages, through the admin API."""
    headers = {"Authorization": f"Bearer {gw.token}"}
    limits = httpx.Limits(max_connections=args.conns)
    client = httpx.Client(base_url=gw.url, headers=headers, timeout=120, limits=limits)
    tokens: dict[str, str] = {}

    def call(method: str, path: str, body: dict[str, Any]) -> Any:
        r = client.request(method, path, json=body)
        if r.status_code != 200:
            raise SystemExit(f"{method} {path} {body}: {r.status_code} {r.text[:300]}")
        return r.json()["result"]

    def run(jobs: list[tuple[str, str, dict[str, Any]]], what: str) -> list[Any]:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.conns) as pool:
            out = list(pool.map(lambda j: call(*j), jobs))
        took = time.monotonic() - started
        print(f"  {len(jobs):,} {what} in {took:.1f} s ({len(jobs) / took:.0f}/s)", flush=True)
        return out

    projects = [f"proj{i}" for i in range(args.projects)]
    topics = [f"t{i:04d}" for i in range(args.topics)]
    consumers = [f"{topics[i % len(topics)]}-c{i // len(topics)}" for i in range(args.consumers)]
    started = time.monotonic()
    run([("POST", "/admin/projects", {"name": p}) for p in projects], "projects")
    run([("POST", "/admin/topics", {"name": t, "queues": 2, "project": projects[i % len(projects)]})
         for i, t in enumerate(topics)], "topics")  # fmt: skip
    made = run([("POST", "/admin/producers", {"name": f"{t}-p", "topic": t}) for t in topics], "producers")
    tokens = {t: m["token"] for t, m in zip(topics, made, strict=True)}
    run([("POST", "/admin/consumers", {"name": c, "topic": c.rsplit("-", 1)[0], "start": "earliest"})
         for c in consumers], "consumers")  # fmt: skip
    run(
        [("POST", f"/admin/consumers/{c}/alert", {"backlog": 10}) for c in consumers[::10]],
        "alert thresholds",
    )
    batch = [{"message": f'{{"order": {i}, "note": "bench"}}', "keys": [f"k{i}"]} for i in range(20)]
    for t in topics[:50]:
        r = httpx.post(gw.url + "/mq/produce/batch", json={"producer": f"{t}-p", "messages": batch},
                       headers={"Authorization": f"Bearer {tokens[t]}"}, timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
    client.close()
    return {"fill_s": time.monotonic() - started, "topic": topics[0], "consumer": consumers[0],
            "project": projects[0]}  # fmt: skip


def sign_in(gw: Gateway) -> httpx.Client:
    client = httpx.Client(base_url=gw.url, timeout=120)
    client.get("/console/signin")
    token = client.cookies["mqgate_console_signin"]
    r = client.post("/console/signin", data={"name": "bench", "password": PASSWORD, "signin_token": token})
    if r.status_code != 303:
        raise SystemExit(f"sign-in failed: {r.status_code} {r.text[:300]}")
    return client


def pages(f: dict[str, Any]) -> list[tuple[str, str]]:
    t, c, p = f["topic"], f["consumer"], f["project"]
    return [
        ("overview", "/console/"),
        ("overview, live part", "/console/live/overview"),
        ("projects", "/console/projects"),
        ("project", f"/console/projects/{p}"),
        ("project, health part", f"/console/live/projects/{p}/health"),
        ("topics", "/console/topics"),
        ("topics, last page", "/console/topics?page=last"),
        ("producers & consumers", "/console/clients"),
        ("producers & consumers, last page", "/console/clients?page=last"),
        ("consumer", f"/console/consumers/{c}"),
        ("consumer, live part", f"/console/live/consumers/{c}"),
        ("dead letters", f"/console/consumers/{c}/dead-letters"),
        ("messages", "/console/messages"),
        ("messages of a topic", f"/console/messages?topic={t}"),
        ("tail of a topic", f"/console/live/tail?topic={t}&from=0:0,1:0"),
        ("traces", "/console/traces"),
        ("trace policies", "/console/traces/policies"),
        ("charts (hour)", "/console/charts?range=hour"),
        ("charts (week)", "/console/charts?range=week"),
        ("charts, live part", "/console/live/charts?range=hour"),
        ("applications", "/console/applications"),
        ("audit", "/console/audit"),
        ("users", "/console/users"),
    ]


def measure(client: httpx.Client, path: str, n: int) -> dict[str, Any]:
    server: list[float] = []
    wall: list[float] = []
    size = 0
    for i in range(n + 3):
        started = time.perf_counter()
        r = client.get(path)
        took = (time.perf_counter() - started) * 1000
        if r.status_code != 200:
            raise SystemExit(f"GET {path}: {r.status_code} {r.text[:300]}")
        if i < 3:
            continue
        found = re.search(r"dur=([\d.]+)", r.headers.get("server-timing", ""))
        server.append(float(found.group(1)) if found else float("nan"))
        wall.append(took)
        size = max(size, len(r.content))
    return {
        "p50": percentile(server, 0.5),
        "p95": percentile(server, 0.95),
        "max": max(server),
        "wall_p95": percentile(wall, 0.95),
        "bytes": size,
    }


def report(
    rows: list[tuple[str, str, dict[str, Any]]], args: argparse.Namespace, info: dict[str, Any]
) -> str:
    out = [
        "| page | path | server p50 ms | server p95 ms | server max ms | client p95 ms | bytes "
        "| meets targets |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, path, m in rows:
        ok = m["p95"] < P95_TARGET_MS and m["bytes"] <= SIZE_TARGET
        out.append(
            f"| {name} | `{path.removeprefix('/console')}` | {m['p50']:.1f} | {m['p95']:.1f} "
            f"| {m['max']:.1f} | {m['wall_p95']:.1f} | {m['bytes']:,} | {'yes' if ok else '**no**'} |"
        )
    missed = [name for name, _, m in rows if not (m["p95"] < P95_TARGET_MS and m["bytes"] <= SIZE_TARGET)]
    out.append("")
    out.append(f"Pages missing a target: {', '.join(missed) if missed else 'none'}.")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000, help="topics to create (default 1000)")
    parser.add_argument("--consumers", type=int, default=5000, help="consumers to create (default 5000)")
    parser.add_argument(
        "--projects", type=int, default=5, help="projects the topics are spread over (default 5)"
    )
    parser.add_argument("--requests", type=int, default=50, help="measured GETs per page (default 50)")
    parser.add_argument(
        "--conns", type=int, default=8, help="concurrent connections while filling (default 8)"
    )
    parser.add_argument(
        "--results", type=Path, help="append the section to this file (e.g. benchmarks/RESULTS.md)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (gateway log, data)")
    reuse = "measure on the data directory of a --keep run (no filling; --topics, --consumers and --projects "
    parser.add_argument("--reuse", type=Path, help=reuse + "must be those of that run)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mqgate-console-bench-"))
    gw = Gateway(root, args.reuse)
    try:
        gw.start(fresh=args.reuse is None)
        if args.reuse is None:
            print(f"gateway on {gw.url}; filling:", flush=True)
            f = fill(gw, args)
        else:
            f = {"fill_s": 0.0, "topic": "t0000", "consumer": "t0000-c0", "project": "proj0"}
            print(f"gateway on {gw.url} over {args.reuse}; waiting 20 s for its start-up passes", flush=True)
            time.sleep(20)
        print(f"filled in {f['fill_s']:.0f} s; measuring {args.requests} GETs per page", flush=True)
        client = sign_in(gw)
        rows = []
        for name, path in pages(f):
            m = measure(client, path, args.requests)
            rows.append((name, path, m))
            print(
                f"  {name:34s} p50 {m['p50']:7.1f} ms  p95 {m['p95']:7.1f} ms  {m['bytes']:>9,} B", flush=True
            )
        client.close()
        info = machine(gw.data, Path(sys.executable))
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        command = "python benchmarks/console_bench.py " + " ".join(sys.argv[1:])
        table = report(rows, args, info)
        filled = (
            f"filled in {f['fill_s']:.0f} s"
            if args.reuse is None
            else ("the data of an earlier run's fill (`--reuse`), the gateway started afresh on it")
        )
        section = (
            f"\n## {when} — console pages at {args.topics:,} topics and {args.consumers:,} consumers "
            "(issue 13)\n\n"
            f"Machine: {info['nproc']} cores ({info['cpu']}), {info['memory']}, kernel {info['kernel']}, "
            f"Python {info['python'].split(';')[0]}, data on {info['fs']}. Commit {info['git']} "
            f"(src sha1 {info['src_sha1']}). Command: `{command.strip()}`.\n"
            f"Gateway: embedded store, fsync interval:50, SQLite registry; {args.projects} projects, "
            f"{args.topics:,} topics (2 queues), {args.topics:,} producers, {args.consumers:,} consumers "
            f"(every 10th with an alert threshold), 20 messages in each of 50 topics, every registration "
            f"through the admin API (so also {args.projects + 2 * args.topics + args.consumers * 11 // 10:,} "
            f"audit entries); {filled}. Each page GET {args.requests} times in a row "
            "after 3 unmeasured, signed in as an admin (who sees everything). Server time is the "
            "console's own (`Server-Timing`); client time includes the loopback transfer; bytes are "
            "the HTML as sent (no compression).\n\n" + table + "\n"
        )
        print(section)
        if args.results:
            with open(args.results, "a") as fh:
                fh.write(section)
    finally:
        gw.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
