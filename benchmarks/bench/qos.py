"""Message QoS through a real gateway (`run.py qos`): schedule rate, memory per held message,
recovery time with the messages held, and lateness (from due to available to a long-polling
consumer). One `mqgate serve` (embedded store, fsync always; or `--store redis://...`):

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
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import procs, results
from .common import fmt, log, percentile
from .redis import RedisServer
from .servers import Gateway, produce_batches

HELD_TOPIC, LATE_TOPIC, PRODUCER, CONSUMER = "qos-held", "qos-late", "qos-bench-p", "qos-late-c"
HOUR_MS = 3_600_000
PULL_WAIT_S, PULL_MAX = 5, 100
RECOVERY_TARGET_S, LATENESS_P99_TARGET_MS = 3.0, 20.0


def mark(ok: bool) -> str:
    return "✅" if ok else "❌"


def consumer_process(url: str, token: str, stop: Any, received: Any, out: Any) -> None:
    """Long-poll until told to stop; send back (receive ms - deliverAt ms) of every message."""
    import httpx
    import msgspec

    lateness: list[float] = []
    request_id: str | None = None
    decode = msgspec.json.Decoder().decode
    with httpx.Client(
        base_url=url, timeout=PULL_WAIT_S + 30, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        while not stop.is_set():
            params: dict[str, Any] = {
                "topic": LATE_TOPIC,
                "consumer": CONSUMER,
                "max": PULL_MAX,
                "wait": PULL_WAIT_S,
            }
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
    stop, received = ctx.Event(), ctx.Value("q", 0)
    pipes, consumers = [], []
    for _ in range(args.consumers):
        mine, theirs = ctx.Pipe(duplex=False)
        p = ctx.Process(target=consumer_process, args=(gw.url, ctoken, stop, received, theirs), daemon=True)
        p.start()
        pipes.append(mine)
        consumers.append(p)
    time.sleep(1.0)  # the consumers are waiting in their long polls before anything comes due
    start = int(time.time() * 1000 + args.lead_s * 1000)
    step = 1000.0 / args.rate

    def due(first: int, n: int) -> list[dict]:
        return [
            {
                "message": "l" * args.payload,
                "deliverAt": start + int((first + i) * step),
                "destinations": [{"topic": LATE_TOPIC}],
            }
            for i in range(n)
        ]

    produced_s = produce_batches(
        gw.port, ptoken, PRODUCER, total, args.batch, conns=1, messages=due, check=lambda r, n: None
    )
    produced_early = time.time() * 1000 < start
    deadline = time.monotonic() + args.lead_s + args.lateness_s + 60
    while received.value < total and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    values: list[float] = []
    problems: list[str] = []
    for pipe, p in zip(pipes, consumers, strict=True):
        if pipe.poll(PULL_WAIT_S + 35):
            kind, data = pipe.recv()
            values, problems = (values + data, problems) if kind == "ok" else (values, [*problems, data])
        else:
            problems.append("a consumer did not answer")
        p.join(5)
        if p.is_alive():
            p.kill()
    return {
        "messages": total,
        "received": len(values),
        "produced_s": produced_s,
        "produced_before_first_due": produced_early,
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values, default=float("nan")),
        "min": min(values, default=float("nan")),
        "problems": problems,
    }


def schedule_log_stats(data_dir: Path) -> tuple[int, int]:
    """(records, bytes) of the embedded scheduler's log."""
    from mqgate.durable.framing import iter_payloads

    path = data_dir / "scheduler" / "schedule.log"
    data = path.read_bytes() if path.exists() else b""
    return sum(1 for _ in iter_payloads(data)), len(data)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    redis = RedisServer(args.store, own=False) if args.store != "embedded" else None

    def gateway(name: str) -> Gateway:
        (work / name).mkdir()
        prefix = "mqqosbench" + secrets.token_hex(4) if redis else ""
        if redis:
            redis.prefixes.append(prefix)
        return Gateway(work / name / "data", args.store, redis_prefix=prefix, log_path=work / f"{name}.log")

    # For scale: process start to /healthz with nothing held, and that gateway's RSS.
    empty = gateway("empty")
    out["empty_start_s"] = empty.start(120)
    out["empty_rss"] = procs.rss_bytes(empty.pid)
    empty.stop()
    gw = out["gateway"] = gateway("qos")
    try:
        gw.start(120)
        for topic, queues in ((HELD_TOPIC, 8), (LATE_TOPIC, args.lateness_queues)):
            gw.post("/admin/topics", {"name": topic, "queues": queues})
        ptoken = gw.post(
            "/admin/producers", {"name": PRODUCER, "topic": HELD_TOPIC, "destinations": [LATE_TOPIC]}
        )["token"]
        ctoken = gw.post("/admin/consumers", {"name": CONSUMER, "topic": LATE_TOPIC})["token"]
        rss0, cpu0 = procs.rss_bytes(gw.pid), procs.tree_cpu_seconds(gw.pid)
        redis0 = int(redis.stats("memory")["used_memory"]) if redis else 0
        log(f"scheduling {args.count:,} messages")
        now = int(time.time() * 1000)

        def held(first: int, n: int) -> list[dict]:
            return [
                {
                    "message": "p" * args.payload,
                    "deliverAt": now + HOUR_MS + (first + i) * HOUR_MS // args.count,
                }
                for i in range(n)
            ]

        def all_scheduled(result: dict, n: int) -> str | None:
            got = sum(1 for r in result.get("receipts", []) if "scheduled" in str(r))
            return None if got == n else f"batch of {n}: {got} scheduled"

        out["schedule_s"] = produce_batches(
            gw.port, ptoken, PRODUCER, args.count, args.batch, args.producers, held, all_scheduled
        )
        out["schedule_cpu_s"] = procs.tree_cpu_seconds(gw.pid) - cpu0
        out["rss_before"], out["rss_after"] = rss0, procs.rss_bytes(gw.pid)
        if redis:
            out["redis_per_msg"] = (int(redis.stats("memory")["used_memory"]) - redis0) / args.count
        else:
            out["log_records"], out["log_bytes"] = schedule_log_stats(gw.data_dir)
        log(f"scheduled at {args.count / out['schedule_s']:,.0f} msgs/s; recovery")
        runs = []
        for _ in range(args.recoveries):
            gw.kill9()
            runs.append(gw.start(120))
        out["recovery_runs_s"] = runs
        out["rss_recovered"] = procs.rss_bytes(gw.pid)
        if not redis:
            out["log_records_after_recovery"] = schedule_log_stats(gw.data_dir)[0]
        log(f"recovery {runs} s; lateness")
        out["lateness"] = lateness(gw, ptoken, ctoken, args)
        out["lateness"]["lag_after"] = gw.progress(CONSUMER)["lag"]
    finally:
        gw.stop()
        if redis:
            out["redis_keys_deleted"] = sum(redis.delete_prefix(p) for p in redis.prefixes)
    out["gateway_errors"] = bool(gw.errors_in_log())
    return out


