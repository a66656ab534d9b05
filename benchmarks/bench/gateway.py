"""The main table (`run.py gateway`, the default): one gateway of its own (`mqgate serve ...
--fsync always` on a free loopback port, fresh data directory), a topic / producer / consumer
registered through the admin API, pre-flight protocol checks, then:

  produce   POST /mq/produce, 1 message per request, wrk -t2 -c64        (msgs/s, p50, p99)
  batch     POST /mq/produce/batch, 100 messages per request, wrk        (msgs/s)
  consume   GET /mq/message max=100, each pull acks the previous batch   (acked msgs/s)
  baseline  baseline A: the raw ASGI app (bench/baseline_asgi.py) under the gateway's own server
  durable   baseline D: baseline A making each body durable before it answers (one log file,
            one fsync a group-commit round: bench/baseline_durable.py), same server, same wrk
  redispy   baseline R (Redis only): redis-py pipelined XADD / XRANGE (`run.py redis-baseline`)
  store     baseline B: the store in-process (`run.py store`)
  recovery  1,000,000-message queue, kill -9, restart, time to /healthz (target <= 2 s)

With `--store redis` the harness starts its own `redis-server` (AOF on, `--redis-fsync`
everysec by default, no RDB snapshots) on a free loopback port in the temp directory, and the
gateway runs `--store <its URL> --workers N` (default 2); `--redis-url` (or `--store redis://...`)
uses an existing Redis instead, under a random key prefix whose keys are deleted at the end.
Exit status 1 if any benchmark failed (shown as FAILED with the reason, never as a number).

`run.py server-choice` is the measurement that chose the HTTP server: the raw ASGI app under
uvicorn and granian (1 worker each), the same wrk load (NOTES-server-choice.md).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import re
import secrets
import shlex
import shutil
import statistics
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procs, results, wrk
from .common import BENCH_DIR, HOST, MQGATE, MSG_BYTES, VENV_BIN, VENV_PY, BenchFailure, fmt, log, ratio, tail
from .redis import RedisReplyError, RedisServer, connection, phase_note
from .redis import baseline_rows as redis_baseline_rows
from .servers import (
    BASELINE_APP,
    DURABLE_APP,
    Gateway,
    Http,
    await_registry,
    baseline_command,
    baseline_server,
    detect_server,
    produce_batches,
    register,
    totals,
)
from .store import rows_of as store_rows

RUN_PY = str(BENCH_DIR / "run.py")
TOPIC, PRODUCER, CONSUMER = "bench", "bench-producer", "bench-consumer"
REC_TOPIC, REC_PRODUCER, REC_CONSUMER = "recovery", "recovery-producer", "recovery-consumer"
ALL = ["produce", "batch", "consume", "baseline", "durable", "redispy", "store", "recovery"]
REDIS_ONLY = {"redispy"}
RECOVERY_TARGET_S = 1.0  # issue 28 (2.0 before)
COLD_START_TARGET_S = 0.5  # issue 28: process start -> /healthz 200 on an empty data directory
COLD_STARTS = 3  # the median of this many
# The Redis issue's targets, stated for `--workers 2` on the 2-core machine.
REDIS_TARGETS = {"produce": 10_000, "batch": 100_000, "consume": 400_000}
REDIS_RATIO_GOAL = 0.6


def mark(ok: bool) -> str:
    return "✅" if ok else "❌"


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    redis: RedisServer | None = None
    results: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    preflight: str = ""
    gw: Gateway | None = None
    ptoken: str = ""
    ctoken: str = ""
    server: dict = field(default_factory=dict)
    busy_before: float = 0.0
    gw_prefix: str = ""  # MQGATE_REDIS_PREFIX of the benchmark gateway
    redis_end: dict = field(default_factory=dict)  # INFO of the Redis at the end
    record_bytes: int = 0  # one stored message in Redis (the stream entry's `d`)

    def gateway(self, name: str, prefix: str = "") -> Gateway:
        a = self.args
        store = self.redis.url if self.redis else "embedded"
        return Gateway(
            self.work / f"{name}-data",
            store,
            workers=a.workers,
            redis_prefix=prefix,
            log_path=self.work / f"{name}.log",
        )


# --- the benchmarks ------------------------------------------------------------------------------


def preflight(ctx: Ctx) -> None:
    """A few cheap protocol checks (PROTOCOL.md); mismatches are reported, not fatal."""
    before = len(ctx.problems)
    h = Http(ctx.gw.port)
    body = {"producer": PRODUCER, "message": "preflight"}

    def expect(what: str, want: int, *request: Any, token: str | None = None) -> None:
        status, payload, raw = h.request(*request, token=token)
        if status != want:
            ctx.problems.append(f"protocol: {what}: expected HTTP {want}, got {status}: {raw[:200]!r}")
        elif (
            not isinstance(payload, dict)
            or payload.get("status") != status
            or not {"message", "result"} <= payload.keys()
        ):
            ctx.problems.append(f"protocol: {what}: answer is not the envelope: {raw[:200]!r}")

    try:
        expect("GET /healthz", 200, "GET", "/healthz")
        expect("produce without token", 401, "POST", "/mq/produce", body)
        expect("produce with a token that is no one's", 401, "POST", "/mq/produce", body, token="not-a-token")
        expect("produce with the consumer's token", 403, "POST", "/mq/produce", body, token=ctx.ctoken)
        h.ok("POST", "/mq/produce", body, token=ctx.ptoken)
        q = urllib.parse.urlencode({"topic": TOPIC, "consumer": CONSUMER, "max": 1})
        r = h.ok("GET", f"/mq/message?{q}", token=ctx.ctoken)
        if r.get("status") != "FOUND" or not r.get("requestId") or len(r.get("msgList", [])) != 1:
            ctx.problems.append(f"protocol: pull after a produce did not give one FOUND message: {r}")
        else:
            fields = (
                "messageId",
                "message",
                "keys",
                "tags",
                "properties",
                "timestamp",
                "broker",
                "queue",
                "offset",
                "reconsumeTimes",
            )
            missing = [k for k in fields if k not in r["msgList"][0]]
            if missing:
                ctx.problems.append(f"protocol: msgList item lacks {missing}: {r['msgList'][0]}")
            h.ok("POST", "/mq/release", {"requestId": r["requestId"]}, token=ctx.ctoken)
    except BenchFailure as exc:
        ctx.problems.append(f"protocol: preflight: {exc}")
    finally:
        h.close()
    bad = len(ctx.problems) - before
    ctx.preflight = "all passed" if bad == 0 else f"{bad} failed (see Problems seen)"


def settle(gw: Gateway, before_max: int, expect_at_least: int, wait: float = 5.0) -> dict:
    """Wait until stored messages stop growing (in-flight requests at wrk's end)."""
    t_end = time.monotonic() + wait
    prev = None
    while True:
        cur = totals(gw.progress(CONSUMER))
        if (cur["max"] == prev and cur["max"] - before_max >= expect_at_least) or time.monotonic() > t_end:
            return cur
        prev = cur["max"]
        time.sleep(0.25)


def bench_produce(ctx: Ctx, name: str = "produce") -> None:
    """`produce` (one message per request, 64 connections) or `batch` (--batch per request)."""
    gw, a = ctx.gw, ctx.args
    n, conns = (1, 64) if name == "produce" else (a.batch, a.batch_conns)
    env = {
        "MQB_TOKEN": ctx.ptoken,
        "MQB_PRODUCER": PRODUCER,
        "MQB_MSG_BYTES": str(MSG_BYTES),
        "MQB_BATCH": str(n),
    }
    if name == "produce":  # one request by hand first, to report a protocol problem in words
        h = Http(gw.port, ctx.ptoken)
        r = h.ok("POST", "/mq/produce", {"producer": PRODUCER, "message": "x" * MSG_BYTES})
        h.close()
        ctx.problems += [
            f"POST /mq/produce receipt lacks {k}: {r}"
            for k in ("msgId", "broker", "queue", "offset")
            if k not in r
        ]
    before = totals(gw.progress(CONSUMER))
    script, path = (
        ("produce.lua", "/mq/produce") if name == "produce" else ("produce_batch.lua", "/mq/produce/batch")
    )
    res = wrk.measured(gw.pid, script, f"{gw.url}{path}", conns, a.duration, env, redis=ctx.redis)
    ctx.problems += wrk.check_errors(res, name) + wrk.other_load(name, res)
    stored = settle(gw, before["max"], res["ok_requests"] * n)["max"] - before["max"]
    res["stored"] = stored
    if stored < res["ok_requests"] * n:
        raise BenchFailure(
            f"{name}: {res['ok_requests']} requests of {n} answered 2xx but only {stored} messages were "
            f"stored"
        )
    # wrk does not count the answers in flight when it stops (one per connection); runs here
    # showed exactly one more than that, hence the small margin
    if stored > (res["requests"] + conns + 2) * n:
        ctx.problems.append(f"{name}: {stored} stored for {res['requests']} requests")
    res["msgs_per_s"] = res["ok_requests"] * n / res["seconds"]
    ctx.results[name] = res
    log(
        f"  {name}: {res['msgs_per_s']:.0f} msgs/s ({res['ok_requests'] / res['seconds']:.0f} req/s), "
        f"p50 {res['lat_p50_us'] / 1000:.2f} ms, p99 {res['lat_p99_us'] / 1000:.2f} ms (stored {stored}), "
        f"server CPU {wrk.server_cpu_per_request(res):.0f} µs/request"
    )


def bench_consume(ctx: Ctx) -> None:
    gw, a = ctx.gw, ctx.args
    before = totals(gw.progress(CONSUMER))
    if before["lag"] < a.prefill:
        log(f"  pre-filling {a.prefill - before['lag']} messages (lag is {before['lag']})")
        took = produce_batches(gw.port, ctx.ptoken, PRODUCER, a.prefill - before["lag"])
        log(f"  pre-fill at {(a.prefill - before['lag']) / took:.0f} msgs/s")
        before = totals(gw.progress(CONSUMER))
    if before["lag"] <= 0:
        raise BenchFailure("consume: nothing to consume (lag 0 after pre-fill)")
    env = {
        "MQB_TOKEN": ctx.ctoken,
        "MQB_TOPIC": TOPIC,
        "MQB_CONSUMER": CONSUMER,
        "MQB_MAX": str(a.pull_max),
        "MQB_TARGET": str(math.ceil(before["lag"] / 2)),
        "MQB_EMPTY_STOP": "50",
    }
    res = wrk.measured(gw.pid, "consume.lua", f"{gw.url}/", a.consume_conns, a.duration, env, redis=ctx.redis)
    ctx.problems += wrk.other_load("consume", res)
    time.sleep(0.5)
    after = totals(gw.progress(CONSUMER))
    committed, lag_drop = after["committed"] - before["committed"], before["lag"] - after["lag"]
    res.update(
        lag_before=before["lag"],
        lag_after=after["lag"],
        committed=committed,
        lag_drop=lag_drop,
        locked_after=after["locked"],
    )
    if res["received"] == 0 or committed <= 0 or lag_drop <= 0:
        raise BenchFailure(
            f"consume: consumed nothing — received {res['received']} messages, committed "
            f"{committed}, lag {before['lag']} -> {after['lag']}; first error: {res['first_err']!r}"
        )
    if res["http_err"] or res["other"]:
        ctx.problems.append(
            f"consume: {res['http_err']} non-200 answers, {res['other']} other result.status; first: "
            f"{res['first_err']!r}"
        )
    if res["acks_bad"]:
        ctx.problems.append(f"consume: {res['acks_bad']} acks failed; e.g. {res['bad_ack']!r}")
    if res["no_token"]:
        ctx.problems.append(f"consume: {res['no_token']} FOUND answers without requestId")
    if lag_drop != committed:
        ctx.problems.append(f"consume: lag dropped by {lag_drop} but committed offsets moved by {committed}")
    slack = (res["unacked_tokens"] + res["acks_bad"] + a.consume_conns) * a.pull_max
    if not (res["received"] - slack <= committed <= res["received"]):
        ctx.problems.append(
            f"consume: received {res['received']} but committed {committed} (unacked tokens "
            f"{res['unacked_tokens']})"
        )
    # rate window: the whole run, or up to the last FOUND answer if the backlog drained
    window = res["seconds"]
    if res["drained"] and res["t_last_found"] > res["t_start"]:
        window = res["t_last_found"] - res["t_start"]
        ctx.notes.append(
            f"consume: the backlog drained after {window:.1f} s of the {res['seconds']:.0f} s run; "
            "the rate is over that window (more with --prefill)"
        )
    res.update(
        window_s=window,
        msgs_per_s=committed / window,
        delivered_per_s=res["received"] / window,
        pulls_per_s=(res["found"] + res["empty"]) / window,
    )
    ctx.results["consume"] = res
    log(
        f"  consume: {res['msgs_per_s']:.0f} acked msgs/s ({res['delivered_per_s']:.0f} delivered/s), "
        f"lag {before['lag']} -> {after['lag']}, acks ok {res['acks_ok']}, failed {res['acks_bad']}"
    )


def bench_baseline(ctx: Ctx, name: str = "baseline") -> None:
    """Baseline A, the raw ASGI app; `durable`: baseline D, the same app making each body durable
    (bench/baseline_durable.py: one log file, one fsync a group-commit round)."""
    if not ctx.server:
        raise BenchFailure("no gateway server detected")
    app = DURABLE_APP if name == "durable" else BASELINE_APP
    label = "baseline D" if name == "durable" else "baseline A"
    data = ctx.work / "durable-data"
    data.mkdir(exist_ok=True)
    with baseline_server(
        lambda port: baseline_command(ctx.server, port, app),
        ctx.work / f"{name}.log",
        {"MQB_DURABLE_DIR": str(data)},
    ) as (port, proc):
        env = {"MQB_TOKEN": "baseline", "MQB_PRODUCER": PRODUCER, "MQB_MSG_BYTES": str(MSG_BYTES)}
        res = wrk.measured(
            proc.pid,
            "produce.lua",
            f"http://{HOST}:{port}/mq/produce",
            64,
            ctx.args.duration,
            env,
            redis=ctx.redis,
        )
        res["server_command"] = " ".join(proc.args)
    ctx.problems += wrk.check_errors(res, label) + wrk.other_load(label, res)
    res["req_per_s"] = res["ok_requests"] / res["seconds"]
    ctx.results[name] = res
    log(
        f"  {label}: {res['req_per_s']:.0f} req/s, p50 {res['lat_p50_us'] / 1000:.2f} ms, p99 "
        f"{res['lat_p99_us'] / 1000:.2f} ms"
    )


def ceiling(ctx: Ctx, name: str, what: str, args: list[str], timeout: float, load: bool = True) -> dict:
    """A baseline run by `run.py <args> --json` in a process of its own, with the CPU around it."""
    cmd = [str(VENV_PY), RUN_PY, *args, "--json"]
    log("  $ " + " ".join(cmd))
    meter = wrk.CpuMeter(redis=ctx.redis)
    r = meter.finish(procs.run_json(cmd, timeout), own_key="store_cpu_pct")
    ctx.problems += wrk.other_load(what, r) if load else []
    r["command"] = " ".join(cmd)
    ctx.results[name] = r
    return r


def bench_store(ctx: Ctx) -> None:
    a = ctx.args
    d = ctx.work / "store-bench"
    where = ["--data-dir", str(d)]
    if ctx.redis is not None:
        # RedisStore in as many processes as gateway workers, readers as many as consume's
        # connections (a Redis read is a round trip: one sequential reader would idle)
        where = ["--store", ctx.redis.url, "--procs", str(a.workers), "--read-tasks", str(a.consume_conns)]
    d.mkdir()
    args = [
        "store",
        "throughput",
        *where,
        "--duration",
        str(a.duration),
        "--concurrency",
        "64",
        "--batch",
        str(a.batch),
        "--batch-concurrency",
        str(a.batch_conns),
        "--read-max",
        str(a.pull_max),
    ]
    r = ceiling(ctx, "store", "store", args, a.duration * 6 + 120)
    shutil.rmtree(d, ignore_errors=True)
    log("  store: " + ", ".join(f"{what} {ph['messages_per_s']:.0f} msgs/s" for _, what, ph in store_rows(r)))


def bench_redispy(ctx: Ctx) -> None:
    """Baseline R: plain redis-py against the same Redis, as many client processes as gateway
    workers, in flight as many commands as wrk has connections."""
    a = ctx.args
    args = [
        "redis-baseline",
        "--url",
        ctx.redis.url,
        "--procs",
        str(a.workers),
        "--duration",
        str(a.duration),
        "--conns",
        "64",
        "--batch",
        str(a.batch),
        "--read-max",
        str(a.pull_max),
        "--read-conns",
        str(a.consume_conns),
        "--payload-bytes",
        str(MSG_BYTES),
    ]
    r = ceiling(ctx, "redispy", "baseline R", args, a.duration * 4 + 180)
    log(
        "  baseline R: "
        + ", ".join(f"{k} {ph['messages_per_s']:.0f} msgs/s" for k, _, _, ph, _ in redis_baseline_rows(r))
    )


def wait_progress(gw: Gateway, n: int, t0: float, timeout: float) -> float:
    """Poll progress until `max` is `n` (errors while a backend comes back are retried)."""
    last = ""
    while time.monotonic() - t0 < timeout:
        try:
            got = totals(gw.progress(REC_CONSUMER))["max"]
        except (BenchFailure, OSError, http.client.HTTPException) as exc:
            last = str(exc)
        else:
            if got == n:
                return time.monotonic()
            if got > n:
                raise BenchFailure(f"recovery: progress max is {got}, expected {n}")
            last = f"progress max {got}, expected {n}"
        time.sleep(0.002)
    raise BenchFailure(f"recovery: not all messages visible after {timeout} s: {last[:300]}")


def bench_recovery(ctx: Ctx) -> None:
    """A 1-queue topic of --recovery-messages, kill -9 of the gateway, restart: seconds to
    /healthz and to every message visible. Embedded: EmbeddedStore.open() on a copy of the
    crashed data directory. Redis (no local state): a gateway restart, then, on our own Redis,
    a kill -9 and restart of redis-server under the running gateway."""
    n, redis = ctx.args.recovery_messages, ctx.redis
    prefix = f"{ctx.gw_prefix}-rec" if redis else ""
    if redis:
        redis.prefixes.append(prefix)
        if redis.own and ctx.gw_prefix:
            # the other benchmarks' keys go, and the AOF is rewritten: the restart below then
            # loads the recovery data only
            dropped = redis.delete_prefix(ctx.gw_prefix)
            redis.rewrite_aof()
            log(f"  dropped {dropped} keys of the earlier benchmarks, AOF rewritten")
        ctx.notes.append(
            "recovery: the Redis store keeps no state in the gateway, so instead of a crash recovery this "
            "times a "
            "restart of the gateway (every worker killed -9)"
            + (" and a kill -9 + restart of redis-server under the running gateway" if redis.own else "")
        )
    gw = ctx.gateway("recovery", prefix)
    res: dict = {"messages": n, "redis": bool(redis)}
    ctx.results["recovery"] = res
    if not redis:
        starts = []
        for i in range(COLD_STARTS):
            empty = ctx.gateway(f"cold-start-{i}")
            try:
                starts.append(empty.start())
            finally:
                empty.stop()
        res["cold_starts_s"] = starts
        runs = ", ".join(f"{s:.3f}" for s in starts)
        log(f"  process start -> /healthz on an empty data directory: {runs} s")
    try:
        gw.start()
        ptoken, _ = register(gw, REC_TOPIC, 1, REC_PRODUCER, REC_CONSUMER)
        await_registry(gw)
        log(f"  filling a 1-queue topic with {n} messages")
        res["fill_msgs_per_s"] = n / produce_batches(gw.port, ptoken, REC_PRODUCER, n)
        if totals(gw.progress(REC_CONSUMER))["max"] != n:
            raise BenchFailure(f"recovery: after filling {n}, progress max is not {n}")
        log(f"  filled at {res['fill_msgs_per_s']:.0f} msgs/s; kill -9 of the gateway")
        gw.kill9()
        if not redis:
            res["data_bytes"] = sum(f.stat().st_size for f in gw.data_dir.rglob("*") if f.is_file())
            shutil.copytree(gw.data_dir, ctx.work / "recovery-crash-copy")
        t0 = time.monotonic()
        res["healthz_s"] = gw.start()
        res["all_workers_s"] = gw.all_workers_s
        res["data_s"] = wait_progress(gw, n, t0, 60) - t0
        h = Http(gw.port, ptoken)
        h.ok("POST", "/mq/produce", {"producer": REC_PRODUCER, "message": "after restart"})
        res["produce_after_restart_s"] = time.monotonic() - t0
        log(
            f"  restart: /healthz after {res['healthz_s']:.3f} s, all {gw.workers or 1} worker(s) after "
            f"{res['all_workers_s']:.3f} s, all {n} messages visible after {res['data_s']:.3f} s"
        )
        if redis and redis.own:
            recover_redis(redis, gw, h, n, res)
        h.close()
    finally:
        gw.stop()
        res["gateway_command"] = " ".join(gw.cmd)
    if not redis:
        copy = ctx.work / "recovery-crash-copy"
        o = ceiling(ctx, "recovery-open", "open", ["store", "open", "--data-dir", str(copy)], 120, load=False)
        res.update(open_s=o["open_s"], open_bytes_cut=o["recovered_bytes_cut"], open_command=o["command"])
        if o["messages"].get(REC_TOPIC) != n:
            ctx.problems.append(
                f"recovery: in-process open of the crash copy saw {o['messages']} messages, expected {n}"
            )
        log(f"  in-process EmbeddedStore.open() on the crash copy: {o['open_s']:.3f} s")
        shutil.rmtree(copy, ignore_errors=True)


def recover_redis(redis: RedisServer, gw: Gateway, h: Http, n: int, res: dict) -> None:
    """kill -9 of our redis-server under the running gateway: seconds to PING (AOF loaded), to
    every message visible through the gateway, to the first produce through it."""
    # everysec: give the last second's writes time to reach the AOF, so this measures the
    # load time (a loss would be reported, not hidden)
    time.sleep(1.5)
    res["aof_bytes"] = redis.aof_bytes()
    log(f"  kill -9 of redis-server ({res['aof_bytes'] / 1e6:.0f} MB of AOF)")
    redis.kill9()
    t0 = time.monotonic()
    res["redis_ready_s"] = redis.start(timeout=300)
    res["redis_data_s"] = wait_progress(gw, n + 1, t0, 120) - t0
    t2 = time.monotonic()
    while True:  # the gateway's pooled connections died with Redis: first write back
        try:
            h.ok("POST", "/mq/produce", {"producer": REC_PRODUCER, "message": "after redis"})
            break
        except BenchFailure:
            if time.monotonic() - t2 > 30:
                raise
            time.sleep(0.01)
    res["redis_produce_s"] = time.monotonic() - t0
    log(
        f"  redis restart: PING after {res['redis_ready_s']:.3f} s, all messages visible through the "
        f"gateway after "
        f"{res['redis_data_s']:.3f} s, a produce after {res['redis_produce_s']:.3f} s"
    )


def trace_index_catch_up(ctx: Ctx, limit_s: float = 300.0) -> None:
    """With --trace: the trace index's lag when the load stopped, and how long it took to catch
    up (the indexer keeps up when this stays small)."""

    def lag() -> tuple[float, float]:
        _, _, raw = ctx.gw.admin.request("GET", "/metrics")
        found = dict(re.findall(r"^(mqgate_trace_[a-z_]+?)(?:_total)? ([0-9.e+]+)$", raw.decode(), re.M))
        return float(found.get("mqgate_trace_index_lag_events", 0)), float(
            found.get("mqgate_trace_events_indexed", 0)
        )

    start = time.monotonic()
    first, indexed0 = lag()
    events = first
    while events > 0 and time.monotonic() - start < limit_s:
        time.sleep(0.5)
        events, _ = lag()
    took = time.monotonic() - start
    _, indexed = lag()
    log(
        f"  trace index: {first:,.0f} events behind when the load stopped; caught up in {took:.1f} s "
        f"({indexed:,.0f} "
        f"events indexed in all; {(indexed - indexed0) / max(took, 0.001):,.0f} events/s meanwhile)"
    )
    ctx.notes.append(
        f"trace index lag at the end of the load: {first:,.0f} events, caught up in {took:.1f} s"
        + ("" if events == 0 else f" (still {events:,.0f} behind after {limit_s:.0f} s)")
    )


# --- the report ----------------------------------------------------------------------------------


def redis_lines(ctx: Ctx) -> list[str]:
    """The Redis under test, for the header."""
    redis, a, conf = ctx.redis, ctx.args, ctx.redis.config
    persistence = ", ".join(f"{k} {conf.get(k, '?')!r}" for k in ("appendonly", "appendfsync", "save"))
    if conf.get("appendonly") != "yes":
        durability = "not on disk at all (no AOF: a Redis crash loses what the last snapshot lacks)"
    elif conf.get("appendfsync") == "always":
        durability = "in the AOF, fsynced before Redis answers (appendfsync always)"
    else:
        durability = (
            "the AOF is fsynced about once a second (a Redis crash may lose ~1 s of acknowledged writes)"
        )
    where = (
        f"started by the harness on {redis.url} (data in the temp dir, stopped by PID at the end): "
        f"`{shlex.join(redis.cmd)}`"
        if redis.own
        else f"an existing Redis at {redis.url} (keys under this run's prefixes, deleted at the end)"
    )
    out = [
        f"- redis: redis-server {redis.version}, {where}; {persistence}. The embedded store's figures are "
        "fsync=always (every produce and ack answered after fsync); here a produce is answered once Redis "
        "has it "
        f"in memory and {durability}",
        f"- gateways: {a.workers} worker process(es) on one port (`--workers {a.workers}`), registry "
        f"SQLite in the "
        f"data dir, MQGATE_REDIS_PREFIX `{ctx.gw_prefix}`",
        "- CPU: the machine's cores are shared by wrk, the gateway workers and redis-server (and by the "
        "client "
        "processes of the baselines); each row's note splits the use",
    ]
    if e := ctx.redis_end:
        aof = (
            f", AOF on disk {e['aof_bytes_now'] / 1e6:.0f} MB" if redis.own and e.get("aof_bytes_now") else ""
        )
        out.append(
            f"- redis after the load benchmarks and baselines (before benchmark 6): "
            f"{e.get('used_memory_human', '?')} "
            f"used, {e.get('total_forks', '?')} fork(s) for {e.get('aof_rewrites', '?')} automatic AOF "
            f"rewrite(s){aof}"
        )
    return out


def report(ctx: Ctx) -> tuple[list[str], list[results.Row], list[str]]:
    """The run's header lines, its rows (those with ids measured against their ceiling of the
    same run: the current table's) and what follows the table: notes, problems, commands."""
    R, a, failures, redis = ctx.results, ctx.args, ctx.failures, ctx.redis is not None
    st, rp, rec = R.get("store", {}), R.get("redispy", {}), R.get("recovery", {})
    loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    gw_cmd = " ".join(ctx.gw.cmd) if ctx.gw else "?"
    lines = [
        f"- gateway: `{gw_cmd}` (MQGATE_ADMIN_TOKEN set), store `{a.store}`; CPU busy before the run "
        f"{ctx.busy_before:.0f} % (load average {loadavg})",
        *(redis_lines(ctx) if redis else []),
    ]
    if s := ctx.server:
        lines.append(
            f"- HTTP server in the gateway process: {s['server']}, {s['workers']} worker(s), "
            f"uvloop={s['uvloop']}"
        )
    if ctx.preflight:
        lines.append(
            f"- pre-flight protocol checks (envelope, 401/403, pull fields, release): {ctx.preflight}"
        )
    stored = f" (stored in Redis as a {ctx.record_bytes}-byte JSON record)" if ctx.record_bytes else ""
    lines.append(
        f"- {a.duration:g} s per load run; topic `{TOPIC}` with 8 queues; messages of {MSG_BYTES} "
        f"bytes{stored}"
    )
    if redis and a.workers != 2:
        lines.append("- the Redis targets are stated for `--workers 2`; shown here for comparison only")
    rows: list[results.Row] = []
    prefix = "gateway" + (".redis" if redis else "") + (f".traced-{a.trace}" if a.trace else "")
    store_name = "RedisStore" if redis else "store"

    def rate(name: str, of: dict = R, key: str = "msgs_per_s") -> Any:
        return of.get(name, {}).get(key)

    loads = {  # load: (what, baseline R phase and name, store phase and name)
        "produce": (
            "produce, 1 msg/request, wrk -t2 -c64",
            "xadd_single",
            "XADD",
            "append_single_conc",
            "single append",
        ),
        "batch": (
            f"produce batch of {a.batch}, wrk -t2 -c{a.batch_conns}",
            "xadd_batch",
            "XADD batches",
            "append_batch",
            "batched append",
        ),
        "consume": (
            f"consume, pull max={a.pull_max} + ack via the next requestId, wrk -t2 -c{a.consume_conns}",
            "xrange",
            "XRANGE",
            "read_raw" if "read_raw" in st else "read",
            "reads",
        ),
    }
    for name, (what, rphase, rwhat, sphase, swhat) in loads.items():
        if name in failures:
            rows.append(results.Row("", what, f"FAILED: {failures[name]}"))
        if name not in R:
            continue
        r, value = R[name], R[name]["msgs_per_s"]
        by_store = rate(sphase, st, "messages_per_s")
        others = [f"{ratio(value, by_store)} of {store_name} {swhat}"] if redis or name == "produce" else []
        if redis:
            ref, ref_text = rate(rphase, rp, "messages_per_s"), f"baseline R: {rwhat} with redis-py"
            ok = value >= REDIS_TARGETS[name] and bool(ref) and value / ref >= REDIS_RATIO_GOAL
            others.append(
                f"targets ≥ {REDIS_TARGETS[name]:,} msgs/s and ≥ {REDIS_RATIO_GOAL} of baseline R {mark(ok)}"
            )
        elif name == "produce":
            ref, ref_text = (
                rate("baseline", R, "req_per_s"),
                "baseline A: raw ASGI app, same server, same wrk",
            )
        else:
            ref, ref_text = by_store, f"{store_name} {swhat}, in process"
        if name == "produce" and redis:
            others.append(f"{ratio(value, rate('baseline', R, 'req_per_s'))} of baseline A")
        if name == "produce" and "durable" in R:
            others.append(f"{ratio(value, rate('durable', R, 'req_per_s'))} of baseline D (durable)")
        notes = f"p50 / p99 {r['lat_p50_us'] / 1000:.2f} / {r['lat_p99_us'] / 1000:.2f} ms"
        if name == "consume":
            notes = (
                f"lag {r['lag_before']:,} → {r['lag_after']:,}; delivered {r['received']:,}; acks ok "
                f"{r['acks_ok']:,} / failed {r['acks_bad']}; {fmt(r['pulls_per_s'])} pulls/s over "
                f"{r['window_s']:.1f} s"
            )
        unit = " req/s" if name == "produce" and not redis else " msgs/s"
        rows.append(
            results.Row(
                f"{prefix}.{name}" if ref else "",
                what,
                fmt(value, " msgs/s"),
                f"{ref_text}: {fmt(ref, unit)}" if ref else "—",
                ratio(value, ref),
                notes,
                "; ".join([*others, wrk.cpu_note(r, redis)]),
            )
        )
    if b := R.get("baseline"):
        rows.append(
            results.Row(
                "",
                "baseline A: raw ASGI app, same server, same wrk as produce",
                fmt(b["req_per_s"], " req/s"),
                notes=f"p50 / p99 {b['lat_p50_us'] / 1000:.2f} / {b['lat_p99_us'] / 1000:.2f} ms",
                more=wrk.cpu_note(b, redis),
            )
        )
    if d := R.get("durable"):
        of_a = f"; {ratio(d['req_per_s'], b['req_per_s'])} of baseline A" if b else ""
        rows.append(
            results.Row(
                "",
                "baseline D: baseline A making each body durable (one log file, one fsync a round), same wrk",
                fmt(d["req_per_s"], " req/s"),
                notes=f"p50 / p99 {d['lat_p50_us'] / 1000:.2f} / {d['lat_p99_us'] / 1000:.2f} ms{of_a}",
                more=wrk.cpu_note(d, redis),
            )
        )
    for _, what, figure, ph, _ in redis_baseline_rows(rp) if rp else []:
        rows.append(results.Row("", what, figure, more=phase_note(rp, ph)))
    if st:
        label = f"RedisStore in-process ({st.get('procs', 1)} process(es))" if redis else "store"
        cpu = f"store run CPU {st['store_cpu_pct']:.0f} %, other processes {st['other_cpu_pct']:.0f} %"
        for key, what, ph in store_rows(st, label):
            unit = " appends/s" if key.startswith("append-1") else " msgs/s"
            notes = (
                f"p50 {ph['p50_ms']:.3f} ms; {cpu}"
                if key == "append-1-seq"
                else f"{fmt(ph['calls_per_s'])} calls/s"
            )
            rows.append(results.Row("", f"baseline B: {what}", fmt(ph["messages_per_s"], unit), notes=notes))
    for name in ("baseline", "durable", "redispy", "store", "recovery"):
        if name in failures:
            rows.append(results.Row("", name, f"FAILED: {failures[name]}"))
    if "healthz_s" in rec:
        n, w = rec["messages"], a.workers or 1
        met = max(rec["healthz_s"], rec.get("data_s", 0)) <= RECOVERY_TARGET_S
        target = f"target ≤ {RECOVERY_TARGET_S:g} s {mark(met)}"
        seen = f"all messages visible after {rec.get('data_s', float('nan')):.3f} s; {target}"
        if redis:
            what = f"gateway restart: {n:,}-msg queue in Redis, kill -9 of all {w} workers → /healthz 200"
            more = f"all {w} workers answer after {rec['all_workers_s']:.3f} s"
            if "redis_ready_s" in rec:
                more += (
                    f"; redis-server kill -9 ({rec['aof_bytes'] / 1e6:.0f} MB of AOF) → PING "
                    f"{rec['redis_ready_s']:.3f} s, "
                    f"all messages through the gateway {rec['redis_data_s']:.3f} s, a produce "
                    f"{rec['redis_produce_s']:.3f} s"
                )
            rows.append(
                results.Row(f"{prefix}.recovery", what, f"{rec['healthz_s']:.3f} s", notes=seen, more=more)
            )
        elif "open_s" in rec:
            if starts := rec.get("cold_starts_s"):
                median = statistics.median(starts)
                rows.append(
                    results.Row(
                        f"{prefix}.coldstart",
                        f"process start → /healthz 200, an empty data directory, median of {len(starts)}",
                        f"{median:.3f} s",
                        notes=f"runs {', '.join(f'{s:.3f}' for s in starts)} s; target ≤ "
                        f"{COLD_START_TARGET_S:g} s {mark(median <= COLD_START_TARGET_S)}",
                    )
                )
            rows.append(
                results.Row(
                    f"{prefix}.recovery",
                    f"kill -9 with a {n:,}-message queue → /healthz 200",
                    f"{rec['healthz_s']:.3f} s",
                    f"EmbeddedStore.open() in process: {rec['open_s']:.3f} s",
                    f"{rec['open_s'] / rec['healthz_s']:.2f}",
                    seen,
                    f"{rec['data_bytes'] / 1e6:.0f} MB on disk; {rec['open_bytes_cut']} bytes cut",
                )
            )
    after = [*(["Notes:", *[f"- {n}" for n in ctx.notes], ""] if ctx.notes else [])]
    if failures or ctx.problems:
        after += [
            "Problems seen:",
            *[f"- FAILED {k}: {v}" for k, v in failures.items()],
            *[f"- {p}" for p in ctx.problems],
            "",
        ]
    cmds = [R[k]["command"] for k in ("produce", "batch", "consume", "baseline") if k in R]
    cmds += [f"# baseline A server: {R['baseline']['server_command']}"] if "baseline" in R else []
    cmds += [x["command"] for x in (rp, st) if x] + ([rec["open_command"]] if "open_command" in rec else [])
    if cmds:
        after += ["Load commands (ports and paths are per run):", "", *[f"    {c}" for c in cmds]]
    return lines, rows, after


# --- the run ---------------------------------------------------------------------------------------


def wait_idle(ctx: Ctx) -> None:
    """Idle = three 2-second samples in a row below --idle-below, or --wait-idle seconds gone."""
    a, t_wait, quiet = ctx.args, time.monotonic(), 0
    while True:
        ctx.busy_before = procs.cpu_busy(2.0)
        quiet = quiet + 1 if ctx.busy_before <= a.idle_below else 0
        waited = time.monotonic() - t_wait
        if quiet >= 3 or waited >= a.wait_idle:
            break
        if quiet == 0:
            log(
                f"machine {ctx.busy_before:.0f} % busy; waiting for < {a.idle_below:.0f} % "
                f"({waited:.0f}/{a.wait_idle:.0f} s)"
            )
    if ctx.busy_before > a.idle_below:
        log(f"warning: the machine is {ctx.busy_before:.0f} % busy before the run; figures will be low")


def run(ctx: Ctx, only: list[str]) -> None:
    a, failures = ctx.args, ctx.failures
    if a.store == "redis":
        ctx.redis = (
            RedisServer(a.redis_url, own=False)
            if a.redis_url
            else RedisServer.own_server(ctx.work, a.redis_fsync)
        )
        try:
            log(
                f"redis {ctx.redis.version} at {ctx.redis.url} ready in {ctx.redis.start():.2f} s: "
                f"{ctx.redis.config}"
            )
        except (BenchFailure, OSError, RedisReplyError) as exc:
            failures.update(dict.fromkeys(only, f"redis setup: {exc}"))
            return
        ctx.gw_prefix = "mqbench-" + secrets.token_hex(4)
        ctx.redis.prefixes.append(ctx.gw_prefix)
    needs_gateway = [b for b in only if b in ("produce", "batch", "consume", "baseline")]
    if needs_gateway:
        gw = ctx.gw = ctx.gateway("gateway", ctx.gw_prefix)
        try:
            log(f"gateway up on port {gw.port} in {gw.start():.2f} s: {' '.join(gw.cmd)}")
            ctx.server = detect_server(gw)
            log(f"gateway HTTP server: {ctx.server}")
            ctx.ptoken, ctx.ctoken = register(gw, TOPIC, 8, PRODUCER, CONSUMER)
            if a.trace:  # every message of the benchmark topic traced (SPEC P2): a project policy
                gw.post("/admin/trace-policies", {"mode": "project", "project": "default", "level": a.trace})
                log(f"  tracing every message at {a.trace}")
            await_registry(gw)
            preflight(ctx)
        except BenchFailure as exc:
            failures.update(dict.fromkeys(needs_gateway, f"gateway setup: {exc}"))
        for name, fn in (("produce", bench_produce), ("batch", bench_produce), ("consume", bench_consume)):
            if name in only and name not in failures:
                attempt(ctx, name, lambda fn=fn, name=name: fn(ctx, name) if fn is bench_produce else fn(ctx))
        if ctx.redis is not None:
            ctx.record_bytes = stored_record_bytes(ctx)
        if a.trace and gw.admin:
            trace_index_catch_up(ctx)
        if gw.proc is not None and gw.proc.poll() is not None:
            ctx.problems.append(
                f"gateway exited during the run with {gw.proc.returncode}: {tail(gw.log_path, 10)}"
            )
        gw.stop()
        if errs := gw.errors_in_log():
            ctx.problems.append(f"gateway log has {len(errs)} error lines, first: {errs[0][:300]}")
    for name, fn in (
        ("baseline", bench_baseline),
        ("durable", lambda ctx: bench_baseline(ctx, "durable")),
        ("redispy", bench_redispy),
        ("store", bench_store),
        ("recovery", bench_recovery),
    ):
        if name in only and name not in failures:
            if name == "recovery":
                redis_stats(ctx)
            attempt(ctx, name, lambda fn=fn: fn(ctx))


def attempt(ctx: Ctx, name: str, fn: Any) -> None:
    log(f"{name} ...")
    try:
        fn()
    except BenchFailure as exc:
        ctx.failures[name] = str(exc)
        log(f"  FAILED: {exc}")


def redis_stats(ctx: Ctx) -> None:
    if ctx.redis is not None and not ctx.redis_end:
        with contextlib.suppress(OSError, RedisReplyError, ValueError):
            ctx.redis_end = ctx.redis.stats()
            ctx.redis_end["aof_bytes_now"] = ctx.redis.aof_bytes()


def stored_record_bytes(ctx: Ctx) -> int:
    """Size of one stored message in the gateway's Redis stream (its `d` field), for the
    comparison with baseline R's 100-byte entries; 0 if the key layout is not the one known."""
    with (
        contextlib.suppress(OSError, RedisReplyError, IndexError, TypeError, ValueError),
        connection(ctx.redis.url) as c,
    ):
        entry = c.call("XRANGE", f"{ctx.gw_prefix}:{{t:{TOPIC}}}:q:0", "-", "+", "COUNT", 1)
        fields = entry[0][1]
        return len(dict(zip(fields[::2], fields[1::2], strict=True))[b"d"])
    return 0


def main(a: argparse.Namespace) -> int:
    if a.store.startswith("redis://"):
        a.store, a.redis_url = "redis", a.store
    if a.store not in ("embedded", "redis"):
        raise SystemExit(f"--store must be embedded, redis or a redis:// URL, not {a.store!r}")
    if a.redis_url and (a.store != "redis" or not a.redis_url.startswith("redis://")):
        raise SystemExit("--redis-url takes a redis:// URL and goes with --store redis")
    if a.store == "redis" and a.workers is None:
        a.workers = 2
    if a.store == "redis" and not a.redis_url and shutil.which("redis-server") is None:
        raise SystemExit(
            "redis-server is not installed (apt-get install -y redis-server), or give --redis-url"
        )
    a.duration = a.duration or (3.0 if a.quick else 10.0)
    a.prefill = a.prefill or (800_000 if a.quick else 4_000_000)
    a.recovery_messages = a.recovery_messages or (200_000 if a.quick else 1_000_000)
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    if unknown := set(only) - set(ALL):
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if a.store == "embedded" and set(only) & REDIS_ONLY:
        raise SystemExit(f"{', '.join(sorted(set(only) & REDIS_ONLY))} needs --store redis")
    only = only or [b for b in ALL if a.store == "redis" or b not in REDIS_ONLY]
    wrk.require()
    if not MQGATE.exists():
        raise SystemExit(f"{MQGATE} not found (make install)")
    ctx = Ctx(a, Path(tempfile.mkdtemp(prefix="mqgate-bench-")))
    log(f"work dir {ctx.work}")
    wait_idle(ctx)
    try:
        run(ctx, only)
    finally:
        if ctx.redis is not None:
            redis_stats(ctx)
            ctx.redis.stop()
        procs.cleanup()
        lines, rows, after = report(ctx)
        kind = f"{'quick' if a.quick else 'full'} run" + (
            f", store redis, --workers {a.workers}" if ctx.redis else ""
        )
        failed = " (FAILURES)" if ctx.failures else ""
        results.record(a, f"main table: {kind}{failed}", rows, lines, after, results.machine(ctx.work))
        if a.keep:
            log(f"kept {ctx.work}")
        else:
            shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if ctx.failures else 0


# --- server choice -----------------------------------------------------------------------------------


def server_choice(a: argparse.Namespace) -> int:
    """The raw ASGI app under uvicorn and granian, 1 worker each, the same wrk load."""
    wrk.require()
    work = Path(tempfile.mkdtemp(prefix="mqgate-server-choice-"))
    app, common = "benchmarks.bench.baseline_asgi:app", ["--host", HOST, "--workers", "1", "--no-access-log"]
    granian = [str(VENV_BIN / "granian"), "--interface", "asgi", *common, "--loop", "uvloop", "--no-ws"]
    servers = {
        "uvicorn": [str(VENV_BIN / "uvicorn"), app, *common, "--http", "httptools", "--loop", "uvloop"],
        "granian_st": [*granian, "--runtime-mode", "st", "--runtime-threads", "1", app],
        "granian_mt2": [*granian, "--runtime-mode", "mt", "--runtime-threads", "2", app],
    }
    env = {"MQB_TOKEN": "baseline-token-not-checked", "MQB_PRODUCER": "bench-producer", "MQB_PATH": "/"}
    rows = []
    try:
        for name, cmd in servers.items():
            if not Path(cmd[0]).exists():
                rows.append(results.Row("", name, "not installed"))
                continue
            with baseline_server(lambda port, cmd=cmd: [*cmd, "--port", str(port)], work / f"{name}.log") as (
                port,
                proc,
            ):
                wrk.wrk("produce.lua", f"http://{HOST}:{port}/", 64, 2, env)  # warm-up
                for r in range(a.rounds):
                    res = wrk.measured(proc.pid, "produce.lua", f"http://{HOST}:{port}/", 64, a.duration, env)
                    p50, p99 = res["lat_p50_us"] / 1000, res["lat_p99_us"] / 1000
                    value = fmt(res["ok_requests"] / res["seconds"], " req/s")
                    rows.append(
                        results.Row(
                            "",
                            f"{name}, round {r + 1}",
                            value,
                            notes=f"p50 / p99 {p50:.2f} / {p99:.2f} ms",
                            more=wrk.cpu_note(res),
                        )
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results.record(a, "HTTP server choice: the raw ASGI app under uvicorn and granian", rows)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "gateway", __doc__, help="the main table (default): produce, consume, cold start"
    )
    p.add_argument(
        "--store",
        default="embedded",
        help="embedded (default), redis (a redis-server of its own), redis://...",
    )
    p.add_argument("--redis-url", help="with --store redis: use this existing Redis, do not start one")
    p.add_argument(
        "--redis-fsync", choices=["always", "everysec"], default="everysec", help="appendfsync of our redis"
    )
    p.add_argument(
        "--workers", type=int, help="gateway processes (default: 2 with Redis; for embedded not passed)"
    )
    p.add_argument("--quick", action="store_true", help="short runs (3 s, smaller fills)")
    p.add_argument("--only", default="", help=f"comma list out of {','.join(ALL)}")
    p.add_argument("--duration", type=float, help="seconds per load run (default 10, quick 3)")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--batch-conns", type=int, default=16)
    p.add_argument(
        "--consume-conns",
        type=int,
        default=8,
        help="consume's connections (≤ queues: no pull finds all locked)",
    )
    p.add_argument("--pull-max", type=int, default=100)
    p.add_argument("--prefill", type=int, help="backlog before consume (default 4,000,000; quick 800,000)")
    p.add_argument(
        "--recovery-messages", type=int, help="the recovery queue (default 1,000,000; quick 200,000)"
    )
    p.add_argument(
        "--wait-idle", type=float, default=0.0, help="wait up to this many seconds for an idle machine"
    )
    p.add_argument(
        "--idle-below", type=float, default=15.0, help="percent CPU busy counted as idle (default 15)"
    )
    p.add_argument(
        "--trace", choices=("info", "error", "debug"), help="trace every message of the benchmark topic"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (gateway logs)")
    p.set_defaults(func=main)
    s = results.subcommand(
        sub, common, "server-choice", None, help="the raw ASGI app under uvicorn vs granian"
    )
    s.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    s.add_argument("--rounds", type=int, default=2)
    s.set_defaults(func=server_choice)
