"""Message QoS through a real gateway: schedule rate, memory per held message, recovery time with
the messages held, and lateness (from due to available to a long-polling consumer).

    .venv/bin/python benchmarks/qos_bench.py [--count 1000000] [--store redis://127.0.0.1:6379/0]
        [--no-results] [--keep]

Phases, one `mqgate serve` process (embedded store, fsync always; or `--store redis://...`):
1. schedule `--count` messages (`--payload` bytes, one destination, start times spread over
   the next 1–2 hours so none comes due) with batch produces of `--batch`, from `--producers`
   client threads; the figure is end to end: messages / wall time of the whole phase;
2. memory per held message: the gateway's RSS after the schedule phase minus before it, / N
   (and after the recovery below minus a fresh gateway's RSS, / N: no request garbage in it);
   with Redis, Redis's `used_memory` growth / N as well (on a shared Redis it includes what other
   clients did meanwhile); every key under the run's MQGATE_REDIS_PREFIX is deleted at the end;
3. recovery: `kill -9`, start the same command again, seconds until `/healthz` answers (the
   embedded scheduler recovers before the server answers); `--recoveries` times; and, for
   scale, the same for a gateway with nothing held;
4. lateness, with the N messages still held: `--consumers` processes long-poll (`wait=5`,
   `max=100`, acking with the next pull) a topic of `--lateness-queues` queues; then
   `--rate` × `--lateness-s` messages are produced with deliverAt spread evenly at `--rate`
   per second, starting `--lead-s` after the produce began; each consumer records receive time
   minus the message's deliverAt; p50 / p99 / max over all messages.
Prints a Markdown table and appends a section to benchmarks/RESULTS.md (the format of run.py's
sections), unless `--no-results`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
from machine_info import machine

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "RESULTS.md"
MQGATE = str(Path(sys.executable).parent / "mqgate")
HELD_TOPIC = "qos-held"
LATE_TOPIC = "qos-late"
PRODUCER = "qos-bench-p"
CONSUMER = "qos-late-c"
HOUR_MS = 3_600_000
PULL_WAIT_S = 5
PULL_MAX = 100
RECOVERY_TARGET_S = 3.0
LATENESS_P99_TARGET_MS = 20.0

_encode = msgspec.json.Encoder().encode


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


# --- the gateway ----------------------------------------------------------------------------


@dataclass
class Gateway:
    data_dir: Path
    store: str
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: "mqa_bench_" + secrets.token_hex(8))
    redis_prefix: str = field(default_factory=lambda: "mqqosbench" + secrets.token_hex(4))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        cmd = [MQGATE, "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--data-dir", str(self.data_dir)]
        return cmd + (["--fsync", "always"] if self.store == "embedded" else ["--store", self.store])

    def start(self, timeout_s: float = 120.0) -> float:
        """Spawn the process; seconds until /healthz answers 200."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQGATE_")}
        env["MQGATE_ADMIN_TOKEN"] = self.token
        if self.store != "embedded":
            env["MQGATE_REDIS_PREFIX"] = self.redis_prefix
        out = open(self.data_dir.parent / f"gateway-{self.port}.log", "ab")  # noqa: SIM115
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = t0 + timeout_s
        with httpx.Client(timeout=1) as http:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited with {self.proc.returncode}: {self.log_tail()}")
                try:
                    if http.get(self.url + "/healthz").status_code == 200:
                        return time.perf_counter() - t0
                except httpx.HTTPError:
                    pass
                time.sleep(0.005)
        raise RuntimeError(f"the gateway did not answer /healthz within {timeout_s} s")

    def log_tail(self) -> str:
        path = self.data_dir.parent / f"gateway-{self.port}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def admin(self, method: str, path: str, **body: Any) -> Any:
        r = httpx.request(
            method,
            self.url + path,
            json=body if method != "GET" else None,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
        )
        if r.status_code != 200:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()["result"]


# --- phases ---------------------------------------------------------------------------------


