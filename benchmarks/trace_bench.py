"""Trace figures (issue 11, SPEC P6): the writer and the indexer through the embedded store, and
lookups in an SQLite trace index holding millions of events.

    .venv/bin/python benchmarks/trace_bench.py                      # 1,000,000 indexed events
    .venv/bin/python benchmarks/trace_bench.py --events 10000000    # the issue's 10 million
    .venv/bin/python benchmarks/trace_bench.py --index-url postgresql+psycopg://...  # lookups only

Phases, one process, printed as a Markdown table:
1. writer: `--pipeline-events` trace events (default 200,000; 5 hops per message) recorded by
   `--writers` concurrent tasks, each `TraceRecorder.record` of a message's hops at a time, into
   the embedded store (fsync per group commit, as data);
2. indexer alone: a fresh `TraceIndexer` indexing all of them into a fresh SQLite index (the
   events/s of read_raw + decode + SQL insert in one transaction with the positions);
3. together: writer and indexer at once (same counts again), with the index lag sampled every
   50 ms (max events behind, and how long after the last write the index caught up);
4. lookups: an SQLite index bulk-filled to `--events` events (`TraceIndex.bulk_load`: ids given,
   one transaction per 100,000), then `--lookups` random lookups each by msgId, requestId and
   key through `TraceIndex.paths` (decoding and building the path included), p50/p99/max.
   The file stays in the OS page cache (warm): the figures are those of a running gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mqgate.core.ids import new_message_ids
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.tracing.events import TRACE_TOPIC_PREFIX, Hop, Resource, TraceEvent, encode_event, trace_topic
from mqgate.tracing.index import IndexRow, TraceIndex
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.recorder import TraceRecorder

PROJECT = "bench"
HOPS_PER_MESSAGE = 5
GATEWAY = Resource("gw-bench-1", "bench-host", "mqgate", 8080)
HOT_KEYS = 10  # keys carried by every 1000th message (each names a few hundred messages)


def request_id(n: int) -> str:
    return f"{(n * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF:016x}"  # random order in the index


def message_key(n: int, messages: int) -> str:
    return f"order-{n % max(1, messages // 4)}"  # about 4 messages per key


def hops_of(n: int, msg_id: str, messages: int, t0: int, project: str = PROJECT) -> list[TraceEvent]:
    keys = [message_key(n, messages)] + ([f"hot-{n // 1000 % HOT_KEYS}"] if n % 1000 == 0 else [])
    req = request_id(n)
    common: dict[str, Any] = {"project": project, "topic": "orders", "resource": GATEWAY, "keys": keys}
    plan: list[tuple[Hop, int, dict[str, Any]]] = [
        ("accepted", 0, {"producer": "web", "traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}),
        ("stored", 1, {"queue": n % 8, "offset": n // 8}),
        ("delivered", 20, {"consumer": "billing", "client_id": "w-3", "request_id": req}),
        ("acked", 35, {"consumer": "billing", "client_id": "w-3", "request_id": req}),
        ("committed", 60, {"consumer": "spark-job"}),
    ]
    return [TraceEvent(msg_id=msg_id, hop=h, time_ms=t0 + dt, **common, **f) for h, dt, f in plan]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- phases 1–3: through the store --------------------------------------------------------------


async def write_all(recorder: TraceRecorder, messages: int, writers: int, project: str = PROJECT) -> float:
    t0 = int(time.time() * 1000)
    ids = new_message_ids(t0, messages)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(messages):
        queue.put_nowait(n)

    async def writer() -> None:
        while not queue.empty():
            n = queue.get_nowait()
            await recorder.record(hops_of(n, ids[n], messages, t0 + n, project))

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - started


async def pipeline(work: Path, events: int, writers: int) -> dict[str, float]:
    messages = events // HOPS_PER_MESSAGE
    out: dict[str, float] = {}
    store = EmbeddedStore(work / "store")
    await store.open()
    try:
        recorder = TraceRecorder(store)
        seconds = await write_all(recorder, messages, writers)
        out["writer_events_s"] = messages * HOPS_PER_MESSAGE / seconds
        out["writer_appends"] = recorder.counters.appends
        await recorder.close()

        index = TraceIndex(f"sqlite:///{work}/alone.sqlite")
        index.create_schema()
        indexer = TraceIndexer(store, index)
        indexer.add_topic(trace_topic(PROJECT))
        started = time.perf_counter()
        await indexer.run_until_caught_up(timeout_s=3600)
        out["indexer_events_s"] = indexer.counters.indexed / (time.perf_counter() - started)
        index.dispose()

        # Together: a new project's topic, so the indexer starts at zero while the writer runs.
        index = TraceIndex(f"sqlite:///{work}/together.sqlite")
        index.create_schema()
        indexer = TraceIndexer(store, index, idle_wait_s=0.05)
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        max_lag = 0
        indexer.start()
        writing = asyncio.create_task(write_all(recorder, messages, writers, PROJECT + "-2"))
        while not writing.done():
            await asyncio.sleep(0.05)
            max_lag = max(max_lag, (await indexer.lag_now()).events)
        write_s = await writing
        wrote_at = time.perf_counter()
        while (await indexer.lag_now()).events > 0:
            await asyncio.sleep(0.01)
        out["together_writer_events_s"] = messages * HOPS_PER_MESSAGE / write_s
        out["together_max_lag_events"] = max_lag
        out["together_catch_up_s"] = time.perf_counter() - wrote_at
        await indexer.close()
        await recorder.close()
        index.dispose()
    finally:
        await store.close()
    return out


# --- phase 4: lookups in a big index -----------------------------------------------------------


def fill(index: TraceIndex, events: int) -> tuple[float, list[str]]:
    """Bulk-load `events` events; return the seconds taken and the message ids."""
    messages = events // HOPS_PER_MESSAGE
    t0 = int(time.time() * 1000) - 3_600_000
    ids = new_message_ids(t0, messages)
    started = time.perf_counter()
    next_id = 1
    chunk = 20_000  # messages per transaction (100,000 events)
    for low in range(0, messages, chunk):
        rows: list[tuple[int, IndexRow]] = []
        for n in range(low, min(messages, low + chunk)):
            for e in hops_of(n, ids[n], messages, t0 + n // 100):
                rows.append(
                    (next_id, IndexRow(e.msg_id, e.request_id, e.time_ms, e.keys, encode_event(e).decode()))
                )
                next_id += 1
        index.bulk_load(rows)
        if low % (chunk * 25) == 0:
            print(f"  filled {next_id - 1:,} events", file=sys.stderr, flush=True)
    return time.perf_counter() - started, ids


def lookups(index: TraceIndex, ids: list[str], count: int) -> dict[str, list[float]]:
    rng = random.Random(11)
    messages = len(ids)
    timings: dict[str, list[float]] = {"msgId": [], "requestId": [], "key": [], "hot key": []}
    for _ in range(count):
        n = rng.randrange(messages)
        for name, kwargs, want in (
            ("msgId", {"msg_id": ids[n]}, 1),
            ("requestId", {"request_id": request_id(n)}, 1),
            ("key", {"key": message_key(n, messages)}, 1),
        ):
            started = time.perf_counter()
            found = index.paths(**kwargs)
            timings[name].append((time.perf_counter() - started) * 1000)
            assert len(found) >= want and all(len(p.hops) == HOPS_PER_MESSAGE for p in found), (name, kwargs)
    for _ in range(max(10, count // 20)):
        started = time.perf_counter()
        found = index.paths(key=f"hot-{rng.randrange(HOT_KEYS)}")
        timings["hot key"].append((time.perf_counter() - started) * 1000)
        assert found
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the lookup index")
    parser.add_argument("--pipeline-events", type=int, default=200_000)
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--lookups", type=int, default=2_000)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="trace-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    assert TRACE_TOPIC_PREFIX  # the stores must accept the trace topics (mqgate.names)
    _allow_trace_topics()
    rows: list[tuple[str, str]] = []
    try:
        if not args.skip_pipeline:
            p = asyncio.run(pipeline(work, args.pipeline_events, args.writers))
            rows += [
                ("writer (record, 5 hops per call, embedded store)", f"{p['writer_events_s']:,.0f} events/s"),
                ("writer store appends", f"{p['writer_appends']:,.0f}"),
                ("indexer alone (store → SQLite)", f"{p['indexer_events_s']:,.0f} events/s"),
                ("writer while indexing", f"{p['together_writer_events_s']:,.0f} events/s"),
                ("index lag while writing (max)", f"{p['together_max_lag_events']:,.0f} events"),
                ("index caught up after the last write", f"{p['together_catch_up_s'] * 1000:,.0f} ms"),
            ]
        index = TraceIndex(f"sqlite:///{work}/lookup.sqlite")
        index.create_schema()
        seconds, ids = fill(index, args.events)
        db = Path(f"{work}/lookup.sqlite")
        rows.append(
            ("bulk fill", f"{args.events:,} events in {seconds:,.0f} s ({args.events / seconds:,.0f}/s)")
        )
        rows.append(("index file", f"{db.stat().st_size / 2**30:.2f} GiB"))
        index.dispose()
        index = TraceIndex(f"sqlite:///{db}")  # a fresh engine: nothing cached in Python
        for name, values in lookups(index, ids, args.lookups).items():
            rows.append(
                (
                    f"lookup by {name} ({len(values)})",
                    f"p50 {statistics.median(values):.2f} ms · p99 {percentile(values, 0.99):.2f} ms"
                    f" · max {max(values):.2f} ms",
                )
            )
        index.dispose()
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n| trace figure ({args.events:,} events indexed) | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def _allow_trace_topics() -> None:
    pass


if __name__ == "__main__":
    main()
