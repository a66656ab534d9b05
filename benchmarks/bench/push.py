"""Push delivery and SSE streams against pull + ack (`run.py push`, issue 31): one gateway of its
own (`mqgate serve` as shipped: embedded store, the gateway's own fsync default, a fresh data
directory, `MQGATE_PUSH_ALLOW_PRIVATE_ENDPOINTS=true` so it may push to 127.0.0.1), and:

  pull1     baseline: a topic of `--conns` store queues prefilled with `--messages` (50,000)
            100-byte messages by native batch produce, drained by a cluster consumer with
            `--conns` asyncio loops of `GET /mq/message?max=1`, each pull acking the previous
            one by its requestId (`python -m bench.sqs client`, mode pull): one request per
            message, the like-for-like of push's one POST per message.
  push      a topic of 8 store queues prefilled the same way; then a push consumer is
            registered (`mode=push`, `maxInFlight` `--max-in-flight` (64), every other setting
            as shipped) whose endpoint is a process of its own (`python -m bench.push
            endpoint`: raw asyncio on uvloop, answers 204 at once, counts arrivals and message
            ids by consumer). Figure: messages / seconds from the registration to the last
            delivery; done when the endpoint has every message id and the consumer's lag is 0.
  pull100   baseline: as pull1 with `max=100`.
  stream    a topic of 8 store queues prefilled the same way, drained by one SSE reader
            (`python -m bench.push stream`: raw asyncio) of `GET /mq/stream?max=--stream-max`
            (1,000) that acks each batch (`POST /mq/ack` with its requestId, on a second
            connection) as it arrives; against pull100.
  stream_ws as stream, over a WebSocket of its own topic: each batch acked over the socket
            (`{"ack": requestId}`), counted when its `acked` answer comes back.
  latency   the push consumer again, its backlog empty: `--rate` (500) single produces a second
            for `--duration` s (10; quick 3), each body starting `t=<epoch ms>;` written just
            before its produce is sent; the endpoint takes delivered - produced for each. In the
            same phase, on the same messages, a long-polling cluster consumer (registered with
            start=latest just before: 8 asyncio loops of `GET /mq/message?max=100&wait=1`, each
            acking the previous pull by its requestId) takes received - produced: the baseline.

Each drain runs against the gateway's CPU (its process tree) and reports µs of server CPU per
message. Rows: `push.throughput` (against pull1; the issue's target: push >= 0.5 of pull + ack
with maxInFlight 64), `push.throughput_vs_pull100`, `push.latency`, `stream.throughput`,
`stream.ws.throughput`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import gateway, procs, results, wrk
from .common import (
    BENCH_DIR,
    HOST,
    MQGATE,
    MSG_BYTES,
    VENV_PY,
    BenchFailure,
    fmt,
    free_port,
    log,
    percentile,
    ratio,
)
from .servers import Gateway, Http, produce_batches, register, totals, wait_healthz

TARGET_RATIO = 0.5
PUSH_QUEUES = STREAM_QUEUES = LAT_LOOPS = 8
EMPTY_STOP = 20
ALL = ["pull1", "push", "pull100", "stream", "stream_ws", "latency"]


# --- the endpoint (a process of its own) ---------------------------------------------------------


class Tally:
    """What one consumer's deliveries brought: counts, ids, first and last arrival, latencies."""

    def __init__(self) -> None:
        self.count = 0
        self.ids: set[bytes] = set()
        self.first = 0.0
        self.last = 0.0
        self.lat: list[float] = []  # delivered - produced (the body's t=), ms
        self.lat_stored: list[float] = []  # delivered - mq-timestamp (stored), ms

    def view(self, lists: bool) -> dict:
        out: dict[str, Any] = {
            "count": self.count,
            "distinct": len(self.ids),
            "first": self.first,
            "last": self.last,
            "timed": len(self.lat),
            "connections": CONNECTIONS[0],
        }
        if lists:
            out.update(lat=self.lat, lat_stored=self.lat_stored)
        return out


TALLIES: dict[str, Tally] = {}
CONNECTIONS = [0]  # accepted so far: how much the gateway's client reuses its connections
WANTED = {b"content-length", b"connection", b"mq-consumer", b"webhook-id", b"mq-timestamp"}
NO_CONTENT = b"HTTP/1.1 204 No Content\r\n"


def record_delivery(fields: dict[bytes, bytes], body: bytes) -> None:
    now = time.time()
    name = fields.get(b"mq-consumer", b"?").decode()
    t = TALLIES.get(name)
    if t is None:
        t = TALLIES[name] = Tally()
    t.count += 1
    t.ids.add(fields.get(b"webhook-id", b""))
    t.first = t.first or now
    t.last = now
    if body.startswith(b"t="):
        ms = now * 1000
        with contextlib.suppress(ValueError):
            t.lat.append(ms - float(body[2 : body.index(b";")]))
            t.lat_stored.append(ms - int(fields.get(b"mq-timestamp", b"0")))


