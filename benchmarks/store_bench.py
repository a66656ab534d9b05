"""Baseline B, the storage ceiling: the message store driven in-process, no HTTP.

Run by benchmarks/run.py in its own process (so nothing else shares its event loop), or by hand:

    .venv/bin/python benchmarks/store_bench.py throughput --data-dir /tmp/x --duration 5
    .venv/bin/python benchmarks/store_bench.py open --data-dir <gateway data dir>
    .venv/bin/python benchmarks/store_bench.py throughput --store redis://127.0.0.1:6379/0 --procs 2

`throughput` prints one JSON object with:
- append_single_conc: appends of 1 message, `--concurrency` tasks (like the HTTP connections),
  fsync=always (group commit), round-robin over the topic's queues;
- append_single_seq: the same with one task (one fsync per message);
- append_batch: appends of `--batch` messages, `--batch-concurrency` tasks;
- read: reads of `--read-max` messages by `--read-tasks` readers (default 1: sequential) over
  what the appends wrote, decoding each record to a StoredMessage;
- read_raw: the same with `read_raw` (the stored JSON as bytes), what the gateway's pull uses.
`open` times EmbeddedStore(...).open() on an existing data directory (crash recovery included)
and prints the time and the message count per topic.

`--store redis://...` drives `RedisStore` instead (the gateway's adapter: Lua append script,
`read_raw` script), with keys under a random `--prefix` that are deleted at the end. With
`--procs N` (like `mqgate serve --workers N`) N processes run each phase at once, started
together by a barrier, each with `1/N` of the tasks; the figures are summed (messages) or the
slowest (seconds, latencies). `fsync` in the output is then Redis's `appendfsync`.

It imports the store's real API (`mqgate.store.backends.embedded.EmbeddedStore`,
`mqgate.store.backends.redis.RedisStore`, `mqgate.store.interface.TopicConfig`,
`mqgate.model.StoredMessage`); if that API changes, this is the one file to adapt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

import msgspec

from mqgate.core.ids import new_message_id
from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import TopicConfig

TOPIC = "store-bench"
BODY = b"x" * 100
WEEK_MS = 7 * 24 * 3600 * 1000


def _message_factory():
    """StoredMessage's fields have changed shape before (body bytes -> str, defaults dropped):
    build the keyword arguments from the struct's own field list."""
    fields = {f.name: f for f in msgspec.structs.fields(StoredMessage)}
    body_type = fields["body"].type
    body = BODY if body_type is bytes else BODY.decode()
    fixed = {"producer": "bench-producer", "body": body, "keys": [], "tags": [], "properties": {}}
    fixed = {k: v for k, v in fixed.items() if k in fields}

    def make() -> StoredMessage:
        return StoredMessage(msg_id=new_message_id(), timestamp_ms=int(time.time() * 1000), **fixed)

    return make


_msg = _message_factory()


async def _run_appenders(
    store, queues: int, tasks: int, batch: int, duration: float, max_messages: int
) -> dict:
    """`tasks` coroutines append `batch` messages at a time until time or count runs out."""
    deadline = time.perf_counter() + duration
    counts = [0] * tasks
    latencies: list[float] = []
    stop = False

    async def worker(i: int) -> None:
        nonlocal stop
        q = i % queues
        while not stop:
            msgs = [_msg() for _ in range(batch)]
            t0 = time.perf_counter()
            await store.append(TOPIC, q, msgs) if batch == 1 else await store.append_many(TOPIC, {q: msgs})
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            counts[i] += batch
            q = (q + 1) % queues
            if t1 >= deadline or sum(counts) >= max_messages:
                stop = True

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    elapsed = time.perf_counter() - t0
    total = sum(counts)
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0

    return {
        "messages": total,
        "calls": len(latencies),
        "seconds": round(elapsed, 3),
        "messages_per_s": round(total / elapsed, 1),
        "calls_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(pct(0.50), 3),
        "p99_ms": round(pct(0.99), 3),
        "tasks": tasks,
        "batch": batch,
    }


async def _run_reads(
    store, queues: int, read_max: int, duration: float, raw: bool = False, tasks: int = 1
) -> dict:
    """`tasks` coroutines read `read_max` messages at a time, each walking the queues from its
    own start over what the appends wrote (and round again at a queue's end)."""
    reader = store.read_raw if raw else store.read
    bounds = await store.bounds(TOPIC)
    deadline = time.perf_counter() + duration
    msgs = calls = 0
    stop = False

    async def worker(i: int) -> None:
        nonlocal msgs, calls, stop
        offsets = [b.min for b in bounds]
        q = i % queues
        while not stop:
            if offsets[q] >= bounds[q].max:
                offsets[q] = bounds[q].min  # wrap: read the queue again
            got = await reader(TOPIC, q, offsets[q], read_max)
            if not got:
                raise SystemExit(f"store read returned nothing at queue {q} offset {offsets[q]}")
            offsets[q] = got[-1][0] + 1
            msgs += len(got)
            calls += 1
            q = (q + 1) % queues
            if (calls & 63) == 0 and time.perf_counter() >= deadline:
                stop = True

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    elapsed = time.perf_counter() - t0
    return {
        "messages": msgs,
        "calls": calls,
        "seconds": round(elapsed, 3),
        "messages_per_s": round(msgs / elapsed, 1),
        "calls_per_s": round(calls / elapsed, 1),
        "read_max": read_max,
        "tasks": tasks,
        "method": "read_raw" if raw else "read",
    }