def report(r: dict[str, Any], args: argparse.Namespace) -> tuple[list[str], list[results.Row]]:
    mib, n, late, runs = 1024 * 1024, args.count, r["lateness"], r["recovery_runs_s"]
    worst, rate, store = max(runs), n / r["schedule_s"], "" if args.store == "embedded" else ".redis"
    rss_per_msg = (r["rss_after"] - r["rss_before"]) / n
    cpu = 100 * r["schedule_cpu_s"] / r["schedule_s"]
    rows = [
        results.Row(
            f"qos{store}.schedule",
            f"schedule {n:,} delayed messages ({args.payload} B), batch produce of "
            f"{args.batch}, {args.producers} client threads, end to end",
            f"{fmt(rate)} msgs/s",
            notes=f"{r['schedule_s']:.1f} s; gateway CPU {cpu:.0f} % of a core",
        ),
        results.Row(
            "",
            "memory per held message: gateway RSS growth over the scheduling, / N",
            f"{rss_per_msg:,.0f} B",
            notes=f"RSS {r['rss_before'] / mib:,.0f} → {r['rss_after'] / mib:,.0f} MiB",
        ),
        results.Row(
            f"qos{store}.memory",
            "memory per held message: RSS after recovery − RSS of an empty gateway, / N",
            f"{(r['rss_recovered'] - r['empty_rss']) / n:,.0f} B",
            notes=f"RSS {r['empty_rss'] / mib:,.0f} (empty) → {r['rss_recovered'] / mib:,.0f} MiB "
            f"(recovered)",
        ),
    ]
    if "redis_per_msg" in r:
        rows.append(
            results.Row(
                "", "memory per held message: Redis used_memory growth / N", f"{r['redis_per_msg']:,.0f} B"
            )
        )
    if "log_bytes" in r:
        per = f"{r['log_records']:,} records, {r['log_bytes'] / n:,.0f} B per message"
        rows.append(
            results.Row(
                "", "schedule log on disk after scheduling", f"{r['log_bytes'] / mib:,.1f} MiB", notes=per
            )
        )
    after_log = (
        f"; log after recovery {r['log_records_after_recovery']:,} records"
        if "log_records_after_recovery" in r
        else ""
    )
    rows.append(
        results.Row(
            f"qos{store}.recovery",
            f"recovery with {n:,} held: kill -9, process start → /healthz 200 (worst of {len(runs)})",
            f"{worst:.2f} s",
            f"an empty gateway: {r['empty_start_s']:.2f} s",
            f"{r['empty_start_s'] / worst:.2f}",
            f"target ≤ {RECOVERY_TARGET_S:g} s {mark(worst <= RECOVERY_TARGET_S)}",
            f"runs {', '.join(f'{x:.2f}' for x in runs)} s{after_log}",
        )
    )
    ok = (
        late["received"] >= late["messages"]
        and not late["problems"]
        and late["p99"] <= LATENESS_P99_TARGET_MS
    )
    early = "" if late["produced_before_first_due"] else " (NOT all before the first came due)"
    rows.append(
        results.Row(
            f"qos{store}.lateness",
            f"lateness, due → received by a long-polling consumer ({args.consumers} consumer processes, "
            f"wait={PULL_WAIT_S}, max={PULL_MAX}), {args.rate:,.0f} msgs/s coming due for "
            f"{args.lateness_s:g} s, {n:,} others held",
            f"p99 {late['p99']:.1f} ms",
            notes=f"p50 {late['p50']:.1f} ms; target p99 ≤ {LATENESS_P99_TARGET_MS:g} ms {mark(ok)}",
            more=f"max {late['max']:.1f} ms, min {late['min']:.1f} ms; {late['received']:,} of "
            f"{late['messages']:,} received (lag "
            f"after {late['lag_after']}); produced in {late['produced_s']:.1f} s{early}"
            + (f"; problems: {late['problems'][:3]}" if late["problems"] else ""),
        )
    )
    gw: Gateway = r["gateway"]
    prefix = f", MQGATE_REDIS_PREFIX {gw.redis_prefix}" if gw.redis_prefix else ""
    deleted = (
        f"; {r['redis_keys_deleted']:,} Redis keys deleted afterwards" if "redis_keys_deleted" in r else ""
    )
    lines = [
        f"- gateway: `{shlex.join(gw.cmd)}` (MQGATE_ADMIN_TOKEN set{prefix}); load average at start "
        f"{r['loadavg']}",
        f"- held messages: {n:,} of {args.payload} bytes, one destination each, due in 1–2 h{deleted}",
        *(["- the gateway log shows an error or traceback"] if r["gateway_errors"] else []),
    ]
    return lines, rows