class Hook(asyncio.Protocol):
    """HTTP/1.1, just enough: POST → 204 at once (and recorded), GET /stats?consumer=&lists=
    → the tally as JSON, GET anything else → 200 {} (the harness's /healthz)."""

    def connection_made(self, transport: Any) -> None:
        self.transport, self.buf = transport, b""
        CONNECTIONS[0] += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].split(b"\r\n")
            fields = {}
            for ln in lines[1:]:
                name, _, value = ln.partition(b":")
                name = name.strip().lower()
                if name in WANTED:
                    fields[name] = value.strip()
            length = int(fields.get(b"content-length", b"0"))
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            close = fields.get(b"connection", b"").lower() == b"close"
            method, _, rest = lines[0].partition(b" ")
            if method == b"POST":
                record_delivery(fields, body)
                answer = NO_CONTENT + (
                    b"Connection: close\r\n\r\n" if close else b"Content-Length: 0\r\n\r\n"
                )
            else:
                target = rest.split(b" ", 1)[0].decode()
                url = urllib.parse.urlsplit(target)
                q = dict(urllib.parse.parse_qsl(url.query))
                payload: Any = {}
                if url.path == "/stats":
                    t = TALLIES.get(q.get("consumer", ""), Tally())
                    payload = t.view(q.get("lists") == "1")
                raw = json.dumps(payload).encode()
                answer = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b\r\n%b"
                    % (
                        len(raw),
                        b"Connection: close\r\n" if close else b"",
                        raw,
                    )
                )
            self.transport.write(answer)
            if close:
                self.transport.close()
                return


async def endpoint_serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Hook, HOST, port, backlog=1024)
    async with server:
        await server.serve_forever()


# --- the SSE reader and the long-poll latency client (processes of their own) ---------------------


def stream_figures(res: dict, window: float, expect: int) -> dict:
    """A stream drain's figures from what it counted over `window` seconds (its batch sizes and
    ack times taken out of `res`)."""
    sizes, ack_ms = res.pop("sizes"), res.pop("ack_ms")
    res.update(
        window_s=window,
        msgs_per_s=res["acked"] / window if window > 0 else 0.0,
        drained=int(res["acked"] >= expect),
        batch_p50=percentile(sizes, 0.5),
        batch_min=min(sizes, default=0),
        batch_max=max(sizes, default=0),
        ack_p50_ms=percentile(ack_ms, 0.5),
        ack_p99_ms=percentile(ack_ms, 0.99),
    )
    return res


async def stream_run(cfg: dict) -> dict:
    """One `GET /mq/stream`; each `messages` event acked on a second connection as it arrives,
    until `expect` messages are acked (or `timeout`)."""
    from .sqs import Conn

    port, loads, dumps = cfg["port"], json.loads, json.dumps
    bearer = {"Authorization": f"Bearer {cfg['token']}", "Content-Type": "application/json"}
    ack_conn = await Conn.open(port)
    reader, writer = await asyncio.open_connection(HOST, port, limit=16 * 1024 * 1024)
    q = urllib.parse.urlencode({"topic": cfg["topic"], "consumer": cfg["consumer"], "max": cfg["max"]})
    res: dict[str, Any] = {"events": 0, "acked": 0, "errors": 0, "first_err": "", "sizes": [], "ack_ms": []}
    acks: asyncio.Queue = asyncio.Queue()
    done = asyncio.Event()
    t0 = time.monotonic()
    t_last = [t0]
    writer.write(
        f"GET /mq/stream?{q} HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer {cfg['token']}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )

    def error(what: str) -> None:
        res["errors"] += 1
        res["first_err"] = res["first_err"] or what[:400]

    async def acker() -> None:
        while True:
            rid, n = await acks.get()
            a0 = time.perf_counter()
            body = dumps({"consumer": cfg["consumer"], "requestId": rid}).encode()
            status, raw = await ack_conn.request("POST", "/mq/ack", bearer, body)
            res["ack_ms"].append((time.perf_counter() - a0) * 1000)
            if status != 200:
                error(f"/mq/ack {status}: {raw[:300]!r}")
                continue
            res["acked"] += n
            t_last[0] = time.monotonic()
            if res["acked"] >= cfg["expect"]:
                done.set()

    async def chunks() -> Any:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            raise BenchFailure(f"/mq/stream answered {status}: {head[:300]!r} {await reader.read(300)!r}")
        res["first_byte_s"] = time.monotonic() - t0
        if b"chunked" not in head.lower():
            while data := await reader.read(65536):
                yield data
            return
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)

    async def read() -> None:
        buf = b""
        async for data in chunks():
            buf += data
            while (end := buf.find(b"\n\n")) >= 0:
                block, buf = buf[:end], buf[end + 2 :]
                name, payload = "message", b""
                for ln in block.split(b"\n"):
                    if ln.startswith(b"event: "):
                        name = ln[7:].decode()
                    elif ln.startswith(b"data: "):
                        payload = ln[6:]
                if not payload:
                    continue  # a comment: the head, a heartbeat, "waiting for acks"
                if name != "messages":
                    error(f"event {name}: {payload[:200]!r}")
                    continue
                r = loads(payload)["result"]
                res["events"] += 1
                res["sizes"].append(len(r["msgList"]))
                acks.put_nowait((r["requestId"], len(r["msgList"])))

    tasks = [asyncio.ensure_future(acker()), asyncio.ensure_future(read())]
    try:
        waiter = asyncio.ensure_future(done.wait())
        finished, _ = await asyncio.wait(
            [waiter, tasks[1]], timeout=cfg["timeout"], return_when="FIRST_COMPLETED"
        )
        if tasks[1] in finished and tasks[1].exception():
            raise tasks[1].exception()  # type: ignore[misc]
        waiter.cancel()
    finally:
        for t in tasks:
            t.cancel()
        writer.close()
        ack_conn.close()
    return stream_figures(res, t_last[0] - t0, cfg["expect"])


