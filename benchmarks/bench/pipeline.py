"""The event pipeline end to end (gateway -> Spark -> PostgreSQL; `run.py pipeline`): key skew
and hot-key isolation.

Starts one gateway (embedded store, fsync always) and uses the machine's PostgreSQL
(127.0.0.1:5432, user postgres; a database of its own, dropped at the end). One SparkSession
serves every run, so the JVM start is not counted. Four runs, each on fresh topics and tables:

  uniform keys, isolation off | uniform keys, isolation on | Zipf(s) keys, off | Zipf(s) keys, on

Each run produces `--events` like events (JSON, one per message; not timed; benchmarks/
zipf_events.py, shared with the tests), then runs the pipeline with --available-now semantics
(`mqgate.pipeline.job.run_pipeline` in-process) and times it from start to "everything
applied" (the hot and retry paths drained, offsets committed), with a sink cost of `--cost-ms`
per event in the workers (N = `--partitions`). Every run checks that PostgreSQL holds exactly
the generated totals per video.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import results
from .common import log
from .servers import Gateway

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


@dataclass
class Result:
    label: str
    zipf: bool
    isolation: bool
    events: int
    seconds: float
    summary: Any
    hottest_share: float
    exact: bool


def one_run(
    args: argparse.Namespace, spark: Any, gw: Gateway, db: str, zipf: bool, isolation: bool, tmp: Path
) -> Result:
    import psycopg
    from zipf_events import generate, produce

    from mqgate.pipeline.config import parse_config
    from mqgate.pipeline.job import run_pipeline

    run_id = uuid.uuid4().hex[:6]
    topic, job = f"likes-{run_id}", f"bench-{run_id}"
    gw.post("/admin/topics", {"name": topic, "queues": args.queues})
    gw.post("/admin/producers", {"name": f"{topic}-p", "topic": topic})
    work = generate(
        args.events, keys=args.keys, zipf_s=args.zipf_s if zipf else None, like_share=1.0, seed=11
    )
    produce(gw.url, gw.token, f"{topic}-p", work.likes)
    raw = {
        "job": {
            "name": job,
            "gateway": gw.url,
            "admin_token": gw.token,
            "checkpoint_dir": str(tmp / job),
            "partitions": args.partitions,
            "tasks": args.tasks,
            "max_messages_per_trigger": args.max_per_trigger,
            "trigger_interval_s": 0.2,
        },
        "events": [
            {
                "type": "like",
                "topic": topic,
                "key": "video_id",
                "table": f"likes_{run_id}",
                "fields": {"user_id": "user_id"},
            }
        ],
        "hot_keys": {"enabled": isolation, "min_count": 50, "load_limit": args.load_limit},
        "sink": {
            "url": f"postgresql://postgres@127.0.0.1:5432/{db}",
            "cost_ms": args.cost_ms,
            "batch_rows": args.batch_rows,
        },
    }
    summary = run_pipeline(parse_config(raw, {}), available_now=True, spark=spark)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{db}") as conn:
        got = dict(conn.execute(f"SELECT key, count(*) FROM likes_{run_id} GROUP BY key").fetchall())
    expected = {key: n for (_, key), n in work.totals.items()}
    label = f"{f'Zipf({args.zipf_s})' if zipf else 'uniform'} keys, isolation {'on' if isolation else 'off'}"
    return Result(
        label,
        zipf,
        isolation,
        work.events,
        summary.seconds,
        summary,
        work.hottest()[1] / work.events,
        got == expected,
    )


CASES = "case|wall time|processing|events/s (wall)|hottest key share|busiest worker (sum over batches)"


def report(
    args: argparse.Namespace, runs: list[Result], master: str, parallelism: int, session_s: float
) -> Any:
    """(header lines, the rows, the table of every case and the verdicts)."""

    def busiest(r: Result) -> float:
        return max(r.summary.report.worker_seconds.values(), default=0.0)

    def mean(zipf: bool, isolation: bool, processing: bool = False) -> float:
        xs = [
            r.summary.processing_s if processing else r.seconds
            for r in runs
            if (r.zipf, r.isolation) == (zipf, isolation)
        ]
        return sum(xs) / len(xs)

    def of(zipf: bool, isolation: bool) -> Result:
        return next(r for r in runs if (r.zipf, r.isolation) == (zipf, isolation))

    lines = [
        f"- Spark master `{master}` (default parallelism {parallelism}), one SparkSession for all runs "
        f"(its start, "
        f"{session_s:.1f} s, is not counted); gateway embedded store, fsync always",
        f"- workload: {args.events:,} like events (JSON, one per message, {args.queues} queues), "
        f"{args.keys:,} videos; "
        f"N = {args.partitions} workers, sink cost {args.cost_ms:g} ms/event, {args.batch_rows} rows per "
        f"transaction, "
        f"hot_keys.load_limit {args.load_limit}",
        "- wall time: pipeline start (setup, queries started) → all applied and committed, hot and retry "
        "paths drained; "
        "processing: first micro-batch with events → the same end",
    ]
    table = [
        [
            r.label,
            f"{r.seconds:.1f} s",
            f"{r.summary.processing_s:.1f} s",
            f"{r.events / r.seconds:,.0f}",
            f"{r.hottest_share:.1%}",
            f"{busiest(r):.1f} s",
            f"{r.summary.report.moved_hot:,}",
            "yes" if r.exact else "NO",
        ]
        for r in runs
    ]
    after = [*results.table([*CASES.split("|"), "to hot topic", "exact"], table, {1, 2, 3, 4, 5, 6}), ""]
    exact = "every run exact" if all(r.exact for r in runs) else "NOT every run exact"
    z, on, off = mean(True, False) / mean(True, True), of(True, True), of(True, False)
    rows = [
        results.Row(
            f"pipeline.{args.events}.zipf",
            f"event pipeline, {args.events:,} events, Zipf({args.zipf_s}) keys, N = "
            f"{args.partitions}, sink {args.cost_ms:g} ms/event: wall time with hot-key isolation",
            f"{mean(True, True):.1f} s",
            f"isolation off: {mean(True, False):.1f} s",
            f"{z:.2f}x less",
            f"processing {mean(True, False, True) / mean(True, True, True):.2f}x less (target ≥ 3x "
            f"{'✅' if z >= 3 else '❌'}); "
            f"hottest key {on.hottest_share:.1%}; busiest worker {busiest(off):.1f} → {busiest(on):.1f} s; "
            f"{on.summary.report.moved_hot:,} to the hot topic; {exact}",
        )
    ]
    if any(not r.zipf for r in runs):
        for processing, what in ((False, "wall time"), (True, "processing time")):
            z = mean(True, False, processing) / mean(True, True, processing)
            u = mean(False, True, processing) / mean(False, False, processing)
            after.append(
                f"- {what}: isolation under Zipf({args.zipf_s}) takes {z:.2f}x less (target ≥ 3x "
                f"{'✅' if z >= 3 else '❌'}); uniform keys, isolation on / off = {u:.2f} (target: no slower "
                f"{'✅' if u <= 1.05 else '❌'})"
            )
        rows.append(
            results.Row(
                f"pipeline.{args.events}.uniform",
                f"event pipeline, {args.events:,} events, uniform keys: wall time with isolation on",
                f"{mean(False, True):.1f} s",
                f"isolation off: {mean(False, False):.1f} s",
                f"{mean(False, True) / mean(False, False):.2f}",
                f"on / off (target: no slower); busiest worker "
                f"{busiest(of(False, False)):.1f} / {busiest(of(False, True)):.1f} s",
            )
        )
    return lines, rows, after


def main(args: argparse.Namespace) -> int:
    import psycopg

    from mqgate.spark import session as spark_session

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s"
    )
    for chatty in ("httpx", "py4j"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="mqgate-pipeline-bench-"))
    db = f"mqgate_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    gw = Gateway(tmp / "data")
    gw.start(30)
    spark, runs = None, []
    try:
        t0 = time.monotonic()
        spark = spark_session("mqgate-pipeline-bench", master=args.master)
        session_s = time.monotonic() - t0
        # Warm-up: Python workers started and modules imported before anything is timed.
        one_run(argparse.Namespace(**{**vars(args), "events": 2000}), spark, gw, db, True, True, tmp)
        cases = (
            [(True, False), (True, True)]
            if args.only_zipf
            else [(z, i) for z in (False, True) for i in (False, True)]
        )
        for _ in range(args.repeat):
            for zipf, isolation in cases:
                r = one_run(args, spark, gw, db, zipf, isolation, tmp)
                log(f"{r.label}: {r.events} events in {r.seconds:.1f}s, exact={r.exact}")
                runs.append(r)
        master, parallelism = spark.sparkContext.master, spark.sparkContext.defaultParallelism
        m = results.machine(tmp)
    finally:
        if spark is not None:
            spark.stop()
        gw.stop()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {db} WITH (FORCE)")
        shutil.rmtree(tmp, ignore_errors=True)
    lines, rows, after = report(args, runs, master, parallelism, session_s)
    results.record(args, "event pipeline (Spark), skew and hot-key isolation", rows, lines, after, m)
    return 0 if all(r.exact for r in runs) else 1


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub,
        common,
        "pipeline",
        __doc__,
        help="the event pipeline gateway → Spark → PostgreSQL: skew, hot-key isolation",
    )
    p.add_argument("--events", type=int, default=40_000)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--zipf-s", type=float, default=1.2)
    p.add_argument("--partitions", type=int, default=16)
    p.add_argument("--tasks", type=int, default=0, help="Spark tasks for the N workers (0: automatic)")
    p.add_argument("--cost-ms", type=float, default=1.0)
    p.add_argument("--load-limit", type=float, default=1.1, help="hot_keys.load_limit")
    p.add_argument("--batch-rows", type=int, default=200)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--max-per-trigger", type=int, default=100_000)
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument("--repeat", type=int, default=1, help="run the four cases this many times")
    p.add_argument("--verbose", action="store_true", help="the pipeline's batch log on stderr")
    p.add_argument("--only-zipf", action="store_true", help="skip the uniform-key runs")
    p.set_defaults(func=main)
