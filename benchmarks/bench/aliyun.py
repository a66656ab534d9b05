"""Alibaba Cloud MQ's HTTP API against the native API (`run.py aliyun`, issue 32): one gateway of
its own (`mqgate serve` as shipped: embedded store, the gateway's own fsync default, a fresh data
directory), one access key of the `default` project, and:

  publish   a publish (`POST /topics/<topic>/messages?ns=default`, the Python SDK's XML body of one
            100-byte message, `MQ <key>:<HMAC-SHA1>` signed as the SDKs sign) against the native
            `POST /mq/produce` of one 100-byte message, both `wrk -t2 -c64`, the same duration,
            alternating (native, aliyun, aliyun, native, native, aliyun): the medians, their
            ratio (target >= 0.7), p50 / p99. The publish is signed in Python just before each
            run (a fixed Date: the gateway accepts a signature for 15 minutes either way) and
            replayed by wrk (lua/aliyun_publish.lua). Each run's stored messages are checked
            against its 2xx answers.
  consume   a consume (`GET /topics/<topic>/messages?consumer=<group>&numOfMessages=16&ns=default`,
            `MQ` signed) then an ack of its receipt handles (`DELETE …`, the SDK's
            `<ReceiptHandles>` XML, signed), against the native `POST /mq/receive` (max 16) then
            `POST /mq/delete` of the same kind of consumer (`mode=message`: an Aliyun group is
            one). An asyncio client of its own (a process apart, `python -m bench.aliyun
            client`, raw keep-alive HTTP/1.1 on asyncio streams as bench/sqs.py's) runs `--conns`
            loops, each request signed as it is sent, as the SDKs sign; the consume's XML is read
            for its handles only. Each topic is topped up through the native batch produce before
            each run; the runs alternate (native, aliyun, aliyun, native, native, aliyun). Figure:
            acked messages per second, checked against the consumer's committed offsets.

Both topics have 4 queues. Rows: `aliyun.publish`, `aliyun.consume_ack`.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqgate.aliyun import signature
from mqgate.aliyun import xml as mqxml

from . import gateway, procs, results, wrk
from .common import BENCH_DIR, HOST, MQGATE, MSG_BYTES, VENV_PY, BenchFailure, fmt, log, percentile, ratio
from .servers import Gateway, produce_batches, register, totals
from .sqs import Conn, Tally, checked_consume_run, cpu_note, settle

PUBLISH_TARGET_RATIO = 0.7
NATIVE_TOPIC, NATIVE_PRODUCER, NATIVE_CONSUMER = "alib-native", "alib-native-p", "alib-native-c"
ALI_TOPIC, ALI_PRODUCER, ALI_CONSUMER = "alib-ali", "alib-ali-p", "alib-ali-c"
ORDER = ("native", "aliyun", "aliyun", "native", "native", "aliyun")
CONTENT_TYPE = "text/xml;charset=UTF-8"
CONSUME_BATCH = 16  # the protocol's numOfMessages at most; the native receive takes as many
EMPTY_STOP = 20  # a client loop stops after this many empty consumes in a row (the topic drained)
_HANDLE = re.compile(rb"<ReceiptHandle>([^<]*)</ReceiptHandle>")


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    gw: Gateway | None = None
    key_id: str = ""
    secret: str = ""
    tokens: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)  # kind (publish) or ("consume", kind) -> [result, ...]
    rates: dict = field(default_factory=dict)  # consume kind -> msgs/s of its last run
    failures: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    busy_before: float = 0.0


def publish_body() -> str:
    """The Python SDK's publish document (minidom, no newlines) of one MSG_BYTES message."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Message xmlns="{mqxml.XMLNS}">'
        f"<MessageBody>{'x' * MSG_BYTES}</MessageBody><MessageTag>TagA</MessageTag></Message>"
    )


def signed_headers(ctx: Ctx, path: str) -> dict[str, str]:
    headers = {
        "Content-Type": CONTENT_TYPE,
        "Date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
        "x-mq-version": signature.VERSION,
    }
    headers["Authorization"] = signature.authorization(ctx.key_id, ctx.secret, "POST", headers, path)
    return headers