async def stream_ws_run(cfg: dict) -> dict:
    """One WebSocket `GET /mq/stream`; each `messages` event acked over the socket as it
    arrives, counted when its `acked` answer comes back, until `expect` messages (or `timeout`)."""
    from websockets.asyncio.client import connect

    loads, dumps = json.loads, json.dumps
    q = urllib.parse.urlencode({"topic": cfg["topic"], "consumer": cfg["consumer"], "max": cfg["max"]})
    url = f"ws://{HOST}:{cfg['port']}/mq/stream?{q}"
    res: dict[str, Any] = {"events": 0, "acked": 0, "errors": 0, "first_err": "", "sizes": [], "ack_ms": []}
    out: dict[str, tuple[int, float]] = {}  # requestId → (messages, when its ack was sent)
    t0 = time.monotonic()
    t_last = t0

    def error(what: str) -> None:
        res["errors"] += 1
        res["first_err"] = res["first_err"] or what[:400]

    async def drain() -> None:
        nonlocal t_last
        headers = {"Authorization": f"Bearer {cfg['token']}"}
        async with connect(url, additional_headers=headers, max_size=64 * 1024 * 1024) as ws:
            async for text in ws:
                ev = loads(text)
                kind = ev["event"]
                if kind == "messages":
                    n = len(ev["data"]["result"]["msgList"])
                    res["events"] += 1
                    res["sizes"].append(n)
                    out[ev["id"]] = (n, time.perf_counter())
                    await ws.send(dumps({"ack": ev["id"]}))
                elif kind == "acked":
                    n, sent = out.pop(ev["id"], (0, time.perf_counter()))
                    res["ack_ms"].append((time.perf_counter() - sent) * 1000)
                    if ev["outcome"] != "ok":
                        error(f"ack {ev['outcome']}")
                        continue
                    res["acked"] += n
                    t_last = time.monotonic()
                    if res["acked"] >= cfg["expect"]:
                        return
                elif kind == "error":
                    error(f"error event: {text[:300]}")

    try:
        await asyncio.wait_for(drain(), cfg["timeout"])
    except TimeoutError:
        error("timed out")
    return stream_figures(res, t_last - t0, cfg["expect"])


async def latency_run(cfg: dict) -> dict:
    """`loops` long polls (max=100, wait=1), each acking the previous by its requestId, until
    `expect` timed messages came or the wall-clock `until`; received - produced (the body's t=)."""
    from .sqs import Conn

    port, lat, n, errs = cfg["port"], [], [0], []
    bearer = {"Authorization": f"Bearer {cfg['token']}"}
    base = "/mq/message?" + urllib.parse.urlencode(
        {"topic": cfg["topic"], "consumer": cfg["consumer"], "max": 100, "wait": 1}
    )

    async def loop() -> None:
        conn, rid = await Conn.open(port), None
        try:
            while time.time() < cfg["until"] and n[0] < cfg["expect"] and len(errs) < 10:
                path = base + (f"&requestId={urllib.parse.quote(rid)}" if rid else "")
                status, raw = await conn.request("GET", path, bearer)
                now = time.time() * 1000
                if status != 200:
                    errs.append(f"{status}: {raw[:300]!r}")
                    continue
                r = json.loads(raw)["result"]
                rid = r.get("requestId") if r["status"] == "FOUND" else None
                for m in r.get("msgList", ()):
                    body = m.get("message", "")
                    if body.startswith("t="):
                        lat.append(now - float(body[2 : body.index(";")]))
                        n[0] += 1
            if rid:
                await conn.request("POST", "/mq/ack", bearer, json.dumps({"requestId": rid}).encode())
        finally:
            conn.close()

    await asyncio.gather(*(loop() for _ in range(cfg["loops"])))
    return {
        "received": n[0],
        "errors": len(errs),
        "first_err": errs[0] if errs else "",
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": max(lat, default=float("nan")),
    }


def run_async(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def process_main(argv: list[str]) -> None:
    what = argv[0]
    if what == "endpoint":
        run_async(endpoint_serve(int(argv[1])))
        return
    cfg = json.loads(argv[1])
    runs = {"stream": stream_run, "stream_ws": stream_ws_run, "latency": latency_run}
    out = run_async(runs[what](cfg))
    print(json.dumps(out), flush=True)


# --- the harness --------------------------------------------------------------------------------


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    gw: Gateway | None = None
    endpoint: Any = None  # the endpoint's Popen
    ep_port: int = 0
    ep_http: Any = None
    runs: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    commands: list = field(default_factory=list)
    busy_before: float = 0.0


def env_with_bench() -> dict:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    )


def shown(cfg: dict) -> str:
    return json.dumps({k: "…" if k == "token" else v for k, v in cfg.items()}, ensure_ascii=False)


