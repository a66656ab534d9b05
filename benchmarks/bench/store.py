"""Baseline B, the storage ceiling: the message store driven in-process, no HTTP
(`run.py store`; `run.py gateway` runs it in a process of its own for its ratios).

`throughput` phases:
- append_single_conc: appends of 1 message, `--concurrency` tasks (like the HTTP connections),
  fsync=always (group commit), round-robin over the topic's queues;
- append_single_seq: the same with one task (one fsync per message);
- append_batch: appends of `--batch` messages, `--batch-concurrency` tasks;
- read: reads of `--read-max` messages by `--read-tasks` readers (default 1: sequential) over
  what the appends wrote, decoding each record to a StoredMessage;
- read_raw: the same with `read_raw` (the stored JSON as bytes), what the gateway's pull uses.
`open` times EmbeddedStore(...).open() on an existing data directory (crash recovery included)
and gives the time and the message count per topic.

`--store redis://...` drives `RedisStore` instead (the gateway's adapter: Lua append script,
`read_raw` script), with keys under a random `--prefix` that are deleted at the end. With
`--procs N` (like `mqgate serve --workers N`) N processes run each phase at once, started
together by a barrier, each with `1/N` of the tasks; the figures are summed (messages) or the
slowest (seconds, latencies). `fsync` is then Redis's `appendfsync`.

This module imports the store's real API; if that API changes, it is the one to adapt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import results
from .common import fmt

TOPIC = "store-bench"
BODY = b"x" * 100
WEEK_MS = 7 * 24 * 3600 * 1000


def _message_factory() -> Callable[[], Any]:
    """StoredMessage's fields have changed shape before (body bytes -> str, defaults dropped):
    build the keyword arguments from the struct's own field list."""
    import msgspec

    from mqgate.core.ids import new_message_id
    from mqgate.model import StoredMessage

    fields = {f.name: f for f in msgspec.structs.fields(StoredMessage)}
    body = BODY if fields["body"].type is bytes else BODY.decode()
    fixed = {"producer": "bench-producer", "body": body, "keys": [], "tags": [], "properties": {}}
    fixed = {k: v for k, v in fixed.items() if k in fields}
    return lambda: StoredMessage(msg_id=new_message_id(), timestamp_ms=int(time.time() * 1000), **fixed)


async def _run_appenders(
    store: Any, queues: int, tasks: int, batch: int, duration: float, max_messages: int
) -> dict:
    """`tasks` coroutines append `batch` messages at a time until time or count runs out."""
    make = _message_factory()
    deadline = time.perf_counter() + duration
    counts = [0] * tasks
    latencies: list[float] = []
    stop = False

    async def worker(i: int) -> None:
        nonlocal stop
        q = i % queues
        while not stop:
            msgs = [make() for _ in range(batch)]
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
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0

    extra = {"p50_ms": round(pct(0.50), 3), "p99_ms": round(pct(0.99), 3), "batch": batch}
    return _phase(sum(counts), len(latencies), time.perf_counter() - t0, tasks, **extra)


def _phase(messages: int, calls: int, elapsed: float, tasks: int, **extra: Any) -> dict:
    return {
        "messages": messages,
        "calls": calls,
        "seconds": round(elapsed, 3),
        "tasks": tasks,
        "messages_per_s": round(messages / elapsed, 1),
        "calls_per_s": round(calls / elapsed, 1),
        **extra,
    }