def setup(ctx: Ctx) -> None:
    gw = ctx.gw = Gateway(ctx.work / "data", fsync=None, log_path=ctx.work / "gateway.log")
    log(f"gateway up on port {gw.port} in {gw.start():.2f} s: {' '.join(gw.cmd)}")
    key = gw.post("/admin/access-keys", {"name": "aliyun-bench", "project": "default"})
    ctx.key_id, ctx.secret = key["accessKeyId"], key["secretAccessKey"]
    for topic, producer, consumer in (
        (NATIVE_TOPIC, NATIVE_PRODUCER, NATIVE_CONSUMER),
        (ALI_TOPIC, ALI_PRODUCER, ALI_CONSUMER),
    ):
        ctx.tokens[producer], ctx.tokens[consumer] = register(
            gw, topic, 4, producer, consumer, mode="message", lockTimeoutS=30
        )


def publish_run(ctx: Ctx, kind: str, duration: float, record: bool = True) -> dict:
    gw, conns = ctx.gw, 64
    assert gw is not None
    if kind == "aliyun":
        path = f"/topics/{ALI_TOPIC}/messages?ns=default"
        body = publish_body()
        h = signed_headers(ctx, path)
        c = http.client.HTTPConnection(HOST, gw.port, timeout=30)  # the request wrk replays, once
        c.request("POST", path, body=body.encode(), headers=h)
        r = c.getresponse()
        answer, status = r.read(), r.status
        c.close()
        if status != 201 or mqxml.message_body_md5("x" * MSG_BYTES).encode() not in answer:
            raise BenchFailure(f"publish as wrk sends it -> HTTP {status}: {answer[:300]!r}")
        env = {
            "MQB_BODY": body,
            "MQB_DATE": h["Date"],
            "MQB_AUTHORIZATION": h["Authorization"],
            "MQB_PATH": path,
        }
        script, url, consumer = "aliyun_publish.lua", f"{gw.url}{path}", ALI_CONSUMER
    else:
        env = {
            "MQB_TOKEN": ctx.tokens[NATIVE_PRODUCER],
            "MQB_PRODUCER": NATIVE_PRODUCER,
            "MQB_MSG_BYTES": str(MSG_BYTES),
        }
        script, url, consumer = "produce.lua", f"{gw.url}/mq/produce", NATIVE_CONSUMER
    before = totals(gw.progress(consumer))["max"]
    res = wrk.measured(gw.pid, script, url, conns, duration, env)
    what = f"publish ({kind})"
    problems = wrk.check_errors(res, what) + wrk.other_load(what, res)
    stored = settle(gw, consumer, before, res["ok_requests"])
    if stored < res["ok_requests"]:
        raise BenchFailure(f"{what}: {res['ok_requests']} answered 2xx but {stored} messages were stored")
    res.update(kind=kind, stored=stored, msgs_per_s=res["ok_requests"] / res["seconds"])
    res["server_us_per_msg"] = wrk.server_cpu_per_request(res)
    log(
        f"  publish {kind}: {res['msgs_per_s']:.0f} msgs/s, p50 {res['lat_p50_us'] / 1000:.2f} ms, p99 "
        f"{res['lat_p99_us'] / 1000:.2f} ms, server CPU {res['server_us_per_msg']:.0f} µs/msg"
        + ("" if record else " (warm-up)")
    )
    if record:
        ctx.problems.extend(problems)
        ctx.runs.setdefault(kind, []).append(res)
    return res


def bench_publish(ctx: Ctx) -> None:
    d = ctx.args.duration
    for kind in ("native", "aliyun"):  # warm-up, not counted
        publish_run(ctx, kind, min(2.0, d), record=False)
    for kind in ORDER:
        publish_run(ctx, kind, d)


# --- consume + ack: the client (a process apart) ------------------------------------------------


def _date() -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime())


def ack_body(handles: list[str]) -> bytes:
    """The SDKs' `<ReceiptHandles>` document (the handles are the gateway's: nothing to escape)."""
    items = "".join(f"<ReceiptHandle>{h}</ReceiptHandle>" for h in handles)
    head = f'<?xml version="1.0" encoding="UTF-8"?><ReceiptHandles xmlns="{mqxml.XMLNS}">'
    return f"{head}{items}</ReceiptHandles>".encode()