def prefill(ctx: Ctx, topic: str, queues: int, consumer: str | None, n: int = 0) -> tuple[str, str]:
    """A topic with `n` (`--messages`) messages and its consumer, if named: (producer, consumer)
    tokens."""
    gw, n = ctx.gw, n or ctx.args.messages
    assert gw is not None
    ptoken, ctoken = register(gw, topic, queues, topic + "-p", consumer)
    took = produce_batches(gw.port, ptoken, topic + "-p", n)
    log(f"  prefilled {n:,} messages into {topic} ({queues} queues) at {n / took:,.0f} msgs/s")
    return ptoken, ctoken


class Meter:
    """The gateway's and the endpoint's CPU over a phase (100 % = one core)."""

    def __init__(self, ctx: Ctx) -> None:
        assert ctx.gw is not None
        self.ctx, self.inner = ctx, wrk.CpuMeter(ctx.gw.pid)
        self.ep0 = procs.tree_cpu_seconds(ctx.endpoint.pid) if ctx.endpoint else 0.0

    def finish(self, res: dict, messages: int) -> dict:
        self.inner.finish(res, own_key="client_cpu_pct")
        ep = (procs.tree_cpu_seconds(self.ctx.endpoint.pid) - self.ep0) if self.ctx.endpoint else 0.0
        res["endpoint_cpu_pct"] = 100.0 * ep / res["cpu_wall_s"]
        res["other_cpu_pct"] = max(0.0, res["other_cpu_pct"] - res["endpoint_cpu_pct"])
        res["server_us_per_msg"] = res["server_cpu_pct"] / 100 * res["cpu_wall_s"] / max(1, messages) * 1e6
        self.ctx.problems += wrk.other_load(res.get("what", "a phase"), res)
        return res


def pull_drain(ctx: Ctx, max_n: int) -> None:
    gw, a = ctx.gw, ctx.args
    assert gw is not None
    topic = f"pull{max_n}"
    _, ctoken = prefill(ctx, topic, a.conns, topic + "-c", a.messages * (10 if max_n > 1 else 1))
    q = urllib.parse.urlencode({"topic": topic, "consumer": topic + "-c", "max": max_n})
    cfg = {"mode": "pull", "port": gw.port, "conns": a.conns, "pull_query": f"/mq/message?{q}"}
    cfg.update(token=ctoken, duration=a.timeout)
    command = f"PYTHONPATH=benchmarks {VENV_PY} -m bench.sqs client '{shown(cfg)}'"
    log(f"  $ {command}")
    before = totals(gw.progress(topic + "-c"))
    meter = Meter(ctx)
    res = procs.run_json(
        [str(VENV_PY), "-m", "bench.sqs", "client", json.dumps(cfg)], a.timeout + 60, env_with_bench()
    )
    res["what"] = f"pull max={max_n}"
    meter.finish(res, res["deleted"])
    after = totals(gw.progress(topic + "-c"))
    committed = after["committed"] - before["committed"]
    if res["deleted"] <= 0:
        raise BenchFailure(f"pull max={max_n}: nothing acked; first error {res['first_err']}")
    if res["errors"]:
        ctx.problems.append(f"pull max={max_n}: {res['errors']} errors, first: {res['first_err']}")
    if committed != res["deleted"] or after["lag"] != 0 or not res["drained"]:
        ctx.problems.append(
            f"pull max={max_n}: {res['deleted']:,} acked, committed offsets moved by {committed:,}, "
            f"lag after {after['lag']:,}, drained {bool(res['drained'])}"
        )
    res.update(command=command, committed=committed, lag_after=after["lag"])
    ctx.commands.append(command)
    ctx.runs[f"pull{max_n}"] = res
    log(
        f"  pull max={max_n}: {res['msgs_per_s']:,.0f} msgs/s acked ({res['deleted']:,} in "
        f"{res['window_s']:.2f} s, {res['empty']} empty pulls), server CPU "
        f"{res['server_us_per_msg']:.1f} µs/msg ({res['server_cpu_pct']:.0f} %), "
        f"client {res['client_cpu_pct']:.0f} %"
    )


def ep_stats(ctx: Ctx, consumer: str, lists: bool = False) -> dict:
    """The endpoint's tally for `consumer`, over one kept connection (so the endpoint's count of
    connections is the gateway's)."""
    ctx.ep_http = ctx.ep_http or Http(ctx.ep_port, timeout=30)
    status, payload, raw = ctx.ep_http.request("GET", f"/stats?consumer={consumer}&lists={int(lists)}")
    if status != 200 or not isinstance(payload, dict):
        raise BenchFailure(f"the endpoint's /stats answered {status}: {raw[:200]!r}")
    return payload


