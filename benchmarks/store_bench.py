"""Baseline B, the storage ceiling: the embedded store driven in-process, no HTTP.

Run by benchmarks/run.py in its own process (so nothing else shares its event loop), or by hand:

    .venv/bin/python benchmarks/store_bench.py throughput --data-dir /tmp/x --duration 5
    .venv/bin/python benchmarks/store_bench.py open --data-dir <gateway data dir>

`throughput` prints one JSON object with:
- append_single_conc: appends of 1 message, `--concurrency` tasks (like the HTTP connections),
  fsync=always (group commit), round-robin over the topic's queues;
- append_single_seq: the same with one task (one fsync per message);
- append_batch: appends of `--batch` messages, `--batch-concurrency` tasks;
- read: reads of `--read-max` messages, sequential, over what the appends wrote, decoding each
  record to a StoredMessage as the gateway does.
`open` times EmbeddedStore(...).open() on an existing data directory (crash recovery included)
and prints the time and the message count per topic.

It imports the store's real API (`mqgate.store.backends.embedded.EmbeddedStore`,
`mqgate.store.interface.TopicConfig`, `mqgate.model.StoredMessage`); if that API changes,
this is the one file to adapt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

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


async def _run_reads(store, queues: int, read_max: int, duration: float, raw: bool = False) -> dict:
    reader = store.read_raw if raw else store.read
    bounds = await store.bounds(TOPIC)
    offsets = [b.min for b in bounds]
    ends = [b.max for b in bounds]
    deadline = time.perf_counter() + duration
    msgs = calls = 0
    q = 0
    t0 = time.perf_counter()
    while True:
        if offsets[q] >= ends[q]:
            offsets[q] = bounds[q].min  # wrap: read the queue again
        got = await reader(TOPIC, q, offsets[q], read_max)
        if not got:
            raise SystemExit(f"store read returned nothing at queue {q} offset {offsets[q]}")
        offsets[q] = got[-1][0] + 1
        msgs += len(got)
        calls += 1
        q = (q + 1) % queues
        if (calls & 63) == 0 and time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    return {
        "messages": msgs,
        "calls": calls,
        "seconds": round(elapsed, 3),
        "messages_per_s": round(msgs / elapsed, 1),
        "calls_per_s": round(calls / elapsed, 1),
        "read_max": read_max,
        "method": "read_raw" if raw else "read",
    }


async def throughput(args) -> dict:
    store = EmbeddedStore(Path(args.data_dir))
    await store.open()
    try:
        await store.create_topic(TopicConfig(name=TOPIC, queues=args.queues, retention_ms=WEEK_MS))
        out = {"queues": args.queues, "fsync": "always"}
        out["append_single_conc"] = await _run_appenders(
            store, args.queues, args.concurrency, 1, args.duration, args.max_messages
        )
        out["append_single_seq"] = await _run_appenders(
            store, args.queues, 1, 1, min(args.duration, 3.0), args.max_messages
        )
        out["append_batch"] = await _run_appenders(
            store, args.queues, args.batch_concurrency, args.batch, args.duration, args.max_messages
        )
        out["read"] = await _run_reads(store, args.queues, args.read_max, args.duration)
        if hasattr(store, "read_raw"):
            # what the gateway's pull uses since records are stored as the JSON a consumer gets
            out["read_raw"] = await _run_reads(store, args.queues, args.read_max, args.duration, raw=True)
        return out
    finally:
        await store.close()


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
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batch-concurrency", type=int, default=16)
    ap.add_argument("--read-max", type=int, default=100)
    ap.add_argument("--max-messages", type=int, default=5_000_000)
    args = ap.parse_args()
    run = throughput if args.mode == "throughput" else open_time
    result = uvloop.run(run(args)) if uvloop is not None else asyncio.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