async def client_loop(cfg: dict, t: Tally, clock: dict, start: asyncio.Event, loads: Any, dumps: Any) -> None:
    mode, port = cfg["mode"], cfg["port"]
    conn = await Conn.open(port)
    bearer = {"Authorization": f"Bearer {cfg.get('token', '')}", "Content-Type": "application/json"}
    path = f"/topics/{cfg.get('topic', '')}/messages?consumer={cfg.get('group', '')}&ns=default"
    consume_path = f"{path}&numOfMessages={CONSUME_BATCH}"
    key_id, secret = cfg.get("key_id", ""), cfg.get("secret", "")
    empty_run = 0
    perf = time.perf_counter
    await start.wait()
    try:
        while time.monotonic() < clock["deadline"] and t.errors < 100:
            t0 = perf()
            if mode == "aliyun":
                h = {"x-mq-version": signature.VERSION, "Date": _date()}
                h["Authorization"] = signature.authorization(key_id, secret, "GET", h, consume_path)
                status, raw = await conn.request("GET", consume_path, h)
                if status == 404 and b"MessageNotExist" in raw:
                    handles: list[str] = []
                elif status != 200:
                    t.error(f"consume {status}: {raw[:300]!r}")
                    continue
                else:
                    handles = [m.decode() for m in _HANDLE.findall(raw)]
            else:
                body = dumps({"consumer": cfg["consumer"], "max": CONSUME_BATCH, "wait": 0})
                status, raw = await conn.request("POST", "/mq/receive", bearer, body)
                if status != 200:
                    t.error(f"/mq/receive {status}: {raw[:300]!r}")
                    continue
                handles = [m["receiptHandle"] for m in loads(raw)["result"]["messages"]]
            t1 = perf()
            t.receives += 1
            t.lat_receive.append(t1 - t0)
            if not handles:
                t.empty += 1
                empty_run += 1
                if empty_run >= EMPTY_STOP and t.received:
                    t.drained = 1
                    break
                continue
            empty_run = 0
            t.received += len(handles)
            if mode == "aliyun":
                body = ack_body(handles)
                h = {"Content-Type": CONTENT_TYPE, "x-mq-version": signature.VERSION, "Date": _date()}
                h["Authorization"] = signature.authorization(key_id, secret, "DELETE", h, path)
                status, raw = await conn.request("DELETE", path, h, body)
                ok = status == 204
            else:
                body = dumps({"consumer": cfg["consumer"], "receiptHandles": handles})
                status, raw = await conn.request("POST", "/mq/delete", bearer, body)
                ok = status == 200 and loads(raw)["result"]["outcomes"] == ["deleted"] * len(handles)
            t2 = perf()
            t.deletes += 1
            if not ok:
                t.error(f"ack {status}: {raw[:300]!r}")
                continue
            t.deleted += len(handles)
            t.t_last = time.monotonic()
            t.lat_delete.append(t2 - t1)
            t.lat_cycle.append(t2 - t0)
    finally:
        conn.close()


async def client_run(cfg: dict) -> dict:
    try:
        import msgspec

        loads, dumps = msgspec.json.decode, msgspec.json.encode
    except ImportError:
        loads, dumps = json.loads, lambda o: json.dumps(o, separators=(",", ":")).encode()
    t, start, clock = Tally(), asyncio.Event(), {"deadline": float("inf")}
    tasks = [
        asyncio.ensure_future(client_loop(cfg, t, clock, start, loads, dumps)) for _ in range(cfg["conns"])
    ]
    await asyncio.sleep(0.3)  # every connection open, each loop waiting for `start`
    t0 = time.monotonic()
    clock["deadline"] = t0 + cfg["duration"]
    start.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    t_end = time.monotonic()
    for d in done:
        if isinstance(d, BaseException):
            t.error(f"client loop raised {d!r}")
    window = (t.t_last if t.drained and t.t_last > t0 else t_end) - t0
    return {
        "mode": cfg["mode"],
        "conns": cfg["conns"],
        "seconds": t_end - t0,
        "window_s": window,
        "received": t.received,
        "deleted": t.deleted,
        "receives": t.receives,
        "deletes": t.deletes,
        "empty": t.empty,
        "errors": t.errors,
        "first_err": t.first_err,
        "drained": t.drained,
        "msgs_per_s": t.deleted / window if window > 0 else 0.0,
        **{
            f"{name}_p{q}_ms": percentile(values, q / 100) * 1000.0
            for name, values in (("receive", t.lat_receive), ("delete", t.lat_delete), ("cycle", t.lat_cycle))
            for q in (50, 99)
        },
    }