async def _open_store(args):
    """(store, async closer) for `--store`."""
    if args.store == "embedded":
        store = EmbeddedStore(Path(args.data_dir))
        await store.open()
        return store, store.close
    from mqgate.redisio import connect
    from mqgate.store.backends.redis import RedisStore

    client = connect(args.store)
    store = RedisStore(client, broker="local", prefix=args.prefix)
    await store.open()

    async def close() -> None:
        await store.close()
        await client.aclose()

    return store, close


async def throughput(args, gate: Callable[[], Any] = lambda: None) -> dict:
    """The phases; `gate()` is called before each (a barrier when several processes run)."""
    store, close = await _open_store(args)
    try:
        await store.create_topic(TopicConfig(name=TOPIC, queues=args.queues, retention_ms=WEEK_MS))
        out = {"queues": args.queues, "fsync": "always"}
        gate()
        out["append_single_conc"] = await _run_appenders(
            store, args.queues, args.concurrency, 1, args.duration, args.max_messages
        )
        gate()
        out["append_single_seq"] = await _run_appenders(
            store, args.queues, 1, 1, min(args.duration, 3.0), args.max_messages
        )
        gate()
        out["append_batch"] = await _run_appenders(
            store, args.queues, args.batch_concurrency, args.batch, args.duration, args.max_messages
        )
        gate()
        out["read"] = await _run_reads(
            store, args.queues, args.read_max, args.duration, tasks=args.read_tasks
        )
        if hasattr(store, "read_raw"):
            # what the gateway's pull uses since records are stored as the JSON a consumer gets
            gate()
            out["read_raw"] = await _run_reads(
                store, args.queues, args.read_max, args.duration, raw=True, tasks=args.read_tasks
            )
        return out
    finally:
        await close()


def _run_async(coro):
    return uvloop.run(coro) if uvloop is not None else asyncio.run(coro)


def _worker(args, barrier, results) -> None:
    results.put(_run_async(throughput(args, gate=barrier.wait)))


def _combine(parts: list[dict]) -> dict:
    """Phase results of processes that ran at once: messages and calls add up, the slowest
    process's time and latencies count."""
    out = dict(parts[0])
    for key, first in parts[0].items():
        if not isinstance(first, dict):
            continue
        rows = [p[key] for p in parts]
        seconds = max(r["seconds"] for r in rows)
        row = dict(first)
        row["messages"] = sum(r["messages"] for r in rows)
        row["calls"] = sum(r["calls"] for r in rows)
        row["seconds"] = seconds
        row["messages_per_s"] = round(row["messages"] / seconds, 1)
        row["calls_per_s"] = round(row["calls"] / seconds, 1)
        for k in ("p50_ms", "p99_ms"):
            if k in row:
                row[k] = max(r[k] for r in rows)
        if "tasks" in row:
            row["tasks"] = sum(r["tasks"] for r in rows)
        out[key] = row
    return out


def throughput_redis(args) -> dict:
    import redis

    procs = max(1, args.procs)
    args.concurrency = max(1, args.concurrency // procs)
    args.batch_concurrency = max(1, args.batch_concurrency // procs)
    args.read_tasks = max(1, args.read_tasks // procs)
    ctl = redis.Redis.from_url(args.store)
    try:
        if procs == 1:
            out = _run_async(throughput(args))
        else:
            ctx = mp.get_context("spawn")
            barrier, results = ctx.Barrier(procs), ctx.Queue()
            workers = [ctx.Process(target=_worker, args=(args, barrier, results)) for _ in range(procs)]
            for w in workers:
                w.start()
            try:
                parts = [results.get(timeout=args.duration * 8 + 120) for _ in workers]
            finally:
                for w in workers:
                    w.join(timeout=30)
                    if w.is_alive():
                        w.kill()
            out = _combine(parts)
        conf = ctl.config_get("append*")
        out["fsync"] = f"redis appendonly={conf.get('appendonly')} appendfsync={conf.get('appendfsync')}"
        out["procs"] = procs
        out["prefix"] = args.prefix
        return out
    finally:
        for key in ctl.scan_iter(match=args.prefix + ":*", count=1000):
            ctl.unlink(key)
        ctl.close()


async def open_time(args) -> dict:
    t0 = time.perf_counter()
    store = EmbeddedStore(Path(args.data_dir))
    await store.open()
    opened = time.perf_counter() - t0
    try:
        counts = {}
        for name in sorted(store._topics):
            counts[name] = sum(b.max - b.min for b in await store.bounds(name))
        return {
            "open_s": round(opened, 4),
            "messages": counts,
            "recovered_bytes_cut": store.recovered_bytes_cut,
        }
    finally:
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["throughput", "open"])
    ap.add_argument("--data-dir", help="embedded store: its directory (required)")
    ap.add_argument("--store", default="embedded", help="embedded (default) or a redis:// URL")
    ap.add_argument("--prefix", default="", help="redis key prefix (default: random mqstore-...)")
    ap.add_argument("--procs", type=int, default=1, help="redis: processes running each phase at once")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batch-concurrency", type=int, default=16)
    ap.add_argument("--read-max", type=int, default=100)
    ap.add_argument("--read-tasks", type=int, default=1, help="concurrent readers (all processes)")
    ap.add_argument("--max-messages", type=int, default=5_000_000)
    args = ap.parse_args()
    if args.store == "embedded":
        if not args.data_dir:
            ap.error("--data-dir is required for the embedded store")
        result = _run_async((throughput if args.mode == "throughput" else open_time)(args))
    else:
        if args.mode != "throughput":
            ap.error("only `throughput` runs against Redis")
        args.prefix = args.prefix or "mqstore-" + secrets.token_hex(4)
        result = throughput_redis(args)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
