"""Load edges of one gateway (issue 10, section 3), measured against a real `mqgate serve`:

- longpoll: produce latency (p50/p90) while `--waiters` long polls wait on one consumer;
- registry: time of each consumer registration as the registry grows to `--consumers`, and of
  a `/metrics` scrape at that size;
- sigterm: how long a gateway takes to exit on SIGTERM with `--waiters` long polls waiting,
  and what those polls were answered.

Run from the repository (the gateway started is the `mqgate` beside this Python):

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/load_edges_bench.py longpoll --waiters 1000
    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/load_edges_bench.py registry --consumers 3600
    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/load_edges_bench.py sigterm --waiters 50

Prints one JSON object per run. Loopback only; the data directory is a fresh temporary one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

MQGATE = str(Path(sys.executable).parent / "mqgate")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(extra_env: dict[str, str] | None = None) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """(base URL, admin token, process) of a fresh gateway; stopped (SIGKILL if need be) after."""
    port = _free_port()
    token = "mqa_bench_" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="mqgate-load-") as tmp:
        env = {**os.environ, "MQGATE_ADMIN_TOKEN": token, "MQGATE_LOG_LEVEL": "warning", **(extra_env or {})}
        args = [MQGATE, "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", f"{tmp}/data"]
        log = open(f"{tmp}/server.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"gateway exited: {Path(tmp, 'server.log').read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit("gateway did not start")
                time.sleep(0.05)
            yield url, token, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            log.close()


def admin(url: str, token: str, path: str, **body: Any) -> Any:
    r = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r.raise_for_status()
    return r.json()["result"]


def setup(url: str, token: str, queues: int = 8) -> tuple[str, str]:
    admin(url, token, "/admin/topics", name="t", queues=queues)
    ptoken = admin(url, token, "/admin/producers", name="p", topic="t")["token"]
    ctoken = admin(url, token, "/admin/consumers", name="c", topic="t")["token"]
    return ptoken, ctoken


def waiting_pulls(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mqgate_waiting_pulls{")
    )


async def _poller(
    http: httpx.AsyncClient, ctoken: str, wait_s: float, stop: asyncio.Event, seen: list[int]
) -> None:
    """Keep one long poll waiting; ack what it gets with its next pull."""
    request_id: str | None = None
    headers = {"Authorization": f"Bearer {ctoken}"}
    while not stop.is_set():
        params: dict[str, Any] = {"topic": "t", "consumer": "c", "wait": wait_s, "max": 1}
        if request_id:
            params["requestId"] = request_id
        try:
            r = await http.get("/mq/message", params=params, headers=headers)
        except httpx.HTTPError:
            return
        seen.append(r.status_code)
        body = r.json().get("result") or {}
        request_id = body.get("requestId")


async def _longpoll(url: str, ptoken: str, ctoken: str, waiters: int, produces: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=waiters + 10, max_keepalive_connections=waiters + 10)
    stop = asyncio.Event()
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        tasks = [asyncio.create_task(_poller(http, ctoken, 30, stop, statuses)) for _ in range(waiters)]
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(waiting_pulls, url) < waiters * 0.98:
            if time.monotonic() > deadline:
                raise SystemExit("the long polls did not all start waiting")
            await asyncio.sleep(0.2)
        latencies = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as producer:
            headers = {"Authorization": f"Bearer {ptoken}"}
            for i in range(produces):
                started = time.perf_counter()
                r = await producer.post(
                    "/mq/produce", json={"producer": "p", "message": f"m{i}"}, headers=headers
                )
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


def run_longpoll(args: argparse.Namespace) -> dict[str, Any]:
    with gateway() as (url, token, _):
        ptoken, ctoken = setup(url, token)
        return asyncio.run(_longpoll(url, ptoken, ctoken, args.waiters, args.produces))


def run_registry(args: argparse.Namespace) -> dict[str, Any]:
    with gateway() as (url, token, _):
        admin(url, token, "/admin/topics", name="t", queues=1)
        times: list[float] = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            for i in range(args.consumers):
                started = time.perf_counter()
                r = http.post("/admin/consumers", json={"name": f"c{i}", "topic": "t"})
                times.append(time.perf_counter() - started)
                r.raise_for_status()
            # Scraped once every consumer has a lag gauge (at once before; within one background
            # pass since), so the figure is the scrape's own cost.
            deadline = time.monotonic() + 120
            while httpx.get(url + "/metrics", timeout=60).text.count("mqgate_consumer_lag{") < args.consumers:
                if time.monotonic() > deadline:
                    raise SystemExit("lag gauges did not appear")
                time.sleep(0.5)
            scrapes = []
            for _ in range(args.scrapes):
                started = time.perf_counter()
                httpx.get(url + "/metrics", timeout=60).raise_for_status()
                scrapes.append(time.perf_counter() - started)
                time.sleep(0.5)  # spaced, as a scraper's are (pacing, not synchronisation)
        first, last = times[:100], times[-100:]
        return {
            "consumers": args.consumers,
            "register_first100_p50_ms": round(statistics.median(first) * 1000, 2),
            "register_last100_p50_ms": round(statistics.median(last) * 1000, 2),
            "register_total_s": round(sum(times), 1),
            "metrics_p50_ms": round(statistics.median(scrapes) * 1000, 2),
            "metrics_max_ms": round(max(scrapes) * 1000, 2),
        }


async def _sigterm(url: str, ctoken: str, proc: subprocess.Popen[bytes], waiters: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=waiters + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        headers = {"Authorization": f"Bearer {ctoken}"}
        params = {"topic": "t", "consumer": "c", "wait": 30}
        pulls = [
            asyncio.create_task(http.get("/mq/message", params=params, headers=headers))
            for _ in range(waiters)
        ]
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(waiting_pulls, url) < waiters:
            if time.monotonic() > deadline:
                raise SystemExit("the long polls did not all start waiting")
            await asyncio.sleep(0.1)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*pulls, return_exceptions=True)
        answered_s = time.monotonic() - started
        await asyncio.to_thread(proc.wait, 60)
        exited_s = time.monotonic() - started
    outcome: dict[str, int] = {}
    for a in answers:
        key = (
            type(a).__name__
            if isinstance(a, BaseException)
            else f"{a.status_code} {a.json()['result']['status'] if a.status_code == 200 else ''}".strip()
        )
        outcome[key] = outcome.get(key, 0) + 1
    return {
        "waiters": waiters,
        "answered_s": round(answered_s, 2),
        "exited_s": round(exited_s, 2),
        "answers": outcome,
    }


def run_sigterm(args: argparse.Namespace) -> dict[str, Any]:
    with gateway() as (url, token, proc):
        _, ctoken = setup(url, token)
        return asyncio.run(_sigterm(url, ctoken, proc, args.waiters))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    lp = sub.add_parser("longpoll")
    lp.add_argument("--waiters", type=int, default=1000)
    lp.add_argument("--produces", type=int, default=100)
    lp.set_defaults(func=run_longpoll)
    rg = sub.add_parser("registry")
    rg.add_argument("--consumers", type=int, default=3600)
    rg.add_argument("--scrapes", type=int, default=20)
    rg.set_defaults(func=run_registry)
    st = sub.add_parser("sigterm")
    st.add_argument("--waiters", type=int, default=50)
    st.set_defaults(func=run_sigterm)
    args = parser.parse_args()
    print(json.dumps({"bench": args.what, **args.func(args)}))


if __name__ == "__main__":
    main()
