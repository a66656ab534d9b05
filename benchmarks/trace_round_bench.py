"""Trace look-ups in an index of round records (issue 11): the produce hops of many requests
per record (`TraceRound`, one per group-commit round), as a traced gateway under load writes
them. Fills an SQLite index through the index writer's own path (`decode_and_write`: decode the
stored record, one row per record and one id range per batch), then looks up random messages
by id and by key.

    PYTHONPATH=src .venv/bin/python benchmarks/trace_round_bench.py            # 2,000,000 messages
    PYTHONPATH=src .venv/bin/python benchmarks/trace_round_bench.py --rounds 100000   # 10,000,000
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable

from mqgate.core.ids import new_message_ids
from mqgate.tracing.batch import TraceBatch, TraceRound
from mqgate.tracing.events import Resource
from mqgate.tracing.index import PositionMove, TraceIndex
from mqgate.tracing.index_writer import decode_and_write
from mqgate.tracing.recorder import encode_for_store

GATEWAY = Resource("bench:8080", "bench", "mqgate", 8080)
CONTEXT = f"00-{'1' * 32}-{'2' * 16}-01"


def fill(index: TraceIndex, rounds: int, requests: int, messages: int) -> list[str]:
    every: list[str] = []
    ts, offset, position, pending = 1_700_000_000_000, 0, None, []
    for _ in range(rounds):
        batches = []
        for _ in range(requests):
            ids = new_message_ids(ts, messages)
            ts += 1
            every += ids
            batches.append(
                TraceBatch(
                    kind="batch",
                    hops=["accepted", "stored"],
                    time_ms=ts,
                    last_ms=ts + 1,
                    project="bench",
                    topic="orders",
                    resource=GATEWAY,
                    msg_ids=ids,
                    queue=0,
                    first_offset=offset,
                    producer="bench-p",
                    keys=[[f"k{i}"] for i in ids],
                    traceparent=CONTEXT,
                    bodies=["x" * 100] * messages,
                )
            )
            offset += messages
        pending.append(encode_for_store(TraceRound(kind="round", batches=batches), ts))
        if len(pending) == 500:
            moved = (position or 0) + len(pending)
            decode_and_write(index, pending, {("%TRACE%bench", 0): PositionMove(position, moved)})
            position, pending = moved, []
    if pending:
        moved = (position or 0) + len(pending)
        decode_and_write(index, pending, {("%TRACE%bench", 0): PositionMove(position, moved)})
    return every


def timed(lookup: Callable[[str], object], values: list[str]) -> str:
    ms = []
    for value in values:
        t0 = time.perf_counter()
        assert lookup(value), value
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    return f"p50 {statistics.median(ms):.2f} ms · p99 {ms[int(len(ms) * 0.99)]:.2f} ms · max {ms[-1]:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20_000, help="round records")
    parser.add_argument("--requests", type=int, default=20, help="requests (batches) per round")
    parser.add_argument("--messages", type=int, default=5, help="messages per request")
    parser.add_argument("--lookups", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mqgate-round-bench-") as work:
        index = TraceIndex(f"sqlite:///{work}/trace-index.sqlite")
        index.create_schema()
        t0 = time.perf_counter()
        ids = fill(index, args.rounds, args.requests, args.messages)
        seconds = time.perf_counter() - t0
        size = os.path.getsize(f"{work}/trace-index.sqlite")
        print(f"| messages (events) | {len(ids):,} ({2 * len(ids):,}) |")
        print(f"| fill (encode + index writer path) | {2 * len(ids) / seconds:,.0f} events/s |")
        print(f"| index file | {size / 2**20:,.0f} MiB |")
        sample = random.sample(ids, args.lookups)
        print(f"| lookup by msgId | {timed(lambda m: index.paths(msg_id=m), sample)} |")
        keys = sample[: args.lookups // 4]
        print(f"| lookup by key | {timed(lambda m: index.paths(key=f'k{m}'), keys)} |")
        index.dispose()


if __name__ == "__main__":
    main()
