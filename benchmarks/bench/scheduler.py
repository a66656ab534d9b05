"""The embedded scheduler in-process (`run.py scheduler`): schedule rate, memory, recovery
time, compaction. One process, one event loop, fsync=always through the group commit:

1. hold `--count` messages in batches of `--batch` (one destination each, start times spread
   over the next hour, priorities 0..9, `--payload` bytes); memory per held message is the RSS
   growth over the phase divided by the count (after a full collection);
2. single holds: `--singles` holds of one message, one task (one fsync each) and `--tasks`
   concurrent tasks (sharing fsyncs through the group commit);
3. recovery of the compacted live set: close, reopen, time until `open` returns (`--reopens`
   times, the median is reported);
4. settle 30% of the messages (delete records; the log stays under the 2x compaction trigger),
   close, reopen: recovery of a log with garbage, log size before and after;
5. claim: every destination claimed in batches of 1000 (the delivery loop's side), then
   settling another 40% in batches, which triggers an online compaction: its duration and the
   longest event-loop stall while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import results
from .procs import rss_bytes
from .store import run_async

HOUR_MS = 3600 * 1000


def make_items(rng: random.Random, n: int, now_ms: int, payload: bytes) -> list[tuple[bytes, list[Any]]]:
    from mqgate.scheduler.interface import Destination

    return [
        (
            payload,
            [
                Destination(
                    "topic:orders", now_ms + rng.randrange(HOUR_MS), now_ms + 2 * HOUR_MS, rng.randrange(10)
                )
            ],
        )
        for _ in range(n)
    ]


class StallMeter:
    """The longest gap between ticks of a 1 ms ticker: how long the event loop was blocked."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last - 0.001)
            last = now

    def __enter__(self) -> StallMeter:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def reopen(directory: Path, committer: Any) -> tuple[Any, float]:
    """Open after the caller closed and dropped the old instance (so its memory is free)."""
    from mqgate.scheduler.backends.embedded import EmbeddedScheduler

    gc.collect()
    s = EmbeddedScheduler(directory, committer)
    t0 = time.perf_counter()
    await s.open()
    return s, time.perf_counter() - t0