def client_main(argv: list[str]) -> None:
    cfg = json.loads(argv[0])
    try:
        import uvloop
    except ImportError:
        print(json.dumps(asyncio.run(client_run(cfg))), flush=True)
    else:
        print(json.dumps(uvloop.run(client_run(cfg))), flush=True)


# --- consume + ack: the harness ------------------------------------------------------------------


def consume_spec(ctx: Ctx, kind: str) -> tuple[str, str, dict]:
    """(the consumer whose progress counts, the producer that fills, the client's settings)."""
    cfg: dict = {"mode": kind, "port": ctx.gw.port if ctx.gw else 0, "conns": ctx.args.conns}
    if kind == "aliyun":
        cfg.update(key_id=ctx.key_id, secret=ctx.secret, topic=ALI_TOPIC, group=ALI_CONSUMER)
        return ALI_CONSUMER, ALI_PRODUCER, cfg
    cfg.update(consumer=NATIVE_CONSUMER, token=ctx.tokens[NATIVE_CONSUMER])
    return NATIVE_CONSUMER, NATIVE_PRODUCER, cfg


def top_up(ctx: Ctx, kind: str, duration: float) -> None:
    """A backlog of at least --prefill, and twice what the last run of this kind took in as long."""
    assert ctx.gw is not None
    consumer, producer, _ = consume_spec(ctx, kind)
    want = max(ctx.args.prefill, int(2 * ctx.rates.get(kind, 0.0) * duration))
    lag = totals(ctx.gw.progress(consumer))["lag"]
    if lag < want:
        took = produce_batches(ctx.gw.port, ctx.tokens[producer], producer, want - lag)
        log(f"  filled {want - lag} messages into {consumer}'s topic at {(want - lag) / took:.0f} msgs/s")


