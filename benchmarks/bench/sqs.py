"""The SQS API against the native API (`run.py sqs`, issue 30): one gateway of its own
(`mqgate serve` as shipped: embedded store, the gateway's own fsync default, a fresh data
directory), one access key of the `default` project, one SQS queue made by CreateQueue, and:

  send            SQS SendMessage (AWS JSON 1.0: `X-Amz-Target: AmazonSQS.SendMessage`,
                  `Content-Type: application/x-amz-json-1.0`, body {"QueueUrl", "MessageBody"},
                  SigV4-signed, one 100-byte message) against the native `POST /mq/produce`
                  of one 100-byte message, both `wrk -t2 -c64`, the same duration, alternating
                  (native, sqs, sqs, native, native, sqs): the medians, their ratio (target
                  >= 0.8), p50 / p99. The SQS request is signed in Python just before each run
                  (a fixed date and body: the gateway accepts a signature for 15 minutes either
                  way) and replayed by wrk (lua/sqs_send.lua); SQS standard queues do not
                  deduplicate, so identical bodies are fine. Each run's stored messages are
                  checked against its 2xx answers.
  receive_delete  SQS ReceiveMessage (MaxNumberOfMessages 10, WaitTimeSeconds 0) then
                  DeleteMessageBatch of the receipts, against the native `POST /mq/receive`
                  (max 10) then `POST /mq/delete` of a `mode=message` consumer, and the classic
                  pull `GET /mq/message?max=10` acking the previous pull by its requestId. An
                  asyncio client of its own (a process apart, `python -m bench.sqs client`, raw
                  keep-alive HTTP/1.1 on asyncio streams, uvloop and msgspec when installed)
                  runs `--conns` loops; receipts change with every receive, so each SQS request
                  is signed as it is sent. Every queue is pre-filled through the native batch
                  produce (the SQS queue's through its producer `sqs.<account>.<queue>.p`) and
                  topped up before each run; the runs alternate (native, sqs, pull, pull, sqs,
                  native). Figure: deleted (acked) messages per second, checked against the
                  consumer's committed offsets.

The SQS queue's topic has 4 store queues (CreateQueue's); the native topics of `send` and of
`mode=message` have 4 too, the pull topic one per client loop (a pull locks its queue until the
ack). Rows: `sqs.send`, `sqs.receive_delete` (against the native receive + delete) and
`sqs.receive_delete_vs_pull` (against the classic pull + ack).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import hmac
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import gateway, procs, results, wrk
from .common import BENCH_DIR, HOST, MQGATE, MSG_BYTES, VENV_PY, BenchFailure, fmt, log, percentile, ratio
from .servers import Gateway, produce_batches, register, totals

REGION = "us-east-1"
QUEUE = "bench"
JSON_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
SEND_TARGET_RATIO = 0.8
NATIVE_TOPIC, NATIVE_PRODUCER, NATIVE_CONSUMER = "sqsb-native", "sqsb-native-p", "sqsb-native-c"
MSG_TOPIC, MSG_PRODUCER, MSG_CONSUMER = "sqsb-msg", "sqsb-msg-p", "sqsb-msg-c"
PULL_TOPIC, PULL_PRODUCER, PULL_CONSUMER = "sqsb-pull", "sqsb-pull-p", "sqsb-pull-c"
SEND_ORDER = ("native", "sqs", "sqs", "native", "native", "sqs")
CONSUME_ORDER = ("native", "sqs", "pull", "pull", "sqs", "native")
EMPTY_STOP = 20  # a client loop stops after this many empty receives in a row (the queue drained)


# --- SigV4 (AWS Signature Version 4), as an SDK signs a JSON-protocol SQS request -----------------


@dataclass
class Signer:
    key_id: str
    secret: str
    region: str = REGION
    service: str = "sqs"
    _keys: dict[str, bytes] = field(default_factory=dict)

    def _key(self, day: str) -> bytes:
        if day not in self._keys:
            k = hmac.new(f"AWS4{self.secret}".encode(), day.encode(), hashlib.sha256).digest()
            for part in (self.region, self.service, "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys[day] = k
        return self._keys[day]

    def headers(self, host: str, action: str, body: bytes, stamp: str | None = None) -> dict[str, str]:
        """The headers of `POST /` for `action` (Host, Content-Type, X-Amz-Target, X-Amz-Date,
        Authorization), signing content-type, host, x-amz-date and x-amz-target as botocore does."""
        stamp = stamp or dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        target = TARGET_PREFIX + action
        signed = "content-type;host;x-amz-date;x-amz-target"
        canonical = (
            f"POST\n/\n\ncontent-type:{JSON_TYPE}\nhost:{host}\nx-amz-date:{stamp}\nx-amz-target:{target}\n\n"
            f"{signed}\n{hashlib.sha256(body).hexdigest()}"
        )
        scope = f"{stamp[:8]}/{self.region}/{self.service}/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._key(stamp[:8]), to_sign.encode(), hashlib.sha256).hexdigest()
        return {
            "Host": host,
            "Content-Type": JSON_TYPE,
            "X-Amz-Target": target,
            "X-Amz-Date": stamp,
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential={self.key_id}/{scope}, SignedHeaders={signed}, "
                f"Signature={signature}"
            ),
        }


def botocore_agrees(signer: Signer, host: str, action: str, body: bytes) -> str:
    """Sign the same request with botocore's SigV4Auth (at the date it chooses) and compare;
    a sentence saying how it went."""
    try:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
    except ImportError:
        return "botocore not installed: the signer was checked by the gateway only"
    req = AWSRequest(
        method="POST",
        url=f"http://{host}/",
        data=body,
        headers={"Content-Type": JSON_TYPE, "X-Amz-Target": TARGET_PREFIX + action},
    )
    SigV4Auth(Credentials(signer.key_id, signer.secret), "sqs", signer.region).add_auth(req)
    mine = signer.headers(host, action, body, req.headers["X-Amz-Date"])
    if req.headers["Authorization"] != mine["Authorization"]:
        raise BenchFailure(f"our SigV4 differs from botocore's: {mine['Authorization']!r} vs "
                           f"{req.headers['Authorization']!r}")  # fmt: skip
    return "the signer gives botocore's SigV4Auth signature (checked on a SendMessage)"


# --- the receive/delete client (a process of its own) -----------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer, f"{HOST}:{port}")

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if "Host" not in headers:
            head += f"Host: {self.host}\r\n"
        head += f"Content-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode("latin-1") + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, chunked = 0, False
        for ln in lines[1:]:
            name, _, value = ln.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
        if not chunked:
            return status, await self.reader.readexactly(length)
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")  # no trailers are sent
                return status, b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


@dataclass
class Tally:
    received: int = 0
    deleted: int = 0
    receives: int = 0
    deletes: int = 0
    empty: int = 0
    errors: int = 0
    first_err: str = ""
    drained: int = 0
    t_last: float = 0.0
    lat_receive: list[float] = field(default_factory=list)
    lat_delete: list[float] = field(default_factory=list)
    lat_cycle: list[float] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        self.first_err = self.first_err or what[:400]


async def client_loop(cfg: dict, t: Tally, clock: dict, start: asyncio.Event, loads: Any, dumps: Any) -> None:
    mode, port = cfg["mode"], cfg["port"]
    conn = await Conn.open(port)
    signer = Signer(cfg["key_id"], cfg["secret"]) if mode == "sqs" else None
    bearer = {"Authorization": f"Bearer {cfg.get('token', '')}", "Content-Type": "application/json"}
    empty_run, prev_rid, prev_n = 0, None, 0
    perf = time.perf_counter
    await start.wait()
    try:
        while time.monotonic() < clock["deadline"] and t.errors < 100:
            t0 = perf()
            if mode == "sqs":
                assert signer is not None
                body = dumps({"QueueUrl": cfg["queue_url"], "MaxNumberOfMessages": 10, "WaitTimeSeconds": 0})
                status, raw = await conn.request(
                    "POST", "/", signer.headers(conn.host, "ReceiveMessage", body), body
                )
                if status != 200:
                    t.error(f"ReceiveMessage {status}: {raw[:300]!r}")
                    continue
                handles = [m["ReceiptHandle"] for m in loads(raw).get("Messages", ())]
            elif mode == "native":
                body = dumps({"consumer": cfg["consumer"], "max": 10, "wait": 0})
                status, raw = await conn.request("POST", "/mq/receive", bearer, body)
                if status != 200:
                    t.error(f"/mq/receive {status}: {raw[:300]!r}")
                    continue
                handles = [m["receiptHandle"] for m in loads(raw)["result"]["messages"]]
            else:  # the classic pull: this pull acks the previous one by its requestId
                q = (
                    f"{cfg['pull_query']}&requestId={urllib.parse.quote(prev_rid)}"
                    if prev_rid
                    else cfg["pull_query"]
                )
                status, raw = await conn.request("GET", q, bearer)
                if status != 200:
                    t.error(f"/mq/message {status}: {raw[:300]!r}")
                    continue
                r = loads(raw)["result"]
                if prev_rid:
                    if r.get("ack") == "ok":
                        t.deleted += prev_n
                        t.deletes += 1
                    else:
                        t.error(f"ack of a pull: {r.get('ack')!r}")
                    prev_rid, prev_n = None, 0
                handles = r["msgList"] if r["status"] == "FOUND" else []
                if handles:
                    prev_rid, prev_n = r["requestId"], len(handles)
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
            if mode == "pull":
                t.t_last = time.monotonic()
                continue
            if mode == "sqs":
                assert signer is not None
                entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
                body = dumps({"QueueUrl": cfg["queue_url"], "Entries": entries})
                status, raw = await conn.request(
                    "POST", "/", signer.headers(conn.host, "DeleteMessageBatch", body), body
                )
                ok = status == 200 and len(loads(raw).get("Successful", ())) == len(handles)
            else:
                body = dumps({"consumer": cfg["consumer"], "receiptHandles": handles})
                status, raw = await conn.request("POST", "/mq/delete", bearer, body)
                ok = status == 200 and loads(raw)["result"]["outcomes"] == ["deleted"] * len(handles)
            t2 = perf()
            t.deletes += 1
            if not ok:
                t.error(f"delete {status}: {raw[:300]!r}")
                continue
            t.deleted += len(handles)
            t.t_last = time.monotonic()
            t.lat_delete.append(t2 - t1)
            t.lat_cycle.append(t2 - t0)
        if prev_rid:  # the last pull's ack
            status, raw = await conn.request("POST", "/mq/ack", bearer, dumps({"requestId": prev_rid}))
            if status == 200:
                t.deleted += prev_n
                t.t_last = time.monotonic()
            else:
                t.error(f"/mq/ack {status}: {raw[:300]!r}")
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
    ms = 1000.0
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
            f"{name}_p{q}_ms": percentile(values, q / 100) * ms
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


# --- the harness ------------------------------------------------------------------------------------

ALL = ["send", "receive_delete"]


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    gw: Gateway | None = None
    signer: Signer | None = None
    host: str = ""
    queue_url: str = ""
    account: str = ""
    tokens: dict = field(default_factory=dict)  # producer / consumer tokens by name
    runs: dict = field(default_factory=dict)  # ("send" | "consume", mode) -> [result, ...]
    rates: dict = field(default_factory=dict)  # consume mode -> msgs/s of its last run
    failures: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    botocore: str = ""
    busy_before: float = 0.0  # percent of the machine busy before the run (gateway.wait_idle)

    @property
    def sqs_topic(self) -> str:
        return f"sqs.{self.account}.{QUEUE}"


def sqs_call(ctx: Ctx, action: str, params: dict) -> tuple[int, Any]:
    """One signed SQS request (JSON protocol) by hand: (status, decoded answer)."""
    assert ctx.gw is not None and ctx.signer is not None
    body = json.dumps(params, separators=(",", ":")).encode()
    c = http.client.HTTPConnection(HOST, ctx.gw.port, timeout=30)
    try:
        c.request("POST", "/", body=body, headers=ctx.signer.headers(ctx.host, action, body))
        r = c.getresponse()
        raw = r.read()
    finally:
        c.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw


def sqs_ok(ctx: Ctx, action: str, params: dict) -> Any:
    status, answer = sqs_call(ctx, action, params)
    if status != 200:
        raise BenchFailure(f"SQS {action} -> HTTP {status}: {str(answer)[:400]}")
    return answer


def setup(ctx: Ctx) -> None:
    a = ctx.args
    gw = ctx.gw = Gateway(ctx.work / "data", fsync=None, log_path=ctx.work / "gateway.log")
    log(f"gateway up on port {gw.port} in {gw.start():.2f} s: {' '.join(gw.cmd)}")
    key = gw.post("/admin/access-keys", {"name": "sqs-bench", "project": "default"})
    ctx.signer, ctx.account = Signer(key["accessKeyId"], key["secretAccessKey"]), key["account"]
    ctx.host = f"{HOST}:{gw.port}"
    probe = json.dumps({"QueueUrl": "x", "MessageBody": "y"}).encode()
    ctx.botocore = botocore_agrees(ctx.signer, ctx.host, "SendMessage", probe)
    ctx.queue_url = sqs_ok(ctx, "CreateQueue", {"QueueName": QUEUE})["QueueUrl"]
    producer = ctx.sqs_topic + ".p"
    ctx.tokens[producer] = gw.post(f"/admin/producers/{producer}/token", {})["token"]
    log(f"  access key {key['accessKeyId']} (account {ctx.account}), queue {ctx.queue_url}; {ctx.botocore}")
    for topic, queues, producer, consumer, extra in (
        (NATIVE_TOPIC, 4, NATIVE_PRODUCER, NATIVE_CONSUMER, {}),
        (MSG_TOPIC, 4, MSG_PRODUCER, MSG_CONSUMER, {"mode": "message", "lockTimeoutS": 30}),
        (PULL_TOPIC, a.conns, PULL_PRODUCER, PULL_CONSUMER, {}),
    ):
        ctx.tokens[producer], ctx.tokens[consumer] = register(gw, topic, queues, producer, consumer, **extra)


def settle(gw: Gateway, consumer: str, before_max: int, expect_at_least: int, wait: float = 5.0) -> int:
    """Messages stored since `before_max`, once the count stops growing (answers in flight)."""
    t_end, prev = time.monotonic() + wait, None
    while True:
        cur = totals(gw.progress(consumer))["max"]
        if (cur == prev and cur - before_max >= expect_at_least) or time.monotonic() > t_end:
            return int(cur - before_max)
        prev = cur
        time.sleep(0.25)


def send_run(ctx: Ctx, kind: str, duration: float, record: bool = True) -> dict:
    """One wrk run: `sqs` SendMessage, or `native` POST /mq/produce; 1 message per request."""
    gw, conns = ctx.gw, 64
    assert gw is not None and ctx.signer is not None
    if kind == "sqs":
        body = json.dumps({"QueueUrl": ctx.queue_url, "MessageBody": "x" * MSG_BYTES}, separators=(",", ":"))
        h = ctx.signer.headers(ctx.host, "SendMessage", body.encode())  # signed afresh for each run
        # the very request wrk replays, once by hand: the gateway accepts it, its MD5 is AWS's
        c = http.client.HTTPConnection(HOST, gw.port, timeout=30)
        c.request("POST", "/", body=body.encode(), headers=h)
        r = c.getresponse()
        answer, status = r.read(), r.status
        c.close()
        want_md5 = hashlib.md5(("x" * MSG_BYTES).encode()).hexdigest()
        if status != 200 or json.loads(answer).get("MD5OfMessageBody") != want_md5:
            raise BenchFailure(f"SendMessage as wrk sends it -> HTTP {status}: {answer[:300]!r}")
        env = {
            "MQB_BODY": body,
            "MQB_AMZ_DATE": h["X-Amz-Date"],
            "MQB_AUTHORIZATION": h["Authorization"],
            "MQB_HOST": ctx.host,
        }
        script, url, consumer = "sqs_send.lua", f"{gw.url}/", ctx.sqs_topic + ".c"
    else:
        env = {
            "MQB_TOKEN": ctx.tokens[NATIVE_PRODUCER],
            "MQB_PRODUCER": NATIVE_PRODUCER,
            "MQB_MSG_BYTES": str(MSG_BYTES),
        }
        script, url, consumer = "produce.lua", f"{gw.url}/mq/produce", NATIVE_CONSUMER
    before = totals(gw.progress(consumer))["max"]
    res = wrk.measured(gw.pid, script, url, conns, duration, env)
    what = f"send ({kind})"
    problems = wrk.check_errors(res, what) + wrk.other_load(what, res)
    stored = settle(gw, consumer, before, res["ok_requests"])
    if stored < res["ok_requests"]:
        raise BenchFailure(f"{what}: {res['ok_requests']} answered 2xx but {stored} messages were stored")
    if stored > res["requests"] + conns + 2:
        problems.append(f"{what}: {stored} stored for {res['requests']} requests")
    res.update(kind=kind, stored=stored, msgs_per_s=res["ok_requests"] / res["seconds"])
    res["server_us_per_msg"] = wrk.server_cpu_per_request(res)
    log(
        f"  send {kind}: {res['msgs_per_s']:.0f} msgs/s, p50 {res['lat_p50_us'] / 1000:.2f} ms, p99 "
        f"{res['lat_p99_us'] / 1000:.2f} ms, server CPU {res['server_us_per_msg']:.0f} µs/msg"
        + ("" if record else " (warm-up)")
    )
    if record:
        ctx.problems.extend(problems)
        ctx.runs.setdefault(("send", kind), []).append(res)
    return res


def bench_send(ctx: Ctx) -> None:
    d = ctx.args.duration
    for kind in ("native", "sqs"):  # warm-up, not counted
        send_run(ctx, kind, min(2.0, d), record=False)
    for kind in SEND_ORDER:
        send_run(ctx, kind, d)


def consume_spec(ctx: Ctx, mode: str) -> tuple[str, str, dict]:
    """(the consumer whose progress counts, the producer that fills, the client's settings)."""
    cfg: dict = {"mode": mode, "port": ctx.gw.port if ctx.gw else 0, "conns": ctx.args.conns}
    if mode == "sqs":
        assert ctx.signer is not None
        cfg.update(key_id=ctx.signer.key_id, secret=ctx.signer.secret, queue_url=ctx.queue_url)
        return ctx.sqs_topic + ".c", ctx.sqs_topic + ".p", cfg
    if mode == "native":
        cfg.update(consumer=MSG_CONSUMER, token=ctx.tokens[MSG_CONSUMER])
        return MSG_CONSUMER, MSG_PRODUCER, cfg
    q = urllib.parse.urlencode({"topic": PULL_TOPIC, "consumer": PULL_CONSUMER, "max": 10})
    cfg.update(pull_query=f"/mq/message?{q}", token=ctx.tokens[PULL_CONSUMER])
    return PULL_CONSUMER, PULL_PRODUCER, cfg


def top_up(ctx: Ctx, mode: str, duration: float) -> None:
    """A backlog of at least --prefill, and 1.5 x what the last run of this mode took in as long."""
    assert ctx.gw is not None
    consumer, producer, _ = consume_spec(ctx, mode)
    want = max(ctx.args.prefill, int(1.5 * ctx.rates.get(mode, 0.0) * duration))
    lag = totals(ctx.gw.progress(consumer))["lag"]
    if lag < want:
        took = produce_batches(ctx.gw.port, ctx.tokens[producer], producer, want - lag)
        log(f"  filled {want - lag} messages into {consumer}'s topic at {(want - lag) / took:.0f} msgs/s")


def consume_run(ctx: Ctx, mode: str, duration: float, record: bool = True) -> dict:
    gw = ctx.gw
    assert gw is not None
    top_up(ctx, mode, duration)
    consumer, _, cfg = consume_spec(ctx, mode)
    cfg["duration"] = duration
    before = totals(gw.progress(consumer))
    cmd = [str(VENV_PY), "-m", "bench.sqs", "client", json.dumps(cfg)]
    shown = {k: "…" if k in ("secret", "token") else v for k, v in cfg.items()}
    command = f"PYTHONPATH=benchmarks {VENV_PY} -m bench.sqs client '{json.dumps(shown, ensure_ascii=False)}'"
    log(f"  $ {command}")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    )
    meter = wrk.CpuMeter(gw.pid)
    res = procs.run_json(cmd, duration + 120, env)
    meter.finish(res, own_key="client_cpu_pct")
    time.sleep(0.3)
    after = totals(gw.progress(consumer))
    committed = after["committed"] - before["committed"]
    res.update(committed=committed, lag_before=before["lag"], lag_after=after["lag"], command=command)
    what = f"receive/delete ({mode})"
    problems = checked_consume_run(what, res, committed, "deleted")
    log(
        f"  {mode}: {res['msgs_per_s']:.0f} msgs/s deleted ({res['received']} received, {res['deleted']} "
        f"deleted, {res['empty']} empty receives), receive p50 {res['receive_p50_ms']:.2f} ms, "
        f"server CPU {res['server_us_per_msg']:.1f} µs/msg, client {res['client_cpu_pct']:.0f} %"
        + ("" if record else " (warm-up)")
    )
    ctx.rates[mode] = res["msgs_per_s"]
    if record:
        ctx.problems.extend(problems)
        ctx.runs.setdefault(("consume", mode), []).append(res)
    return res


