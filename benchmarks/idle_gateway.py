"""Idle work of a gateway with many consumers (issue 27): CPU per lag pass and per alert check.

    python benchmarks/idle_gateway.py [--topics 1000] [--per-topic 3] [--passes 6] [--src DIR]

Makes a data directory with `--topics` topics of 2 queues and `--per-topic` cluster consumers
on each (in this process, through the gateway's own topology: registry rows, store topics,
dead-letter topics, retry queues, inboxes and offset tables as a registration makes them), then
starts `mqgate serve` on it (a real process, the embedded store, default settings: lag passes
every 10 s, alert checks every 10 s, queue state, metrics history) and leaves it idle. It counts
passes and checks from /metrics (`mqgate_lag_passes_total`, `mqgate_lag_recomputed_total`,
`mqgate_alert_checks_total`, `mqgate_alert_consumers_checked_total`), polled every
`--poll-s` with a deadline, and the gateway's CPU time (user + system, every thread, from
/proc) between the end of one pass and the end of `--passes` more. The scrapes' own CPU is
measured apart (20 scrapes back to back) and taken off.

`--src` runs another copy of the source (e.g. an older commit with only those counters added)
on the same data directory layout: the "before" figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
MQGATE = str(Path(sys.executable).parent / "mqgate")
TICKS = os.sysconf("SC_CLK_TCK")


def make_data(data_dir: Path, topics: int, per_topic: int) -> None:
    from mqgate.backends import backends_for
    from mqgate.metrics import Metrics
    from mqgate.registry.cache import RegistryCache
    from mqgate.registry.sql import SqlRegistry
    from mqgate.services.context import Context
    from mqgate.services.gateway import Gateway
    from mqgate.settings import load_settings

    async def go() -> None:
        # Setup only: fsync at most every second (the gateway measured runs with the default).
        settings = load_settings(env={"MQGATE_FSYNC": "interval:1000"}, data_dir=data_dir, admin_token="x")
        backends = backends_for(settings)
        registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
        ctx = Context(
            settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
        )
        gw = Gateway(ctx)
        await backends.start()
        await gw.start()
        try:
            started = time.monotonic()
            for i in range(topics):
                await gw.topology.create_topic(f"t{i}", 2, 7 * 86_400_000, None)
                for j in range(per_topic):
                    await gw.topology.register_consumer(f"c{i}-{j}", f"t{i}", "cluster", "earliest", 60, 16)
                if i % 100 == 99:
                    took = time.monotonic() - started
                    print(f"  {i + 1} topics, {(i + 1) * per_topic} consumers, {took:.0f} s")
        finally:
            await gw.stop()
            await backends.stop()

    asyncio.run(go())


def cpu_s(pid: int) -> float:
    """User + system CPU of a process and its children, in seconds (threads included)."""
    total = 0.0
    pids = [pid]
    while pids:
        p = pids.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
            for task in Path(f"/proc/{p}/task").iterdir():
                pids += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def figures(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=60).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{[^}]*\})? (\S+)$", line)
        if m and m.group(1).startswith(("mqgate_lag_", "mqgate_alert_c")):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(data_dir: Path, src: str | None, passes: int, poll_s: float) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MQGATE_ADMIN_TOKEN": "mqa_" + secrets.token_hex(8)}
    if src:
        env["PYTHONPATH"] = src
    log = open(data_dir.parent / f"gateway-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [MQGATE, "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"the gateway exited: {proc.returncode}"
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway did not answer /healthz"
            time.sleep(0.2)

        def wait_passes(beyond: float) -> tuple[dict[str, float], float, int]:
            scrapes = 0
            limit = time.monotonic() + 60 * (passes + 2)
            while True:
                f = figures(url)
                at = cpu_s(proc.pid)
                scrapes += 1
                if f.get("mqgate_lag_passes_total", 0.0) > beyond:
                    return f, at, scrapes
                assert time.monotonic() < limit, "passes did not come"
                time.sleep(poll_s)

        # Past the start: the first full pass and check, and the first queue-state probe.
        f0, _, _ = wait_passes(0)
        f0, _, _ = wait_passes(f0["mqgate_lag_passes_total"] + 1)
        f1, cpu1, _ = wait_passes(f0["mqgate_lag_passes_total"])
        started = time.monotonic()
        f2, cpu2, scrapes = wait_passes(f1["mqgate_lag_passes_total"] + passes - 1)
        wall = time.monotonic() - started
        # A scrape's own cost: the least of 8 rounds of 5 back to back (a round that met a
        # pass or a check costs more).
        rounds = []
        for _ in range(8):
            before = cpu_s(proc.pid)
            for _ in range(5):
                figures(url)
            rounds.append((cpu_s(proc.pid) - before) / 5)
        per_scrape = min(rounds)
        d = {k: f2.get(k, 0.0) - f1.get(k, 0.0) for k in f2}
        cpu = cpu2 - cpu1 - scrapes * per_scrape
        n_passes, n_checks = d["mqgate_lag_passes_total"], d.get("mqgate_alert_checks_total", 0.0)
        return {
            "idle window s": round(wall, 1),
            "lag passes": n_passes,
            "alert checks": n_checks,
            "CPU s": round(cpu2 - cpu1, 3),
            "scrapes": scrapes,
            "CPU s per scrape": round(per_scrape, 4),
            "CPU s without scrapes": round(cpu, 3),
            "share of a core": f"{100 * cpu / wall:.1f} %",
            "CPU s per lag pass": round(cpu / n_passes, 3),
            "consumers recomputed per lag pass": d["mqgate_lag_recomputed_total"] / n_passes,
            "consumers evaluated per alert check": (
                d.get("mqgate_alert_consumers_checked_total", 0.0) / n_checks if n_checks else None
            ),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--per-topic", type=int, default=3)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--poll-s", type=float, default=5.0)
    ap.add_argument("--src", action="append", default=[], help="another source tree to measure too")
    ap.add_argument("--keep", type=Path, help="make (or reuse) the data directory here")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="mqgate-idle-"))
    data_dir = base / "data"
    try:
        if not (data_dir / "registry.db").exists():
            print(f"making {args.topics} topics, {args.topics * args.per_topic} consumers in {data_dir}")
            make_data(data_dir, args.topics, args.per_topic)
        for src in [None, *args.src]:
            print(f"{src or 'this tree'}:")
            for k, v in measure(data_dir, src, args.passes, args.poll_s).items():
                print(f"  {k}: {v}")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