def consume_run(ctx: Ctx, kind: str, duration: float, record: bool = True) -> dict:
    gw = ctx.gw
    assert gw is not None
    top_up(ctx, kind, duration)
    consumer, _, cfg = consume_spec(ctx, kind)
    cfg["duration"] = duration
    before = totals(gw.progress(consumer))
    cmd = [str(VENV_PY), "-m", "bench.aliyun", "client", json.dumps(cfg)]
    shown = {k: "…" if k in ("secret", "token") else v for k, v in cfg.items()}
    command = (
        f"PYTHONPATH=benchmarks {VENV_PY} -m bench.aliyun client '{json.dumps(shown, ensure_ascii=False)}'"
    )
    log(f"  $ {command}")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    )
    meter = wrk.CpuMeter(gw.pid)
    res = procs.run_json(cmd, duration + 120, env)
    meter.finish(res, own_key="client_cpu_pct")
    committed_before = before["committed"]
    deadline = time.monotonic() + 5.0  # the last deletes' offsets, committed as they settle
    while True:
        after = totals(gw.progress(consumer))
        if after["committed"] - committed_before >= res["deleted"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    committed = after["committed"] - committed_before
    res.update(
        kind=kind, committed=committed, lag_before=before["lag"], lag_after=after["lag"], command=command
    )
    what = f"consume + ack ({kind})"
    problems = checked_consume_run(what, res, committed, "acked")
    log(
        f"  {kind}: {res['msgs_per_s']:.0f} msgs/s acked ({res['received']} received, {res['deleted']} "
        f"acked, {res['empty']} empty), consume p50 {res['receive_p50_ms']:.2f} ms, "
        f"server CPU {res['server_us_per_msg']:.1f} µs/msg, client {res['client_cpu_pct']:.0f} %"
        + ("" if record else " (warm-up)")
    )
    ctx.rates[kind] = res["msgs_per_s"]
    if record:
        ctx.problems.extend(problems)
        ctx.runs.setdefault(("consume", kind), []).append(res)
    return res


def bench_consume(ctx: Ctx) -> None:
    d = ctx.args.duration
    for kind in ("native", "aliyun"):  # warm-up, and a rate for the top-ups
        consume_run(ctx, kind, min(2.0, d), record=False)
    for kind in ORDER:
        consume_run(ctx, kind, d)


def med(runs: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def report(ctx: Ctx) -> tuple[list[str], list[results.Row], list[str]]:
    a = ctx.args
    gw_cmd = " ".join(ctx.gw.cmd) if ctx.gw else "?"
    lines = [
        f"- gateway: `{gw_cmd}` (no --fsync: the shipped default), embedded store, one process",
        f"- {a.duration:g} s per run; messages of {MSG_BYTES} bytes; runs in the order {', '.join(ORDER)} "
        "(after a warm-up of each); topics of 4 queues",
        f"- consume + ack: {a.conns} loops of `python -m bench.aliyun client` (raw HTTP/1.1 on asyncio), "
        f"a backlog of at least {a.prefill:,} before each run",
    ]
    rows: list[results.Row] = []
    if "publish" in ctx.failures:
        rows.append(
            results.Row("", "Aliyun MQ publish vs native produce", f"FAILED: {ctx.failures['publish']}")
        )
    al, nat = ctx.runs.get("aliyun", []), ctx.runs.get("native", [])
    if al and nat:
        s, n = med(al, "msgs_per_s"), med(nat, "msgs_per_s")

        def lat(rs: list[dict]) -> str:
            return f"{med(rs, 'lat_p50_us') / 1000:.2f} / {med(rs, 'lat_p99_us') / 1000:.2f} ms"

        rows.append(
            results.Row(
                "aliyun.publish",
                f"Aliyun MQ publish (XML, MQ HMAC-SHA1), 1 msg/request, wrk -t2 -c64, median of {len(al)}",
                fmt(s, " msgs/s"),
                f"native POST /mq/produce, same wrk, median of {len(nat)}: {fmt(n, ' msgs/s')}",
                ratio(s, n),
                f"p50 / p99 {lat(al)} (native {lat(nat)}); target ≥ {PUBLISH_TARGET_RATIO} "
                f"{'✅' if s / n >= PUBLISH_TARGET_RATIO else '❌'}",
                f"server CPU {med(al, 'server_us_per_msg'):.0f} µs/msg (native "
                f"{med(nat, 'server_us_per_msg'):.0f}); runs aliyun "
                + ", ".join(fmt(r["msgs_per_s"]) for r in al)
                + ", native "
                + ", ".join(fmt(r["msgs_per_s"]) for r in nat),
            )
        )
        for r in [*al, *nat]:
            rows.append(
                results.Row(
                    "",
                    f"publish run: {r['kind']}",
                    fmt(r["msgs_per_s"], " msgs/s"),
                    notes=f"p50 / p99 {r['lat_p50_us'] / 1000:.2f} / {r['lat_p99_us'] / 1000:.2f} ms; "
                    f"stored {r['stored']:,}",
                    more=cpu_note(r),
                )
            )
    if "consume" in ctx.failures:
        rows.append(results.Row("", "Aliyun MQ consume + ack vs native receive + delete",
                                f"FAILED: {ctx.failures['consume']}"))  # fmt: skip
    ca, cn = ctx.runs.get(("consume", "aliyun"), []), ctx.runs.get(("consume", "native"), [])
    if ca and cn:
        s, n = med(ca, "msgs_per_s"), med(cn, "msgs_per_s")

        def rd(rs: list[dict]) -> str:
            return (
                f"consume p50 / p99 {med(rs, 'receive_p50_ms'):.2f} / {med(rs, 'receive_p99_ms'):.2f} ms, "
                f"ack {med(rs, 'delete_p50_ms'):.2f} / {med(rs, 'delete_p99_ms'):.2f} ms"
            )

        rows.append(
            results.Row(
                "aliyun.consume_ack",
                f"Aliyun MQ consume (numOfMessages {CONSUME_BATCH}, no wait) + ack of its handles (XML, "
                f"MQ HMAC-SHA1 each), {a.conns} asyncio loops, median of {len(ca)}",
                fmt(s, " msgs/s"),
                f"native POST /mq/receive (max {CONSUME_BATCH}) + /mq/delete, mode=message, same client: "
                + fmt(n, " msgs/s"),
                ratio(s, n),
                f"Aliyun {rd(ca)}; native {rd(cn)}",
                f"server CPU {med(ca, 'server_us_per_msg'):.1f} µs/msg (native "
                f"{med(cn, 'server_us_per_msg'):.1f}); runs aliyun "
                + ", ".join(fmt(r["msgs_per_s"]) for r in ca)
                + ", native "
                + ", ".join(fmt(r["msgs_per_s"]) for r in cn),
            )
        )
        for r in [*ca, *cn]:
            rows.append(
                results.Row(
                    "",
                    f"consume + ack run: {r['kind']}",
                    fmt(r["msgs_per_s"], " msgs/s"),
                    notes=f"{r['received']:,} received, {r['deleted']:,} acked, {r['empty']} empty; "
                    f"committed offsets moved {r['committed']:,}",
                    more=cpu_note(r, client=True),
                )
            )
    after = [f"- problem: {p}" for p in ctx.problems]
    return lines, rows, after


def main(a: argparse.Namespace) -> int:
    a.duration = a.duration or (3.0 if a.quick else 10.0)
    a.prefill = a.prefill or (30_000 if a.quick else 150_000)
    wrk.require()
    if not MQGATE.exists():
        raise SystemExit(f"{MQGATE} not found (make install)")
    ctx = Ctx(a, Path(tempfile.mkdtemp(prefix="mqgate-aliyun-bench-")))
    log(f"work dir {ctx.work}")
    gateway.wait_idle(ctx)  # type: ignore[arg-type]  # reads args.wait_idle / idle_below, sets busy_before
    try:
        try:
            setup(ctx)
            log("publish ...")
            bench_publish(ctx)
        except BenchFailure as exc:
            ctx.failures["publish"] = str(exc)
            log(f"  FAILED: {exc}")
        if ctx.gw is not None and ctx.key_id:
            try:
                log("consume + ack ...")
                bench_consume(ctx)
            except BenchFailure as exc:
                ctx.failures["consume"] = str(exc)
                log(f"  FAILED: {exc}")
        gw = ctx.gw
        if gw is not None:
            if gw.proc is not None and gw.proc.poll() is not None:
                ctx.problems.append(f"gateway exited during the run with {gw.proc.returncode}")
            gw.stop()
            if errs := gw.errors_in_log():
                ctx.problems.append(f"gateway log has {len(errs)} error lines, first: {errs[0][:300]}")
    finally:
        procs.cleanup()
        lines, rows, after = report(ctx)
        kind = f"{'quick' if a.quick else 'full'} run" + (" (FAILURES)" if ctx.failures else "")
        results.record(a, f"the Aliyun MQ HTTP API vs the native API: {kind}", rows, lines, after,
                       results.machine(ctx.work))  # fmt: skip
        if a.keep:
            log(f"kept {ctx.work}")
        else:
            shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if ctx.failures else 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "aliyun", __doc__, help="Aliyun MQ HTTP publish, consume + ack vs native"
    )
    p.add_argument("--quick", action="store_true", help="short runs (3 s)")
    p.add_argument("--duration", type=float, help="seconds per run (default 10, quick 3)")
    p.add_argument("--conns", type=int, default=16, help="consume + ack client loops (default 16)")
    p.add_argument(
        "--prefill", type=int, help="backlog before each consume run (default 150,000; quick 30,000)"
    )
    p.add_argument(
        "--wait-idle", type=float, default=0.0, help="wait up to this many seconds for an idle machine"
    )
    p.add_argument(
        "--idle-below", type=float, default=15.0, help="percent CPU busy counted as idle (default 15)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (gateway log)")
    p.set_defaults(func=main)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m bench.aliyun client '<json>' (run.py aliyun runs the benchmark)")