def checked_consume_run(what: str, res: dict, committed: int, verb: str) -> list[str]:
    """A consume run's checks (a failure if nothing was `verb` or over 0.1 % of requests
    failed; else its problems: failed requests, the committed offsets not moved by what was
    `verb`, a drained backlog, other load), and its server CPU per message set in `res`."""
    requests = res["receives"] + res["deletes"]
    if res["deleted"] <= 0:
        raise BenchFailure(f"{what}: nothing {verb}; {res['errors']} errors, first: {res['first_err']}")
    if res["errors"] > 0.001 * requests:
        raise BenchFailure(
            f"{what}: {res['errors']} of {requests} requests failed; first: {res['first_err']}"
        )
    problems = (
        [f"{what}: {res['errors']} failed requests; first: {res['first_err']}"] if res["errors"] else []
    )
    if committed != res["deleted"]:
        problems.append(f"{what}: {res['deleted']} {verb} but the committed offsets moved by {committed}")
    if res["drained"]:
        problems.append(
            f"{what}: the backlog drained after {res['window_s']:.1f} s; the rate is over that window"
        )
    problems += wrk.other_load(what, res)
    res["server_us_per_msg"] = res["server_cpu_pct"] / 100 * res["cpu_wall_s"] / res["deleted"] * 1e6
    return problems