async def run(args: argparse.Namespace) -> dict:
    from mqgate.durable.group_commit import GroupCommitter

    directory = Path(args.data_dir or tempfile.mkdtemp(prefix="sched-bench-")) / "scheduler"
    shutil.rmtree(directory, ignore_errors=True)
    rng = random.Random(7)
    payload = b"p" * args.payload
    now_ms = int(time.time() * 1000)
    out: dict = {"count": args.count, "batch": args.batch, "payload_bytes": args.payload}
    out["load_average_at_start"] = os.getloadavg()[0]  # other work on the machine skews timings
    committer = GroupCommitter(None)
    committer.start()
    s, _ = await reopen(directory, committer)

    # 1. batched holds, and memory
    gc.collect()
    rss0 = rss_bytes()
    hold_s = 0.0
    seqs: list[int] = []
    for start in range(0, args.count, args.batch):
        items = make_items(rng, min(args.batch, args.count - start), now_ms, payload)
        t0 = time.perf_counter()
        seqs += await s.hold(items)
        hold_s += time.perf_counter() - t0
    gc.collect()
    out["hold_batch_per_s"] = args.count / hold_s
    out["rss_per_message_bytes"] = (rss_bytes() - rss0 - 8 * len(seqs)) / args.count  # minus `seqs`
    out["log_bytes_after_holds"] = (await s.stats()).log_bytes

    # 2. single holds
    singles = make_items(rng, args.singles, now_ms, payload)
    t0 = time.perf_counter()
    for item in singles:
        seqs += await s.hold([item])
    out["hold_single_1task_per_s"] = args.singles / (time.perf_counter() - t0)
    per_task = args.singles // args.tasks

    async def holder() -> list[int]:
        got = []
        for item in make_items(rng, per_task, now_ms, payload):
            got += await s.hold([item])
        return got

    t0 = time.perf_counter()
    for got in await asyncio.gather(*(holder() for _ in range(args.tasks))):
        seqs += got
    out["hold_single_tasks_per_s"] = per_task * args.tasks / (time.perf_counter() - t0)

    # 3. recovery of a compact log
    runs = []
    for _ in range(args.reopens):
        await s.close()
        del s
        s, took = await reopen(directory, committer)
        runs.append(took)
    out["recovery_compact_runs_s"] = runs
    out["recovery_compact_s"] = sorted(runs)[len(runs) // 2]
    held = (await s.stats()).held_messages

    # 4. settle 30%, recovery of a log with garbage
    rng.shuffle(seqs)
    cut = int(len(seqs) * 0.3)
    t0 = time.perf_counter()
    for i in range(0, cut, args.batch):
        await s.settle([(q, 0) for q in seqs[i : min(i + args.batch, cut)]])
    out["settle_per_s"] = cut / (time.perf_counter() - t0)
    before = await s.stats()
    await s.close()
    del s
    s, out["recovery_garbage_s"] = await reopen(directory, committer)
    after = await s.stats()
    out["garbage_log"] = {
        "records_before": before.log_records,
        "bytes_before": before.log_bytes,
        "records_after": after.log_records,
        "bytes_after": after.log_bytes,
        "live": after.held_messages,
    }
    assert after.held_messages == held - cut, (after.held_messages, held, cut)

    # 5. claims, then settles that trigger an online compaction
    t0 = time.perf_counter()
    claimed = 0
    while batch := await s.claim_due(now_ms + 3 * HOUR_MS, 1000, 60_000):
        claimed += len(batch)
    out["claim_per_s"] = claimed / (time.perf_counter() - t0)
    rest = seqs[cut : cut + int(len(seqs) * 0.4)]
    with StallMeter() as meter:
        t0 = time.perf_counter()
        for i in range(0, len(rest), args.batch):
            await s.settle([(q, 0) for q in rest[i : i + args.batch]])
        task = s._compaction
        if task is not None:
            await task
        online_s = time.perf_counter() - t0
    final = await s.stats()
    out["online_compaction"] = {
        "triggered": task is not None,
        "settle_and_compact_s": online_s,
        "worst_loop_stall_ms": meter.worst * 1000,
        "records_after": final.log_records,
        "bytes_after": final.log_bytes,
        "live": final.held_messages,
    }
    await s.close()
    await committer.stop()
    if not args.data_dir:
        shutil.rmtree(directory.parent, ignore_errors=True)
    return out


def main(args: argparse.Namespace) -> int:
    r = run_async(run(args))
    g, o, mb = r["garbage_log"], r["online_compaction"], 1024 * 1024
    reopens = ", ".join(f"{x:.2f}" for x in r["recovery_compact_runs_s"])
    compaction = "triggered" if o["triggered"] else "NOT triggered"
    rows = [
        results.Row(
            "scheduler.hold",
            f"hold {r['count']:,} messages ({r['payload_bytes']} B, 1 destination), batches of {r['batch']}",
            f"{r['hold_batch_per_s']:,.0f} holds/s",
            notes=f"{r['rss_per_message_bytes']:,.0f} B of memory per held message (RSS delta / N)",
            more=f"load average at start {r['load_average_at_start']:.2f}",
        ),
        results.Row("", "hold, single, 1 task", f"{r['hold_single_1task_per_s']:,.0f} holds/s"),
        results.Row("", "hold, single, concurrent tasks", f"{r['hold_single_tasks_per_s']:,.0f} holds/s"),
        results.Row(
            "scheduler.recovery",
            f"reopen with {r['count']:,} held (compact log), median",
            f"{r['recovery_compact_s']:.2f} s",
            notes=f"runs: {reopens}",
        ),
        results.Row("", "settle, batches", f"{r['settle_per_s']:,.0f} destinations/s"),
        results.Row(
            "",
            "recovery, log with 30% deleted",
            f"{r['recovery_garbage_s']:.2f} s",
            notes=f"log {g['records_before']:,} rec / {g['bytes_before'] / mb:.1f} MiB → "
            f"{g['records_after']:,} rec / "
            f"{g['bytes_after'] / mb:.1f} MiB ({g['live']:,} live)",
        ),
        results.Row("", "claim_due, batches of 1000", f"{r['claim_per_s']:,.0f} destinations/s"),
        results.Row(
            "",
            "online compaction (settle 40% + compaction)",
            f"{o['settle_and_compact_s']:.2f} s",
            notes=f"{compaction}; worst loop stall {o['worst_loop_stall_ms']:.0f} ms → "
            f"{o['records_after']:,} rec / "
            f"{o['bytes_after'] / mb:.1f} MiB",
        ),
    ]
    after = ["```json", json.dumps(r, indent=2), "```"] if args.json else []
    results.record(args, "the embedded scheduler in-process", rows, after=after)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub,
        common,
        "scheduler",
        __doc__,
        help="the embedded scheduler in-process: holds, memory, recovery, compaction",
    )
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--singles", type=int, default=5000)
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--data-dir", default="")
    p.add_argument("--reopens", type=int, default=3, help="recoveries of the compact log (median)")
    p.add_argument("--json", action="store_true", help="the raw numbers too")
    p.set_defaults(func=main)
