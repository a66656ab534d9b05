"""Load edges of one gateway (issue 10, section 3; `run.py load-edges <edge>`), measured
against a real gateway (no --fsync flag: the gateway's defaults):

- longpoll: produce latency (p50/p90) while `--waiters` long polls wait on one consumer;
- registry: time of each consumer registration as the registry grows to `--consumers`, and of
  a `/metrics` scrape at that size;
- sigterm: how long a gateway takes to exit on SIGTERM with `--waiters` long polls waiting,
  and what those polls were answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import results
from .servers import Gateway, register


@contextlib.contextmanager
def gateway() -> Iterator[Gateway]:
    """A fresh gateway with a topic `t` (8 queues), producer `p`, consumer `c`; stopped after."""
    with tempfile.TemporaryDirectory(prefix="mqgate-load-") as tmp:
        gw = Gateway(Path(tmp) / "data", fsync=None, env={"MQGATE_LOG_LEVEL": "warning"})
        try:
            gw.start(30)
            yield gw
        finally:
            gw.stop()


def waiting_pulls(url: str) -> float:
    import httpx

    text = httpx.get(url + "/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mqgate_waiting_pulls{")
    )


async def wait_for_waiters(url: str, waiters: float, timeout: float, poll: float) -> None:
    deadline = time.monotonic() + timeout
    while await asyncio.to_thread(waiting_pulls, url) < waiters:
        if time.monotonic() > deadline:
            raise SystemExit("the long polls did not all start waiting")
        await asyncio.sleep(poll)


async def _poller(http: Any, ctoken: str, wait_s: float, stop: asyncio.Event) -> None:
    """Keep one long poll waiting; ack what it gets with its next pull."""
    import httpx

    request_id: str | None = None
    while not stop.is_set():
        params: dict[str, Any] = {"topic": "t", "consumer": "c", "wait": wait_s, "max": 1}
        if request_id:
            params["requestId"] = request_id
        try:
            r = await http.get("/mq/message", params=params, headers={"Authorization": f"Bearer {ctoken}"})
        except httpx.HTTPError:
            return
        request_id = (r.json().get("result") or {}).get("requestId")


async def _longpoll(url: str, ptoken: str, ctoken: str, waiters: int, produces: int) -> dict[str, Any]:
    import httpx

    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=waiters + 10, max_keepalive_connections=waiters + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        tasks = [asyncio.create_task(_poller(http, ctoken, 30, stop)) for _ in range(waiters)]
        await wait_for_waiters(url, waiters * 0.98, 60, 0.2)
        latencies = []
        async with httpx.AsyncClient(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {ptoken}"}
        ) as producer:
            for i in range(produces):
                started = time.perf_counter()
                r = await producer.post("/mq/produce", json={"producer": "p", "message": f"m{i}"})
                latencies.append(time.perf_counter() - started)
                r.raise_for_status()
                await asyncio.sleep(0.02)  # pacing between samples, not synchronisation
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    latencies.sort()
    return {
        "waiters": waiters,
        "produces": produces,
        "produce_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "produce_p90_ms": round(latencies[int(len(latencies) * 0.9)] * 1000, 2),
    }


def longpoll(args: argparse.Namespace) -> tuple[dict[str, Any], results.Row]:
    with gateway() as gw:
        ptoken, ctoken = register(gw, "t", 8, "p", "c")
        r = asyncio.run(_longpoll(gw.url, ptoken, ctoken, args.waiters, args.produces))
    return r, results.Row(
        "load-edges.longpoll",
        f"produce latency with {args.waiters:,} long polls waiting on one consumer",
        f"p50 {r['produce_p50_ms']} ms",
        notes=f"p90 {r['produce_p90_ms']} ms",
    )


def registry(args: argparse.Namespace) -> tuple[dict[str, Any], results.Row]:
    import httpx

    with gateway() as gw:
        gw.post("/admin/topics", {"name": "t", "queues": 1})
        times: list[float] = []
        for i in range(args.consumers):
            started = time.perf_counter()
            gw.post("/admin/consumers", {"name": f"c{i}", "topic": "t"})
            times.append(time.perf_counter() - started)
        # Scraped once every consumer has a lag gauge (at once before; within one background
        # pass since), so the figure is the scrape's own cost.
        deadline = time.monotonic() + 120
        while httpx.get(gw.url + "/metrics", timeout=60).text.count("mqgate_consumer_lag{") < args.consumers:
            if time.monotonic() > deadline:
                raise SystemExit("lag gauges did not appear")
            time.sleep(0.5)
        scrapes = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            httpx.get(gw.url + "/metrics", timeout=60).raise_for_status()
            scrapes.append(time.perf_counter() - started)
            time.sleep(0.5)  # spaced, as a scraper's are (pacing, not synchronisation)
    r = {
        "consumers": args.consumers,
        "register_first100_p50_ms": round(statistics.median(times[:100]) * 1000, 2),
        "register_last100_p50_ms": round(statistics.median(times[-100:]) * 1000, 2),
        "register_total_s": round(sum(times), 1),
        "metrics_p50_ms": round(statistics.median(scrapes) * 1000, 2),
        "metrics_max_ms": round(max(scrapes) * 1000, 2),
    }
    return r, results.Row(
        "load-edges.registry",
        f"consumer registration p50, the last 100 of {args.consumers:,}",
        f"{r['register_last100_p50_ms']} ms",
        f"the first 100: {r['register_first100_p50_ms']} ms",
        f"{r['register_first100_p50_ms'] / r['register_last100_p50_ms']:.2f}",
        f"/metrics at that size p50 {r['metrics_p50_ms']} ms, max {r['metrics_max_ms']} ms",
    )


async def _sigterm(gw: Gateway, ctoken: str, waiters: int) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(
        base_url=gw.url, limits=httpx.Limits(max_connections=waiters + 10), timeout=60
    ) as http:
        params = {"topic": "t", "consumer": "c", "wait": 30}
        headers = {"Authorization": f"Bearer {ctoken}"}
        pulls = [
            asyncio.create_task(http.get("/mq/message", params=params, headers=headers))
            for _ in range(waiters)
        ]
        await wait_for_waiters(gw.url, waiters, 30, 0.1)
        started = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*pulls, return_exceptions=True)
        answered_s = time.monotonic() - started
        await asyncio.to_thread(gw.proc.wait, 60)
        exited_s = time.monotonic() - started
    outcome: dict[str, int] = {}
    for a in answers:
        ok = not isinstance(a, BaseException)
        key = (
            f"{a.status_code} {a.json()['result']['status'] if a.status_code == 200 else ''}".strip()
            if ok
            else type(a).__name__
        )
        outcome[key] = outcome.get(key, 0) + 1
    return {
        "waiters": waiters,
        "answered_s": round(answered_s, 2),
        "exited_s": round(exited_s, 2),
        "answers": outcome,
    }


def sigterm(args: argparse.Namespace) -> tuple[dict[str, Any], results.Row]:
    with gateway() as gw:
        _, ctoken = register(gw, "t", 8, "p", "c")
        r = asyncio.run(_sigterm(gw, ctoken, args.waiters))
    return r, results.Row(
        "load-edges.sigterm",
        f"SIGTERM with {args.waiters} long polls waiting → the gateway has exited",
        f"{r['exited_s']} s",
        notes=f"polls answered after {r['answered_s']} s: {r['answers']}",
    )


def main(args: argparse.Namespace) -> int:
    if args.waiters is None:
        args.waiters = 1000 if args.edge == "longpoll" else 50
    r, row = {"longpoll": longpoll, "registry": registry, "sigterm": sigterm}[args.edge](args)
    row.more = str(r)
    results.record(args, f"load edges: {args.edge}", [row])
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "load-edges", __doc__, help="a gateway's load edges: long polls, a big registry, SIGTERM"
    )
    p.add_argument("edge", choices=["longpoll", "registry", "sigterm"])
    p.add_argument(
        "--waiters", type=int, help="longpoll: long polls waiting (default 1000); sigterm: (default 50)"
    )
    p.add_argument("--produces", type=int, default=100, help="longpoll: produces timed")
    p.add_argument("--consumers", type=int, default=3600, help="registry: consumers registered")
    p.add_argument("--scrapes", type=int, default=20, help="registry: /metrics scrapes timed")
    p.set_defaults(func=main)
