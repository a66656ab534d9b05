"""Console page times at scale (issue 13; `run.py console`): a gateway with 1,000 topics and
5,000 consumers, every console page's server time (p50/p95 over N requests) and size.

1. starts a gateway (embedded store, fsync interval:50, SQLite registry) in a temp directory
   and adds an admin console user with `mqgate.cli.user`;
2. through the admin API (as an operator's scripts would, so every change is also audited),
   with `--conns` concurrent connections: `--projects` projects, `--topics` topics (2 queues,
   spread over the projects), one producer per topic, `--consumers` consumers (spread evenly
   over the topics; every 10th with an alert threshold), then 20 messages into each of the
   first 50 topics (lag and messages to browse);
3. signs in through the form and GETs each page `--requests` times one after another (after 3
   unmeasured ones), reading the page's own server time from its `Server-Timing` header (the
   console's time from the request read to the page made) and the client's time to the last
   byte: p50/p95/max server ms, p95 client ms, bytes, and whether the page meets the targets
   (p95 < 50 ms, at most 500 KB). `--keep` keeps the temp directory; `--reuse <its data dir>`
   measures again on it (no filling; --topics, --consumers and --projects must be that run's).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from . import results
from .common import VENV_PY, log, percentile
from .servers import Gateway

PASSWORD = "bench password 1"
P95_TARGET_MS, SIZE_TARGET = 50.0, 500 * 1024  # issue 29: p95 ≤ 50 ms


def add_user(gw: Gateway) -> None:
    gw.data_dir.mkdir(parents=True)
    user = [
        str(VENV_PY),
        "-m",
        "mqgate.cli.user",
        "add",
        "bench",
        "--role",
        "admin",
        "--password-stdin",
        "--data-dir",
        str(gw.data_dir),
    ]
    subprocess.run(user, input=PASSWORD + "\n", text=True, check=True, capture_output=True)


def fill(gw: Gateway, args: argparse.Namespace) -> dict[str, Any]:
    """Projects, topics, producers, consumers and some messages, through the admin API."""
    import httpx

    client = httpx.Client(
        base_url=gw.url,
        headers={"Authorization": f"Bearer {gw.token}"},
        timeout=120,
        limits=httpx.Limits(max_connections=args.conns),
    )

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
        log(f"  {len(jobs):,} {what} in {took:.1f} s ({len(jobs) / took:.0f}/s)")
        return out

    projects = [f"proj{i}" for i in range(args.projects)]
    topics = [f"t{i:04d}" for i in range(args.topics)]
    consumers = [f"{topics[i % len(topics)]}-c{i // len(topics)}" for i in range(args.consumers)]
    started = time.monotonic()
    run([("POST", "/admin/projects", {"name": p}) for p in projects], "projects")
    run(
        [
            ("POST", "/admin/topics", {"name": t, "queues": 2, "project": projects[i % len(projects)]})
            for i, t in enumerate(topics)
        ],
        "topics",
    )
    made = run([("POST", "/admin/producers", {"name": f"{t}-p", "topic": t}) for t in topics], "producers")
    tokens = {t: m["token"] for t, m in zip(topics, made, strict=True)}
    run(
        [
            ("POST", "/admin/consumers", {"name": c, "topic": c.rsplit("-", 1)[0], "start": "earliest"})
            for c in consumers
        ],
        "consumers",
    )
    run(
        [("POST", f"/admin/consumers/{c}/alert", {"backlog": 10}) for c in consumers[::10]],
        "alert thresholds",
    )
    batch = [{"message": f'{{"order": {i}, "note": "bench"}}', "keys": [f"k{i}"]} for i in range(20)]
    for t in topics[:50]:
        r = client.post(
            "/mq/produce/batch",
            json={"producer": f"{t}-p", "messages": batch},
            headers={"Authorization": f"Bearer {tokens[t]}"},
        )
        assert r.status_code == 200, r.text
    client.close()
    return {
        "fill_s": time.monotonic() - started,
        "topic": topics[0],
        "consumer": consumers[0],
        "project": projects[0],
    }


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
        ("topic", f"/console/topics/{t}"),
        ("queue", f"/console/topics/{t}/queues/0"),
        ("clusters", "/console/clusters"),
        ("settings", "/console/settings?show=all"),
        ("send a message", f"/console/topics/{t}/send"),
        ("purge a topic, preview", f"/console/topics/{t}/purge"),
        ("purge a consumer, preview", f"/console/consumers/{c}/purge"),
        ("dead letters by reason", f"/console/consumers/{c}/dead-letters?reason=expired"),
    ]


def measure(client: Any, path: str, n: int) -> dict[str, Any]:
    server, wall, size = [], [], 0
    for i in range(n + 3):
        started = time.perf_counter()
        r = client.get(path)
        took = (time.perf_counter() - started) * 1000
        if r.status_code != 200:
            raise SystemExit(f"GET {path}: {r.status_code} {r.text[:300]}")
        if i >= 3:
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


def main(args: argparse.Namespace) -> int:
    import httpx

    root = Path(tempfile.mkdtemp(prefix="mqgate-console-bench-"))
    gw = Gateway(args.reuse or root / "data", fsync="interval:50", log_path=root / "gateway.log")
    try:
        if args.reuse is None:
            add_user(gw)
        gw.start()
        if args.reuse is None:
            log(f"gateway on {gw.url}; filling:")
            f = fill(gw, args)
        else:
            f = {"fill_s": 0.0, "topic": "t0000", "consumer": "t0000-c0", "project": "proj0"}
            log(f"gateway on {gw.url} over {args.reuse}; waiting 20 s for its start-up passes")
            time.sleep(20)
        log(f"filled in {f['fill_s']:.0f} s; measuring {args.requests} GETs per page")
        client = httpx.Client(base_url=gw.url, timeout=120)
        client.get("/console/signin")
        r = client.post(
            "/console/signin",
            data={
                "name": "bench",
                "password": PASSWORD,
                "signin_token": client.cookies["mqgate_console_signin"],
            },
        )
        if r.status_code != 303:
            raise SystemExit(f"sign-in failed: {r.status_code} {r.text[:300]}")
        rows = []
        for name, path in pages(f):
            m = measure(client, path, args.requests)
            rows.append((name, path, m))
            log(f"  {name:34s} p50 {m['p50']:7.1f} ms  p95 {m['p95']:7.1f} ms  {m['bytes']:>9,} B")
        client.close()
        info = results.machine(gw.data_dir)
    finally:
        gw.stop()
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    def meets(m: dict) -> bool:
        return m["p95"] <= P95_TARGET_MS and m["bytes"] <= SIZE_TARGET

    missed = ", ".join(name for name, _, m in rows if not meets(m)) or "none"
    slowest, largest = max(rows, key=lambda r: r[2]["p95"]), max(rows, key=lambda r: r[2]["bytes"])
    current = [
        results.Row(
            "console.p95",
            f"console page server time p95, the slowest of {len(rows)} pages, at {args.topics:,} "
            f"topics and {args.consumers:,} consumers",
            f"{slowest[2]['p95']:.1f} ms ({slowest[0]})",
            notes=f"target ≤ {P95_TARGET_MS:g} ms; pages missing a target: {missed}",
        ),
        results.Row(
            "console.bytes",
            "console page size, the largest",
            f"{largest[2]['bytes']:,} B ({largest[0]})",
            notes=f"target ≤ {SIZE_TARGET // 1024} KB",
        ),
    ]
    pages_rows = [
        results.Row(
            "",
            f"{name} `{path.removeprefix('/console')}`",
            f"p95 {m['p95']:.1f} ms",
            notes=f"server p50 {m['p50']:.1f} / max {m['max']:.1f} ms; client p95 {m['wall_p95']:.1f} ms; "
            f"{m['bytes']:,} B; meets the targets: {'yes' if meets(m) else '**no**'}",
        )
        for name, path, m in rows
    ]
    filled = (
        f"filled in {f['fill_s']:.0f} s" if args.reuse is None else "the data of an earlier run (`--reuse`)"
    )
    audit = args.projects + 2 * args.topics + args.consumers * 11 // 10
    lines = [
        f"- gateway: embedded store, fsync interval:50, SQLite registry; {args.projects} projects, "
        f"{args.topics:,} topics "
        f"(2 queues), as many producers, {args.consumers:,} consumers (every 10th with an alert "
        f"threshold), 20 messages in "
        f"each of 50 topics, every registration through the admin API (so also {audit:,} audit entries); "
        f"{filled}",
        f"- each page GET {args.requests} times in a row after 3 unmeasured, signed in as an admin; server "
        f"time is the "
        "console's own (`Server-Timing`), client time includes the loopback transfer, bytes are the HTML "
        "as sent",
    ]
    results.record(
        args,
        f"console pages at {args.topics:,} topics and {args.consumers:,} consumers",
        current + pages_rows,
        lines,
        m=info,
    )
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "console", __doc__, help="the web console's pages at 1,000 topics and 5,000 consumers"
    )
    p.add_argument("--topics", type=int, default=1000, help="topics to create (default 1000)")
    p.add_argument("--consumers", type=int, default=5000, help="consumers to create (default 5000)")
    p.add_argument("--projects", type=int, default=5, help="projects the topics are spread over (default 5)")
    p.add_argument("--requests", type=int, default=50, help="measured GETs per page (default 50)")
    p.add_argument("--conns", type=int, default=8, help="concurrent connections while filling (default 8)")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (gateway log, data)")
    p.add_argument("--reuse", type=Path, help="measure on the data directory of a --keep run")
    p.set_defaults(func=main)