def push_throughput(ctx: Ctx) -> None:
    gw, a = ctx.gw, ctx.args
    assert gw is not None
    n = a.messages
    prefill(ctx, "pushb", PUSH_QUEUES, None)
    spec = {
        "name": "pushb-c",
        "topic": "pushb",
        "mode": "push",
        "endpoint": f"http://{HOST}:{ctx.ep_port}/hook",
        "maxInFlight": a.max_in_flight,
    }
    conns0 = ep_stats(ctx, "pushb-c")["connections"]
    meter = Meter(ctx)
    t_reg = time.time()
    gw.post("/admin/consumers", spec)
    log(f"  registered push consumer pushb-c (maxInFlight {a.max_in_flight}) → {spec['endpoint']}")
    deadline, lag_zero_at, st = time.monotonic() + a.timeout, None, {}
    while time.monotonic() < deadline:
        st = ep_stats(ctx, "pushb-c")
        if st["distinct"] >= n:
            lag = totals(gw.progress("pushb-c"))["lag"]
            if lag == 0:
                lag_zero_at = time.time()
                break
        time.sleep(0.1)
    res: dict[str, Any] = {"what": "push"}
    meter.finish(res, st.get("count", 0))
    if st.get("distinct", 0) < n:
        raise BenchFailure(
            f"push: the endpoint had {st.get('distinct', 0):,} of {n:,} messages after {a.timeout:g} s"
        )
    if lag_zero_at is None:
        ctx.problems.append("push: every message arrived but the consumer's lag did not reach 0")
    push_info = gw.api("GET", "/admin/consumers/pushb-c/push")
    outcomes: dict[str, int] = {}
    for att in push_info.get("attempts", []) if isinstance(push_info, dict) else []:
        outcomes[att.get("outcome", "?")] = outcomes.get(att.get("outcome", "?"), 0) + 1
    window = st["last"] - t_reg
    res.update(
        delivered=st["count"],
        distinct=st["distinct"],
        window_s=window,
        msgs_per_s=n / window,
        first_after_s=st["first"] - t_reg,
        first_to_last_per_s=n / max(1e-9, st["last"] - st["first"]),
        lag_zero_after_s=(lag_zero_at - t_reg) if lag_zero_at else None,
        outcomes=outcomes,
        connections=st["connections"] - conns0,
        state=push_info.get("state") if isinstance(push_info, dict) else None,
    )
    if st["count"] != st["distinct"]:
        ctx.problems.append(f"push: {st['count'] - st['distinct']} deliveries were repeats (at least once)")
    ctx.runs["push"] = res
    log(
        f"  push: {res['msgs_per_s']:,.0f} msgs/s ({n:,} in {window:.2f} s from registration; first delivery "
        f"after {res['first_after_s']:.2f} s; {res['first_to_last_per_s']:,.0f} msgs/s first→last), "
        f"server CPU {res['server_us_per_msg']:.1f} µs/msg ({res['server_cpu_pct']:.0f} %), endpoint "
        f"{res['endpoint_cpu_pct']:.0f} %; latest attempts {outcomes}"
    )


def steady_produce(port: int, token: str, producer: str, rate: float, duration: float) -> dict:
    """`rate` single produces a second for `duration` s, each body `t=<epoch ms>;` padded to
    MSG_BYTES, from 8 threads (a message's turn is its index / rate; a late thread takes the
    next turn at once)."""
    total, lock, nxt, lat, errors = int(rate * duration), threading.Lock(), [0], [], []
    t0 = time.monotonic() + 0.2

    def worker() -> None:
        h = Http(port, token, timeout=30)
        try:
            while not errors:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= total:
                    return
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                body = f"t={time.time() * 1000:.3f};".ljust(MSG_BYTES, "y")
                s = time.perf_counter()
                h.ok("POST", "/mq/produce", {"producer": producer, "message": body})
                lat.append((time.perf_counter() - s) * 1000)
        except Exception as exc:
            errors.append(str(exc))
        finally:
            h.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchFailure(f"steady produce failed: {errors[0]}")
    took = time.monotonic() - t0
    return {
        "produced": total,
        "rate": total / took,
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
    }


def push_latency(ctx: Ctx) -> None:
    gw, a = ctx.gw, ctx.args
    assert gw is not None
    if "push" not in ctx.runs:
        raise BenchFailure("needs the push phase (its consumer, drained)")
    ptoken = gw.post("/admin/producers/pushb-p/token", {})["token"]
    ltoken = gw.post("/admin/consumers", {"name": "pushb-pull", "topic": "pushb", "start": "latest"})["token"]
    before = ep_stats(ctx, "pushb-c")["timed"]
    total = int(a.rate * a.duration)
    cfg = {"port": gw.port, "token": ltoken, "topic": "pushb", "consumer": "pushb-pull", "loops": LAT_LOOPS}
    cfg.update(expect=total, until=time.time() + a.duration + 30)
    command = f"PYTHONPATH=benchmarks {VENV_PY} -m bench.push latency '{shown(cfg)}'"
    log(f"  $ {command}")
    ctx.commands.append(command)
    out: dict = {}

    def pull_client() -> None:
        try:
            out.update(
                procs.run_json(
                    [str(VENV_PY), "-m", "bench.push", "latency", json.dumps(cfg)],
                    a.duration + 60,
                    env_with_bench(),
                )
            )
        except BenchFailure as exc:
            out["failed"] = str(exc)

    client = threading.Thread(target=pull_client, daemon=True)
    client.start()
    time.sleep(0.5)  # its long polls waiting
    meter = Meter(ctx)
    prod = steady_produce(gw.port, ptoken, "pushb-p", a.rate, a.duration)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ep_stats(ctx, "pushb-c")["timed"] - before < total:
        time.sleep(0.1)
    client.join(timeout=40)
    st = ep_stats(ctx, "pushb-c", lists=True)
    res: dict[str, Any] = {"what": "latency phase"}
    meter.finish(res, total)
    lat, lat_stored = st["lat"][before:], st["lat_stored"][before:]
    if len(lat) < total:
        ctx.problems.append(f"latency: the endpoint got {len(lat)} of {total} timed messages within 30 s")
    if "failed" in out or not out:
        raise BenchFailure(f"latency: the pull client failed: {out.get('failed', 'no answer')}")
    if out["received"] < total or out["errors"]:
        ctx.problems.append(
            f"latency: the pull client received {out['received']} of {total}; {out['errors']} errors "
            + out["first_err"]
        )
    res.update(
        produced=prod["produced"],
        rate=prod["rate"],
        produce_p50_ms=prod["p50_ms"],
        produce_p99_ms=prod["p99_ms"],
        delivered=len(lat),
        p50_ms=percentile(lat, 0.5),
        p99_ms=percentile(lat, 0.99),
        max_ms=max(lat, default=float("nan")),
        stored_p50_ms=percentile(lat_stored, 0.5),
        stored_p99_ms=percentile(lat_stored, 0.99),
        pull=out,
    )
    ctx.runs["latency"] = res
    log(
        f"  latency at {prod['rate']:.0f}/s: push p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms "
        f"(max {res['max_ms']:.1f}); long-poll pull p50 {out['p50_ms']:.2f} ms, p99 {out['p99_ms']:.2f} ms; "
        f"produce answer p50 {prod['p50_ms']:.2f} ms"
    )