def main(args: argparse.Namespace) -> int:
    if args.store != "embedded" and not args.store.startswith("redis://"):
        raise SystemExit("--store is embedded or a redis:// URL")
    work = Path(tempfile.mkdtemp(prefix="mqgate-qos-bench-"))
    try:
        r = run(args, work)
        m = results.machine(work)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    lines, rows = report(r, args)
    results.record(args, f"QoS benchmark, store {args.store}", rows, lines, m=m)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub,
        common,
        "qos",
        __doc__,
        help="message QoS through a gateway: schedule rate, memory, recovery, lateness",
    )
    p.add_argument("--count", type=int, default=1_000_000, help="messages held")
    p.add_argument("--store", default="embedded", help="embedded (default) or a Redis URL")
    p.add_argument("--batch", type=int, default=1000, help="messages per batch produce")
    p.add_argument("--payload", type=int, default=100, help="message body bytes")
    p.add_argument("--producers", type=int, default=4, help="client threads scheduling")
    p.add_argument("--recoveries", type=int, default=2, help="kill -9 and restarts with N held")
    p.add_argument("--rate", type=float, default=5000.0, help="messages coming due per second")
    p.add_argument("--lateness-s", type=float, default=10.0, help="seconds they keep coming due")
    p.add_argument("--lead-s", type=float, default=5.0, help="first due this long after producing starts")
    p.add_argument("--consumers", type=int, default=4, help="long-polling consumer processes")
    p.add_argument("--lateness-queues", type=int, default=4, help="queues of the lateness topic")
    p.add_argument("--keep", action="store_true", help="keep the temp directory")
    p.set_defaults(func=main)