def bench_consume(ctx: Ctx) -> None:
    d = ctx.args.duration
    for mode in ("native", "sqs", "pull"):  # warm-up, and a rate for the top-ups
        consume_run(ctx, mode, min(2.0, d), record=False)
    for mode in CONSUME_ORDER:
        consume_run(ctx, mode, d)


# --- the report ------------------------------------------------------------------------------------


def med(runs: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def cpu_note(r: dict, client: bool = False) -> str:
    load = f"client + harness {r['client_cpu_pct']:.0f} %" if client else f"wrk {r['wrk_cpu_pct']:.0f} %"
    return (
        f"CPU (100 % = 1 core): server {r['server_cpu_pct']:.0f} % ({r['server_us_per_msg']:.1f} µs/msg), "
        f"{load}, kernel softirq {r['softirq_cpu_pct']:.0f} %, other {r['other_cpu_pct']:.0f} %"
    )


def report(ctx: Ctx) -> tuple[list[str], list[results.Row], list[str]]:
    a, runs = ctx.args, ctx.runs
    gw_cmd = " ".join(ctx.gw.cmd) if ctx.gw else "?"
    lines = [
        f"- gateway: `{gw_cmd}` (MQGATE_ADMIN_TOKEN set; no --fsync: the shipped default, `always`), "
        "embedded store, one process",
        f"- SQS: access key of project `default`, queue `{QUEUE}` by CreateQueue (topic `{ctx.sqs_topic}`, "
        f"4 store queues); SigV4 by the harness's signer: {ctx.botocore}",
        f"- {a.duration:g} s per run; messages of {MSG_BYTES} bytes; send runs in the order "
        f"{', '.join(SEND_ORDER)} (after a warm-up of each); receive/delete runs in the order "
        f"{', '.join(CONSUME_ORDER)}, {a.conns} client loops, backlog ≥ {a.prefill:,} before each",
    ]
    rows: list[results.Row] = []

    def mark(ok: bool) -> str:
        return "✅" if ok else "❌"

    def lat(rs: list[dict]) -> str:
        return f"{med(rs, 'lat_p50_us') / 1000:.2f} / {med(rs, 'lat_p99_us') / 1000:.2f} ms"

    sq, nat = runs.get(("send", "sqs"), []), runs.get(("send", "native"), [])
    if "send" in ctx.failures:
        rows.append(results.Row("", "SQS SendMessage vs native produce", f"FAILED: {ctx.failures['send']}"))
    if sq and nat:
        s, n = med(sq, "msgs_per_s"), med(nat, "msgs_per_s")
        rows.append(
            results.Row(
                "sqs.send",
                f"SQS SendMessage (JSON 1.0, SigV4), 1 msg/request, wrk -t2 -c64, median of {len(sq)}",
                fmt(s, " msgs/s"),
                f"native POST /mq/produce, same wrk, median of {len(nat)}: {fmt(n, ' msgs/s')}",
                ratio(s, n),
                f"p50 / p99 {lat(sq)} (native {lat(nat)}); target ≥ {SEND_TARGET_RATIO} "
                f"{mark(s / n >= SEND_TARGET_RATIO)}",
                f"server CPU {med(sq, 'server_us_per_msg'):.0f} µs/msg (native "
                f"{med(nat, 'server_us_per_msg'):.0f}); runs sqs "
                + ", ".join(fmt(r["msgs_per_s"]) for r in sq)
                + ", native "
                + ", ".join(fmt(r["msgs_per_s"]) for r in nat),
            )
        )
    order: dict[str, int] = {}
    for kind in SEND_ORDER:
        i = order[kind] = order.get(kind, -1) + 1
        rs = runs.get(("send", kind), [])
        if i < len(rs):
            r = rs[i]
            what = "SendMessage" if kind == "sqs" else "native POST /mq/produce"
            rows.append(
                results.Row(
                    "",
                    f"send run: {what}",
                    fmt(r["msgs_per_s"], " msgs/s"),
                    notes=f"p50 / p99 {r['lat_p50_us'] / 1000:.2f} / {r['lat_p99_us'] / 1000:.2f} ms; "
                    f"stored {r['stored']:,}",
                    more=cpu_note(r),
                )
            )
    cs, cn, cp = (runs.get(("consume", m), []) for m in ("sqs", "native", "pull"))

    def rd(rs: list[dict]) -> str:
        return (
            f"receive p50 / p99 {med(rs, 'receive_p50_ms'):.2f} / {med(rs, 'receive_p99_ms'):.2f} ms, "
            f"delete {med(rs, 'delete_p50_ms'):.2f} / {med(rs, 'delete_p99_ms'):.2f} ms"
        )

    if "receive_delete" in ctx.failures:
        rows.append(results.Row("", "receive + delete", f"FAILED: {ctx.failures['receive_delete']}"))
    what = (
        f"SQS ReceiveMessage (max 10, wait 0) + DeleteMessageBatch, {a.conns} asyncio loops, "
        f"median of {len(cs)}"
    )
    if cs and cn:
        s, n = med(cs, "msgs_per_s"), med(cn, "msgs_per_s")
        rows.append(
            results.Row(
                "sqs.receive_delete",
                what,
                fmt(s, " msgs/s"),
                "native POST /mq/receive (max 10) + /mq/delete, mode=message, same client: "
                + fmt(n, " msgs/s"),
                ratio(s, n),
                f"SQS {rd(cs)}; native {rd(cn)}",
                f"server CPU {med(cs, 'server_us_per_msg'):.1f} µs/msg (native "
                f"{med(cn, 'server_us_per_msg'):.1f})",
            )
        )
    if cs and cp:
        s, p = med(cs, "msgs_per_s"), med(cp, "msgs_per_s")
        rows.append(
            results.Row(
                "sqs.receive_delete_vs_pull",
                what,
                fmt(s, " msgs/s"),
                f"native pull max=10 + ack via the next requestId, same client: {fmt(p, ' msgs/s')}",
                ratio(s, p),
                f"pull p50 / p99 {med(cp, 'receive_p50_ms'):.2f} / {med(cp, 'receive_p99_ms'):.2f} ms "
                f"(one request per 10 messages: the ack rides on the next pull)",
                f"server CPU {med(cp, 'server_us_per_msg'):.1f} µs/msg",
            )
        )
    order = {}
    names = {
        "sqs": "SQS ReceiveMessage + DeleteMessageBatch",
        "native": "native /mq/receive + /mq/delete",
        "pull": "native pull max=10 + ack",
    }
    for mode in CONSUME_ORDER:
        i = order[mode] = order.get(mode, -1) + 1
        rs = runs.get(("consume", mode), [])
        if i < len(rs):
            r = rs[i]
            rows.append(
                results.Row(
                    "",
                    f"receive/delete run: {names[mode]}",
                    fmt(r["msgs_per_s"], " msgs/s"),
                    notes=f"deleted {r['deleted']:,} over {r['window_s']:.1f} s, {r['empty']} empty "
                    "receives; "
                    f"receive p50 / p99 {r['receive_p50_ms']:.2f} / {r['receive_p99_ms']:.2f} ms; "
                    f"lag {r['lag_before']:,} → {r['lag_after']:,}",
                    more=cpu_note(r, client=True),
                )
            )
    after: list[str] = ["Notes:", *[f"- {n}" for n in ctx.notes], ""] if ctx.notes else []
    if ctx.failures or ctx.problems:
        after += [
            "Problems seen:",
            *[f"- FAILED {k}: {v}" for k, v in ctx.failures.items()],
            *[f"- {p}" for p in ctx.problems],
            "",
        ]
    cmds = [rs[0]["command"] for key, rs in sorted(runs.items()) if rs and "command" in rs[0]]
    if cmds:
        after += ["Load commands (ports and paths are per run):", "", *[f"    {c}" for c in cmds]]
    return lines, rows, after


# --- the run -------------------------------------------------------------------------------------


def attempt(ctx: Ctx, name: str, fn: Any) -> None:
    log(f"{name} ...")
    try:
        fn(ctx)
    except BenchFailure as exc:
        ctx.failures[name] = str(exc)
        log(f"  FAILED: {exc}")


def main(a: argparse.Namespace) -> int:
    a.duration = a.duration or (3.0 if a.quick else 10.0)
    a.prefill = a.prefill or (50_000 if a.quick else 200_000)
    only = [x.strip() for x in a.only.split(",") if x.strip()] or ALL
    if unknown := set(only) - set(ALL):
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    wrk.require()
    if not MQGATE.exists():
        raise SystemExit(f"{MQGATE} not found (make install)")
    ctx = Ctx(a, Path(tempfile.mkdtemp(prefix="mqgate-sqs-bench-")))
    log(f"work dir {ctx.work}")
    gateway.wait_idle(ctx)  # type: ignore[arg-type]  # reads args.wait_idle / idle_below, sets busy_before
    try:
        try:
            setup(ctx)
        except BenchFailure as exc:
            ctx.failures.update(dict.fromkeys(only, f"setup: {exc}"))
        else:
            for name, fn in (("send", bench_send), ("receive_delete", bench_consume)):
                if name in only:
                    attempt(ctx, name, fn)
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
        title = f"the SQS API vs the native API: {kind}"
        results.record(a, title, rows, lines, after, results.machine(ctx.work))
        if a.keep:
            log(f"kept {ctx.work}")
        else:
            shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if ctx.failures else 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "sqs", __doc__, help="SQS SendMessage / ReceiveMessage + DeleteMessageBatch vs native"
    )
    p.add_argument("--quick", action="store_true", help="short runs (3 s, smaller backlogs)")
    p.add_argument("--duration", type=float, help="seconds per run (default 10, quick 3)")
    p.add_argument("--only", default="", help=f"comma list out of {','.join(ALL)}")
    p.add_argument("--conns", type=int, default=16, help="receive/delete client loops (default 16)")
    p.add_argument(
        "--prefill", type=int, help="backlog before each receive run (default 200,000; quick 50,000)"
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
        raise SystemExit("usage: python -m bench.sqs client '<json>' (run.py sqs runs the benchmark)")