async def _run_reads(
    store: Any, queues: int, read_max: int, duration: float, raw: bool = False, tasks: int = 1
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
    return _phase(
        msgs, calls, time.perf_counter() - t0, tasks, read_max=read_max, method="read_raw" if raw else "read"
    )


async def _open_store(args: Any) -> tuple[Any, Callable[[], Any]]:
    """(store, async closer) for `--store`."""
    if args.store == "embedded":
        from mqgate.store.backends.embedded import EmbeddedStore

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


async def throughput(args: Any, gate: Callable[[], Any] = lambda: None) -> dict:
    """The phases; `gate()` is called before each (a barrier when several processes run)."""
    from mqgate.store.interface import TopicConfig

    store, close = await _open_store(args)
    try:
        await store.create_topic(TopicConfig(name=TOPIC, queues=args.queues, retention_ms=WEEK_MS))
        out: dict[str, Any] = {"queues": args.queues, "fsync": "always"}
        q, d, most = args.queues, args.duration, args.max_messages
        gate()
        out["append_single_conc"] = await _run_appenders(store, q, args.concurrency, 1, d, most)
        gate()
        out["append_single_seq"] = await _run_appenders(store, q, 1, 1, min(d, 3.0), most)
        gate()
        out["append_batch"] = await _run_appenders(store, q, args.batch_concurrency, args.batch, d, most)
        gate()
        out["read"] = await _run_reads(store, q, args.read_max, d, tasks=args.read_tasks)
        if hasattr(store, "read_raw"):
            # what the gateway's pull uses since records are stored as the JSON a consumer gets
            gate()
            out["read_raw"] = await _run_reads(store, q, args.read_max, d, raw=True, tasks=args.read_tasks)
        return out
    finally:
        await close()


def run_async(coro: Any) -> Any:
    """uvloop when installed, as `mqgate serve` runs."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


def _worker(args: Any, barrier: Any, out: Any) -> None:
    out.put(run_async(throughput(args, gate=barrier.wait)))


def _combine(parts: list[dict]) -> dict:
    """Phase results of processes that ran at once: messages and calls add up, the slowest
    process's time and latencies count."""
    out = dict(parts[0])
    for key, first in parts[0].items():
        if isinstance(first, dict):
            rows = [p[key] for p in parts]
            extra = {k: max(r[k] for r in rows) for k in ("p50_ms", "p99_ms") if k in first}
            extra |= {k: first[k] for k in ("batch", "read_max", "method") if k in first}
            out[key] = _phase(
                sum(r["messages"] for r in rows),
                sum(r["calls"] for r in rows),
                max(r["seconds"] for r in rows),
                sum(r["tasks"] for r in rows),
                **extra,
            )
    return out


def throughput_redis(args: Any) -> dict:
    import redis

    procs = max(1, args.procs)
    args.concurrency = max(1, args.concurrency // procs)
    args.batch_concurrency = max(1, args.batch_concurrency // procs)
    args.read_tasks = max(1, args.read_tasks // procs)
    ctl = redis.Redis.from_url(args.store)
    try:
        if procs == 1:
            out = run_async(throughput(args))
        else:
            ctx = mp.get_context("spawn")
            barrier, queue = ctx.Barrier(procs), ctx.Queue()
            workers = [ctx.Process(target=_worker, args=(args, barrier, queue)) for _ in range(procs)]
            for w in workers:
                w.start()
            try:
                parts = [queue.get(timeout=args.duration * 8 + 120) for _ in workers]
            finally:
                for w in workers:
                    w.join(timeout=30)
                    if w.is_alive():
                        w.kill()
            out = _combine(parts)
        conf = ctl.config_get("append*")
        out["fsync"] = f"redis appendonly={conf.get('appendonly')} appendfsync={conf.get('appendfsync')}"
        out["procs"], out["prefix"] = procs, args.prefix
        return out
    finally:
        for key in ctl.scan_iter(match=args.prefix + ":*", count=1000):
            ctl.unlink(key)
        ctl.close()


async def open_time(args: Any) -> dict:
    from mqgate.store.backends.embedded import EmbeddedStore

    t0 = time.perf_counter()
    store = EmbeddedStore(Path(args.data_dir))
    await store.open()
    opened = time.perf_counter() - t0
    try:
        counts = {
            name: sum(b.max - b.min for b in await store.bounds(name)) for name in sorted(store._topics)
        }
        return {
            "open_s": round(opened, 4),
            "messages": counts,
            "recovered_bytes_cut": store.recovered_bytes_cut,
        }
    finally:
        await store.close()


def rows_of(r: dict, store_name: str = "store") -> list[tuple[str, str, dict]]:
    """(key, what, phase) of a throughput result, for the tables."""
    s1, s0, sb, rd = r["append_single_conc"], r["append_single_seq"], r["append_batch"], r["read"]
    readers = f", {rd['tasks']} readers" if rd.get("tasks", 1) > 1 else ""
    each = "one fsync per append" if r["fsync"] == "always" else "1 per process"
    out = [
        ("append-1", f"{store_name} append 1 msg, {s1['tasks']} tasks, fsync {r['fsync']}", s1),
        ("append-1-seq", f"{store_name} append 1 msg, {s0['tasks']} task(s) ({each})", s0),
        ("append-batch", f"{store_name} append batch of {sb['batch']}, {sb['tasks']} tasks", sb),
        ("read", f"{store_name} read {rd['read_max']} msgs{readers}, decoded (`read`)", rd),
    ]
    if "read_raw" in r:
        rr = r["read_raw"]
        out.append(
            (
                "read-raw",
                f"{store_name} read {rr['read_max']} msgs{readers}, raw bytes (`read_raw`, used by pulls)",
                rr,
            )
        )
    return out


def main(args: argparse.Namespace) -> int:
    if args.store != "embedded":
        if args.mode != "throughput":
            raise SystemExit("only `throughput` runs against Redis")
        args.prefix = args.prefix or "mqstore-" + secrets.token_hex(4)
        result = throughput_redis(args)
    elif args.mode == "open":
        if not args.data_dir:
            raise SystemExit("`open` needs --data-dir (a gateway's data directory)")
        result = run_async(open_time(args))
    else:
        with tempfile.TemporaryDirectory(prefix="mqgate-store-bench-") as tmp:
            args.data_dir = args.data_dir or tmp
            result = run_async(throughput(args))
    if args.json:
        print(json.dumps(result))
        return 0
    if args.mode == "open":
        row = results.Row(
            "", f"EmbeddedStore.open() on {args.data_dir}", f"{result['open_s']:.3f} s", notes=str(result)
        )
        results.record(args, "store open (recovery) in-process", [row])
        return 0
    name, kind = ("RedisStore", "redis") if args.store != "embedded" else ("EmbeddedStore", "embedded")
    rows = [
        results.Row(
            f"store.{kind}.{key}",
            f"baseline B: {what}",
            fmt(ph["messages_per_s"], " msgs/s"),
            notes=f"{fmt(ph['calls_per_s'])} calls/s"
            + (f", p50 {ph['p50_ms']:.3f} ms" if "p50_ms" in ph else ""),
        )
        for key, what, ph in rows_of(result, name)
    ]
    results.record(args, f"baseline B: the {name} in-process", rows)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "store", __doc__, help="baseline B: the message store in-process (the storage ceiling)"
    )
    p.add_argument("mode", nargs="?", choices=["throughput", "open"], default="throughput")
    p.add_argument(
        "--data-dir", help="embedded store: its directory (default: a temporary one; `open`: required)"
    )
    p.add_argument("--store", default="embedded", help="embedded (default) or a redis:// URL")
    p.add_argument("--prefix", default="", help="redis key prefix (default: random mqstore-...)")
    p.add_argument("--procs", type=int, default=1, help="redis: processes running each phase at once")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--batch-concurrency", type=int, default=16)
    p.add_argument("--read-max", type=int, default=100)
    p.add_argument("--read-tasks", type=int, default=1, help="concurrent readers (all processes)")
    p.add_argument("--max-messages", type=int, default=5_000_000)
    p.add_argument(
        "--json", action="store_true", help="print the raw figures as one JSON line (records nothing)"
    )
    p.set_defaults(func=main)