def stream_drain(ctx: Ctx, what: str = "stream") -> None:
    """Drain a prefilled topic by one stream: `stream` (SSE, acks by POST) or `stream_ws`
    (WebSocket, acks over the socket)."""
    gw, a = ctx.gw, ctx.args
    assert gw is not None
    topic = "streamb" if what == "stream" else "streamw"
    _, ctoken = prefill(ctx, topic, STREAM_QUEUES, f"{topic}-c")
    cfg = {"port": gw.port, "token": ctoken, "topic": topic, "consumer": f"{topic}-c", "max": a.stream_max}
    cfg.update(expect=a.messages, timeout=a.timeout)
    command = f"PYTHONPATH=benchmarks {VENV_PY} -m bench.push {what} '{shown(cfg)}'"
    log(f"  $ {command}")
    ctx.commands.append(command)
    before = totals(gw.progress(f"{topic}-c"))
    meter = Meter(ctx)
    res = procs.run_json(
        [str(VENV_PY), "-m", "bench.push", what, json.dumps(cfg)], a.timeout + 60, env_with_bench()
    )
    res["what"] = what
    meter.finish(res, res["acked"])
    time.sleep(0.3)
    after = totals(gw.progress(f"{topic}-c"))
    committed = after["committed"] - before["committed"]
    if res["acked"] <= 0:
        raise BenchFailure(f"stream: nothing acked; first error {res['first_err']}")
    if res["errors"] or committed != res["acked"] or not res["drained"]:
        ctx.problems.append(
            f"{what}: {res['acked']:,} acked, committed moved by {committed:,}, drained "
            f"{bool(res['drained'])}, {res['errors']} errors {res['first_err']}"
        )
    res["committed"] = committed
    ctx.runs[what] = res
    log(
        f"  {what}: {res['msgs_per_s']:,.0f} msgs/s acked ({res['acked']:,} in {res['window_s']:.2f} s, "
        f"{res['events']} events, batch p50 {res['batch_p50']:.0f}), server CPU "
        f"{res['server_us_per_msg']:.1f} µs/msg ({res['server_cpu_pct']:.0f} %)"
    )


def setup(ctx: Ctx) -> None:
    ctx.ep_port = free_port()
    ep_log = ctx.work / "endpoint.log"
    cmd = [str(VENV_PY), "-m", "bench.push", "endpoint", str(ctx.ep_port)]
    ctx.endpoint = procs.start(cmd, ep_log, env_with_bench())
    wait_healthz(ctx.ep_port, ctx.endpoint, 30, ep_log, poll=0.05)
    log(f"endpoint up on port {ctx.ep_port} (pid {ctx.endpoint.pid})")
    env = {"MQGATE_PUSH_ALLOW_PRIVATE_ENDPOINTS": "true"}
    gw = ctx.gw = Gateway(ctx.work / "data", fsync=None, env=env, log_path=ctx.work / "gateway.log")
    log(f"gateway up on port {gw.port} in {gw.start():.2f} s: {' '.join(gw.cmd)} (pid {gw.pid})")


# --- the report ---------------------------------------------------------------------------------


def cpu_note(r: dict, per_msg: bool = True) -> str:
    ep = f", endpoint {r['endpoint_cpu_pct']:.0f} %" if r.get("endpoint_cpu_pct", 0) >= 1 else ""
    each = f" ({r['server_us_per_msg']:.1f} µs/msg)" if per_msg else ""
    return (
        f"CPU (100 % = 1 core): server {r['server_cpu_pct']:.0f} %{each}{ep}, "
        f"client + harness {r['client_cpu_pct']:.0f} %, kernel softirq {r['softirq_cpu_pct']:.0f} %, "
        f"other {r['other_cpu_pct']:.0f} %"
    )