def schedule(gw: Gateway, ptoken: str, args: argparse.Namespace) -> float:
    """Hold `--count` messages due in 1–2 hours; return the wall time of the whole phase."""
    body = "p" * args.payload
    now = int(time.time() * 1000)
    batches = [(i, min(args.batch, args.count - i)) for i in range(0, args.count, args.batch)]
    lock = threading.Lock()
    errors: list[str] = []

    def producer(mine: list[tuple[int, int]]) -> None:
        with httpx.Client(
            base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {ptoken}"}
        ) as http:
            for first, n in mine:
                messages = [
                    {"message": body, "deliverAt": now + HOUR_MS + (first + i) * HOUR_MS // args.count}
                    for i in range(n)
                ]
                payload = _encode({"producer": PRODUCER, "messages": messages})
                r = http.post(
                    "/mq/produce/batch", content=payload, headers={"Content-Type": "application/json"}
                )
                if r.status_code != 200 or r.text.count('"scheduled"') != n:
                    with lock:
                        errors.append(f"batch at {first}: {r.status_code} {r.text[:300]}")
                    return

    threads = [
        threading.Thread(target=producer, args=(batches[k :: args.producers],)) for k in range(args.producers)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"scheduling failed: {errors[:3]}")
    return took


def consumer_process(url: str, token: str, stop: Any, received: Any, out: Any) -> None:
    """Long-poll until told to stop; send back (receive ms - deliverAt ms) of every message."""
    lateness: list[float] = []
    request_id: str | None = None
    decode = msgspec.json.Decoder().decode
    with httpx.Client(
        base_url=url, timeout=PULL_WAIT_S + 30, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        while not stop.is_set():
            params: dict[str, Any] = {"topic": LATE_TOPIC, "consumer": CONSUMER, "max": PULL_MAX}
            params["wait"] = PULL_WAIT_S
            if request_id is not None:
                params["requestId"] = request_id
            r = http.get("/mq/message", params=params)
            now = time.time() * 1000
            request_id = None
            if r.status_code != 200:
                out.send(("error", f"pull answered {r.status_code}: {r.text[:300]}"))
                return
            result = decode(r.content)["result"]
            if result["status"] == "FOUND":
                request_id = result["requestId"]
                lateness += [now - m["deliverAt"] for m in result["msgList"]]
                with received.get_lock():
                    received.value += len(result["msgList"])
        if request_id is not None:
            http.post("/mq/ack", json={"requestId": request_id})
    out.send(("ok", lateness))


def lateness(gw: Gateway, ptoken: str, ctoken: str, args: argparse.Namespace) -> dict[str, Any]:
    total = int(args.rate * args.lateness_s)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    received = ctx.Value("q", 0)
    pipes = []
    procs = []
    for _ in range(args.consumers):
        mine, theirs = ctx.Pipe(duplex=False)
        p = ctx.Process(target=consumer_process, args=(gw.url, ctoken, stop, received, theirs), daemon=True)
        p.start()
        pipes.append(mine)
        procs.append(p)
    time.sleep(1.0)  # the consumers are waiting in their long polls before anything comes due
    start = int(time.time() * 1000 + args.lead_s * 1000)
    step = 1000.0 / args.rate
    t0 = time.perf_counter()
    with httpx.Client(base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {ptoken}"}) as http:
        for first in range(0, total, args.batch):
            n = min(args.batch, total - first)
            messages = [
                {
                    "message": "l" * args.payload,
                    "deliverAt": start + int((first + i) * step),
                    "destinations": [{"topic": LATE_TOPIC}],
                }
                for i in range(n)
            ]
            r = http.post(
                "/mq/produce/batch",
                content=_encode({"producer": PRODUCER, "messages": messages}),
                headers={"Content-Type": "application/json"},
            )
            if r.status_code != 200:
                raise RuntimeError(f"lateness produce: {r.status_code} {r.text[:300]}")
    produced_s = time.perf_counter() - t0
    produced_early = time.time() * 1000 < start
    deadline = time.monotonic() + args.lead_s + args.lateness_s + 60
    while received.value < total and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    values: list[float] = []
    problems: list[str] = []
    for pipe, p in zip(pipes, procs, strict=True):
        if pipe.poll(PULL_WAIT_S + 35):
            kind, data = pipe.recv()
            if kind == "ok":
                values += data
            else:
                problems.append(data)
        else:
            problems.append("a consumer did not answer")
        p.join(5)
        if p.is_alive():
            p.kill()
    values.sort()
    return {
        "messages": total,
        "received": len(values),
        "produced_s": produced_s,
        "produced_before_first_due": produced_early,
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": values[-1] if values else float("nan"),
        "min": values[0] if values else float("nan"),
        "problems": problems,
    }


def redis_memory(url: str) -> int:
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("memory")["used_memory"])


def delete_redis_prefix(url: str, prefix: str) -> int:
    import redis

    deleted = 0
    with redis.Redis.from_url(url) as r:
        keys = list(r.scan_iter(match=prefix + ":*", count=1000))
        for i in range(0, len(keys), 500):
            deleted += int(r.delete(*keys[i : i + 500]))
    return deleted


def schedule_log_stats(data_dir: Path) -> tuple[int, int]:
    """(records, bytes) of the embedded scheduler's log."""
    from mqgate.durable.framing import iter_payloads

    path = data_dir / "scheduler" / "schedule.log"
    data = path.read_bytes() if path.exists() else b""
    return sum(1 for _ in iter_payloads(data)), len(data)


# --- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"count": args.count, "payload": args.payload, "batch": args.batch}
    out["loadavg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    redis_url = None if args.store == "embedded" else args.store

    # For scale: process start to /healthz with nothing held, and that gateway's RSS.
    empty = Gateway(work / "empty" / "data", args.store)
    empty.data_dir.mkdir(parents=True)
    out["empty_start_s"] = empty.start()
    out["empty_rss"] = rss_bytes(empty.pid)
    empty.stop()
    if redis_url:
        delete_redis_prefix(redis_url, empty.redis_prefix)

    gw = Gateway(work / "qos" / "data", args.store)
    gw.data_dir.mkdir(parents=True)
    out["gateway"] = gw
    try:
        gw.start()
        for topic, queues in ((HELD_TOPIC, 8), (LATE_TOPIC, args.lateness_queues)):
            gw.admin("POST", "/admin/topics", name=topic, queues=queues)
        ptoken = gw.admin(
            "POST", "/admin/producers", name=PRODUCER, topic=HELD_TOPIC, destinations=[LATE_TOPIC]
        )["token"]
        ctoken = gw.admin("POST", "/admin/consumers", name=CONSUMER, topic=LATE_TOPIC)["token"]

        rss0 = rss_bytes(gw.pid)
        redis0 = redis_memory(redis_url) if redis_url else 0
        cpu0 = cpu_seconds(gw.pid)
        log(f"scheduling {args.count:,} messages")
        out["schedule_s"] = schedule(gw, ptoken, args)
        out["schedule_cpu_s"] = cpu_seconds(gw.pid) - cpu0
        out["schedule_rate"] = args.count / out["schedule_s"]
        out["rss_before"] = rss0
        out["rss_after"] = rss_bytes(gw.pid)
        out["rss_per_msg"] = (out["rss_after"] - rss0) / args.count
        if redis_url:
            out["redis_per_msg"] = (redis_memory(redis_url) - redis0) / args.count
        else:
            out["log_records"], out["log_bytes"] = schedule_log_stats(gw.data_dir)
        log(f"scheduled at {out['schedule_rate']:,.0f} msgs/s; recovery")

        runs = []
        for _ in range(args.recoveries):
            gw.kill9()
            runs.append(gw.start())
        out["recovery_runs_s"] = runs
        out["rss_recovered"] = rss_bytes(gw.pid)
        out["rss_recovered_per_msg"] = (out["rss_recovered"] - out["empty_rss"]) / args.count
        if not redis_url:
            records, _ = schedule_log_stats(gw.data_dir)
            out["log_records_after_recovery"] = records
        log(f"recovery {runs} s; lateness")
        out["lateness"] = lateness(gw, ptoken, ctoken, args)
        progress = gw.admin("GET", f"/admin/consumers/{CONSUMER}/progress")
        out["lateness"]["lag_after"] = progress["lag"]
    finally:
        gw.stop()
        if redis_url:
            out["redis_keys_deleted"] = delete_redis_prefix(redis_url, gw.redis_prefix)
    logged = (gw.data_dir.parent / f"gateway-{gw.port}.log").read_text(errors="replace")
    out["gateway_errors"] = "Traceback" in logged or "unexpected error" in logged
    return out


# --- the report (the format of run.py's RESULTS.md sections) --------------------------------


def mark(ok: bool) -> str:
    return "✅" if ok else "❌"


def table(r: dict[str, Any], args: argparse.Namespace) -> str:
    mib = 1024 * 1024
    late = r["lateness"]
    runs = r["recovery_runs_s"]
    worst = max(runs)
    rows = [
        (
            "1",
            f"schedule {r['count']:,} delayed messages ({r['payload']} B), batch produce of "
            f"{r['batch']}, {args.producers} client threads, end to end",
            f"{r['schedule_rate']:,.0f} msgs/s",
            "—",
            f"{r['schedule_s']:.1f} s; gateway CPU "
            f"{100 * r['schedule_cpu_s'] / r['schedule_s']:.0f} % of a core",
        ),
        (
            "2",
            "memory per held message: gateway RSS growth over phase 1, / N",
            f"{r['rss_per_msg']:,.0f} B",
            "—",
            f"RSS {r['rss_before'] / mib:,.0f} → {r['rss_after'] / mib:,.0f} MiB",
        ),
        (
            "2",
            "memory per held message: RSS after recovery − RSS of an empty gateway, / N",
            f"{r['rss_recovered_per_msg']:,.0f} B",
            "—",
            f"RSS {r['empty_rss'] / mib:,.0f} (empty) → {r['rss_recovered'] / mib:,.0f} MiB (recovered)",
        ),
    ]
    if "redis_per_msg" in r:
        rows.append(
            (
                "2",
                "memory per held message: Redis used_memory growth / N",
                f"{r['redis_per_msg']:,.0f} B",
                "—",
                "",
            )
        )
    if "log_bytes" in r:
        rows.append(
            (
                "2",
                "schedule log on disk after scheduling",
                f"{r['log_bytes'] / mib:,.1f} MiB",
                "—",
                f"{r['log_records']:,} records, {r['log_bytes'] / r['count']:,.0f} B per message",
            )
        )
    rows.append(
        (
            "3",
            f"recovery with {r['count']:,} held: kill -9, process start → /healthz 200",
            f"{worst:.2f} s (worst of {len(runs)})",
            f"≤ {RECOVERY_TARGET_S:g} s {mark(worst <= RECOVERY_TARGET_S)}",
            f"runs {', '.join(f'{x:.2f}' for x in runs)} s; "
            f"an empty gateway starts in {r['empty_start_s']:.2f} s"
            + (
                f"; log after recovery {r['log_records_after_recovery']:,} records (mark + live set)"
                if "log_records_after_recovery" in r
                else ""
            ),
        )
    )
    ok = late["received"] >= late["messages"] and not late["problems"]
    rows.append(
        (
            "4",
            f"lateness, due → received by a long-polling consumer ({args.consumers} consumer processes, "
            f"wait={PULL_WAIT_S}, max={PULL_MAX}), {args.rate:,.0f} msgs/s coming due for "
            f"{args.lateness_s:g} s, {r['count']:,} others held",
            f"p50 {late['p50']:.1f} ms / p99 {late['p99']:.1f} ms",
            f"p99 ≤ {LATENESS_P99_TARGET_MS:g} ms {mark(late['p99'] <= LATENESS_P99_TARGET_MS and ok)}",
            f"max {late['max']:.1f} ms, min {late['min']:.1f} ms; {late['received']:,} of "
            f"{late['messages']:,} received (lag after {late['lag_after']}); produced in "
            f"{late['produced_s']:.1f} s"
            + ("" if late["produced_before_first_due"] else " (NOT all before the first came due)")
            + (f"; problems: {late['problems'][:3]}" if late["problems"] else ""),
        )
    )
    lines = ["| # | benchmark | figure | target | note |", "|---|---|---:|---|---|"]
    lines += [f"| {n} | {what} | {fig} | {target} | {note} |" for n, what, fig, target, note in rows]
    return "\n".join(lines)


def section(r: dict[str, Any], args: argparse.Namespace, started: dt.datetime, cmdline: str) -> str:
    gw: Gateway = r["gateway"]
    m = machine(gw.data_dir.parent.parent.parent, Path(sys.executable))  # the temp directory is gone by now
    lines = [
        f"## {started.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} — QoS benchmark, store {args.store}",
        "",
        f"- command: `{cmdline}`",
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, kernel {m['kernel']}, "
        f"data dir on {m['fs']}; clients on the same machine, loopback "
        f"(load average at start {r['loadavg']})",
        f"- software: Python {m['python']}",
        f"- code: git {m['git']}, src/mqgate sha1 {m['src_sha1']} (uncommitted work tree)",
        f"- gateway: `{shlex.join(gw.command)}` (MQGATE_ADMIN_TOKEN set"
        + (f", MQGATE_REDIS_PREFIX {gw.redis_prefix}" if args.store != "embedded" else "")
        + f"), store `{args.store}`",
        f"- held messages: {r['count']:,} of {r['payload']} bytes, one destination each, due in 1–2 h"
        + (
            f"; {r['redis_keys_deleted']:,} Redis keys deleted afterwards"
            if "redis_keys_deleted" in r
            else ""
        ),
        *(["- the gateway log shows an error or traceback"] if r["gateway_errors"] else []),
        "",
        table(r, args),
        "",
    ]
    return "\n".join(lines) + "\n"


def append_results(text: str) -> None:
    existing = RESULTS.read_text() if RESULTS.exists() else "# mqgate benchmark results\n\n"
    if not existing.endswith("\n\n"):
        existing = existing.rstrip("\n") + "\n\n"
    RESULTS.write_text(existing + text)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000, help="messages held")
    ap.add_argument("--store", default="embedded", help="embedded (default) or a Redis URL")
    ap.add_argument("--batch", type=int, default=1000, help="messages per batch produce")
    ap.add_argument("--payload", type=int, default=100, help="message body bytes")
    ap.add_argument("--producers", type=int, default=4, help="client threads scheduling")
    ap.add_argument("--recoveries", type=int, default=2, help="kill -9 and restarts with N held")
    ap.add_argument("--rate", type=float, default=5000.0, help="messages coming due per second")
    ap.add_argument("--lateness-s", type=float, default=10.0, help="seconds they keep coming due")
    ap.add_argument("--lead-s", type=float, default=5.0, help="first due this long after producing starts")
    ap.add_argument("--consumers", type=int, default=4, help="long-polling consumer processes")
    ap.add_argument("--lateness-queues", type=int, default=4, help="queues of the lateness topic")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    args = ap.parse_args()
    if args.store != "embedded" and not args.store.startswith("redis://"):
        ap.error("--store is embedded or a redis:// URL")
    started = dt.datetime.now(dt.UTC)
    cmdline = "python benchmarks/qos_bench.py " + shlex.join(sys.argv[1:])
    work = Path(tempfile.mkdtemp(prefix="mqgate-qos-bench-"))
    try:
        result = run(args, work)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = section(result, args, started, cmdline.strip())
    print(text)
    if not args.no_results:
        append_results(text)
        log(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