def report(ctx: Ctx) -> tuple[list[str], list[results.Row], list[str]]:
    a, runs = ctx.args, ctx.runs
    gw_cmd = " ".join(ctx.gw.cmd) if ctx.gw else "?"
    lines = [
        f"- gateway: `{gw_cmd}` (MQGATE_ADMIN_TOKEN set, MQGATE_PUSH_ALLOW_PRIVATE_ENDPOINTS=true; "
        "no --fsync: the shipped default), embedded store, one process",
        "- endpoint: `python -m bench.push endpoint <port>` (raw asyncio protocol on uvloop, 204 at once), "
        "a process of its own",
        f"- {a.messages:,} messages of {MSG_BYTES} bytes per drain ({a.messages * 10:,} for pull max=100, "
        "which drains them far faster), prefilled by native batch produce; pull baselines: "
        f"{a.conns} asyncio loops on a topic of {a.conns} queues; push and stream topics of "
        f"{PUSH_QUEUES} queues; latency phase {a.rate:g} msgs/s for {a.duration:g} s; CPU busy before the "
        f"run {ctx.busy_before:.0f} %",
    ]
    rows: list[results.Row] = []
    p1, p100, push, stream, lat = (runs.get(k) for k in ("pull1", "pull100", "push", "stream", "latency"))
    stream_ws = runs.get("stream_ws")
    for name, why in ctx.failures.items():
        rows.append(results.Row("", name, f"FAILED: {why}"))

    def pull_text(r: dict, m: int) -> str:
        rate = fmt(r["msgs_per_s"], " msgs/s")
        return f"pull max={m} + ack via the next pull's requestId, {a.conns} loops: {rate}"

    if push:
        mark = ""
        if p1:
            ok = push["msgs_per_s"] / p1["msgs_per_s"] >= TARGET_RATIO
            mark = f"target ≥ {TARGET_RATIO} of pull max=1 + ack {'✅' if ok else '❌'}; "
        rows.append(
            results.Row(
                "push.throughput",
                f"push, maxInFlight {a.max_in_flight}, endpoint answering 204, {a.messages:,} prefilled, "
                "registration → last delivery",
                fmt(push["msgs_per_s"], " msgs/s"),
                pull_text(p1, 1) if p1 else "—",
                ratio(push["msgs_per_s"], p1["msgs_per_s"]) if p1 else "—",
                f"{mark}first delivery {push['first_after_s']:.2f} s after registering, "
                f"{fmt(push['first_to_last_per_s'], ' msgs/s')} first → last; server "
                f"{push['server_us_per_msg']:.0f} µs/msg (pull max=1 {p1['server_us_per_msg']:.0f})"
                if p1
                else "",
                f"{push['delivered']:,} deliveries of {push['distinct']:,} ids over "
                f"{push['connections']:,} connections; latest attempts {push['outcomes']}",
            )
        )
        if p100:
            rows.append(
                results.Row(
                    "push.throughput_vs_pull100",
                    f"push, maxInFlight {a.max_in_flight} (as push.throughput)",
                    fmt(push["msgs_per_s"], " msgs/s"),
                    pull_text(p100, 100),
                    ratio(push["msgs_per_s"], p100["msgs_per_s"]),
                    f"server {push['server_us_per_msg']:.0f} µs/msg vs {p100['server_us_per_msg']:.1f}",
                )
            )
    if lat:
        pl = lat["pull"]
        rows.append(
            results.Row(
                "push.latency",
                f"push, produced → delivered at the endpoint, p50 / p99, {lat['rate']:.0f} msgs/s single "
                f"produces for {a.duration:g} s",
                f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} ms",
                f"long-poll pull (max=100, wait=1, {LAT_LOOPS} loops) on the same messages, produced → "
                f"received: {pl['p50_ms']:.2f} / {pl['p99_ms']:.2f} ms",
                ratio(lat["p50_ms"], pl["p50_ms"]) + " (p50)",
                f"max {lat['max_ms']:.1f} ms; stored (mq-timestamp) → delivered {lat['stored_p50_ms']:.2f} / "
                f"{lat['stored_p99_ms']:.2f} ms; produce answer {lat['produce_p50_ms']:.2f} / "
                f"{lat['produce_p99_ms']:.2f} ms",
                f"{lat['delivered']:,} of {lat['produced']:,} timed; {cpu_note(lat, per_msg=False)} "
                "(produce, push and the long polls together)",
            )
        )
    if stream:
        rows.append(
            results.Row(
                "stream.throughput",
                f"SSE GET /mq/stream?max={a.stream_max}, one reader acking each batch as it arrives, "
                f"{a.messages:,} prefilled",
                fmt(stream["msgs_per_s"], " msgs/s"),
                pull_text(p100, 100) if p100 else "—",
                ratio(stream["msgs_per_s"], p100["msgs_per_s"]) if p100 else "—",
                f"{stream['events']} events, batch p50 {stream['batch_p50']:.0f} (min {stream['batch_min']}, "
                f"max {stream['batch_max']}); ack p50 / p99 {stream['ack_p50_ms']:.2f} / "
                f"{stream['ack_p99_ms']:.2f} ms",
                cpu_note(stream),
            )
        )
    if stream_ws:
        rows.append(
            results.Row(
                "stream.ws.throughput",
                f"WebSocket GET /mq/stream?max={a.stream_max}, one reader acking each batch over the socket "
                f"as it arrives, {a.messages:,} prefilled",
                fmt(stream_ws["msgs_per_s"], " msgs/s"),
                pull_text(p100, 100) if p100 else "—",
                ratio(stream_ws["msgs_per_s"], p100["msgs_per_s"]) if p100 else "—",
                f"{stream_ws['events']} events, batch p50 {stream_ws['batch_p50']:.0f} (min "
                f"{stream_ws['batch_min']}, max {stream_ws['batch_max']}); ack sent → acked p50 / p99 "
                f"{stream_ws['ack_p50_ms']:.2f} / {stream_ws['ack_p99_ms']:.2f} ms",
                cpu_note(stream_ws),
            )
        )
    for key, name in (
        ("pull1", "pull max=1 + ack"),
        ("push", "push drain"),
        ("pull100", "pull max=100 + ack"),
    ):
        r = runs.get(key)
        if r:
            n = r.get("deleted", r.get("distinct", 0))
            rows.append(
                results.Row(
                    "",
                    f"{name} run",
                    fmt(r["msgs_per_s"], " msgs/s"),
                    notes=f"{n:,} over {r['window_s']:.2f} s",
                    more=cpu_note(r),
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
    if ctx.commands:
        after += ["Client commands (ports and paths are per run):", "", *[f"    {c}" for c in ctx.commands]]
    return lines, rows, after


# --- the run ------------------------------------------------------------------------------------


def attempt(ctx: Ctx, name: str, fn: Any) -> None:
    log(f"{name} ...")
    try:
        fn(ctx)
    except BenchFailure as exc:
        ctx.failures[name] = str(exc)
        log(f"  FAILED: {exc}")


def main(a: argparse.Namespace) -> int:
    a.duration = a.duration or (3.0 if a.quick else 10.0)
    a.messages = a.messages or (10_000 if a.quick else 50_000)
    only = [x.strip() for x in a.only.split(",") if x.strip()] or ALL
    if unknown := set(only) - set(ALL):
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if not MQGATE.exists():
        raise SystemExit(f"{MQGATE} not found (make install)")
    ctx = Ctx(a, Path(tempfile.mkdtemp(prefix="mqgate-push-bench-")))
    log(f"work dir {ctx.work}")
    gateway.wait_idle(ctx)  # type: ignore[arg-type]  # reads args.wait_idle / idle_below, sets busy_before
    phases = {
        "pull1": lambda c: pull_drain(c, 1),
        "push": push_throughput,
        "pull100": lambda c: pull_drain(c, 100),
        "stream": stream_drain,
        "stream_ws": lambda c: stream_drain(c, "stream_ws"),
        "latency": push_latency,
    }
    try:
        try:
            setup(ctx)
        except BenchFailure as exc:
            ctx.failures.update(dict.fromkeys(only, f"setup: {exc}"))
        else:
            for name in ALL:
                if name in only:
                    attempt(ctx, name, phases[name])
        gw = ctx.gw
        if gw is not None:
            if gw.proc is not None and gw.proc.poll() is not None:
                ctx.problems.append(f"gateway exited during the run with {gw.proc.returncode}")
            gw.stop()
            if errs := gw.errors_in_log():
                ctx.problems.append(f"gateway log has {len(errs)} error lines, first: {errs[0][:300]}")
        if ctx.endpoint is not None:
            procs.kill_tree(ctx.endpoint)
    finally:
        procs.cleanup()
        lines, rows, after = report(ctx)
        kind = f"{'quick' if a.quick else 'full'} run" + (" (FAILURES)" if ctx.failures else "")
        title = f"push delivery and SSE streams vs pull + ack: {kind}"
        results.record(a, title, rows, lines, after, results.machine(ctx.work))
        if a.keep:
            log(f"kept {ctx.work}")
        else:
            shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if ctx.failures else 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(sub, common, "push", __doc__, help="push consumers and SSE streams vs pull + ack")
    p.add_argument("--quick", action="store_true", help="smaller drains (10,000) and a 3 s latency phase")
    p.add_argument(
        "--duration", type=float, help="seconds of the steady-rate latency phase (default 10, quick 3)"
    )
    p.add_argument("--messages", type=int, help="messages per drain (default 50,000; quick 10,000)")
    p.add_argument("--only", default="", help=f"comma list out of {','.join(ALL)} (latency needs push)")
    p.add_argument(
        "--conns",
        type=int,
        default=64,
        help="pull loops, and queues of the pull topics (default 64: maxInFlight)",
    )
    p.add_argument(
        "--max-in-flight", type=int, default=64, help="the push consumer's maxInFlight (default 64)"
    )
    p.add_argument("--stream-max", type=int, default=1000, help="the stream's max (default 1000)")
    p.add_argument("--rate", type=float, default=500.0, help="latency phase: produces a second (default 500)")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a drain may take at most (default 300)"
    )
    p.add_argument(
        "--wait-idle", type=float, default=0.0, help="wait up to this many seconds for an idle machine"
    )
    p.add_argument(
        "--idle-below", type=float, default=15.0, help="percent CPU busy counted as idle (default 15)"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (gateway and endpoint logs)"
    )
    p.set_defaults(func=main)


if __name__ == "__main__":
    if sys.argv[1:2] in (["endpoint"], ["stream"], ["stream_ws"], ["latency"]):
        process_main(sys.argv[1:])
    else:
        raise SystemExit(
            "usage: python -m bench.push endpoint PORT | stream '<json>' | stream_ws '<json>' "
            "| latency '<json>'"
        )
