"""Trace analytics on Spark (issue 14; `run.py analytics`): events per second of the job on
local[*], cold and incremental, against DuckDB computing the same aggregates over the same
Parquet.

1. The generator (mqgate.analytics.generator, the tests' ground truth) writes an 8-hour
   load-test trace as raw trace records (what the `mqgate` source gives: topic, queue,
   offset, timestamp, JSON body) to Parquet, split in time: the first `--events` records,
   then `--incremental` more.
2. Cold: the input stage (parse the JSON, write the dataset partitioned by date and project,
   compact) over the first part, then every report section, each timed.
3. Incremental: the input stage over the second part only (the dataset keeps the first),
   then the report again over everything.
4. Baseline: DuckDB over the same Parquet dataset computing the same aggregates (counts,
   rates per minute, capacity per minute, per-message latency with percentiles, error groups).
5. The report's rendering (plots + HTML + JSON, with the queue fault timeline of the load's
   queue state) and the sizes of its files.
6. The queue fault timeline alone (mqgate.analytics.queuefaults, no Spark) over the load's
   queue state history for `--queue-state-hours` (default 168: a week of 1-minute intervals),
   written to SQLite and read back as the job reads it.

Reading through a gateway is not part of this run: its speed is `run.py spark-read`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from . import results

EVENTS_PER_MESSAGE = 3.95  # what the generator's model gives, on average


def write_raw(events: int, incremental: int, work: Path) -> tuple[Path, Path, int, int, float]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqgate.analytics.generator import LoadSpec, generate
    from mqgate.analytics.tracefile import RAW_SCHEMA, raw_batches

    started = time.perf_counter()
    trace = generate(LoadSpec(messages=int((events + incremental) / EVENTS_PER_MESSAGE) + 1))
    cut = int(np.sort(trace.events.time)[min(events, len(trace.events)) - 1]) + 1
    cold, more = work / "raw-cold.parquet", work / "raw-incremental.parquet"
    counts = [0, 0]
    with pq.ParquetWriter(cold, RAW_SCHEMA) as w0, pq.ParquetWriter(more, RAW_SCHEMA) as w1:
        for batch in raw_batches(trace, 1_000_000):
            t = pa.Table.from_batches([batch])
            early = pa.compute.less(t.column("timestamp"), pa.scalar(cut, pa.timestamp("ms", tz="UTC")))
            for i, (writer, part) in enumerate(
                ((w0, t.filter(early)), (w1, t.filter(pa.compute.invert(early))))
            ):
                if part.num_rows:
                    writer.write_table(part)
                    counts[i] += part.num_rows
    return cold, more, counts[0], counts[1], time.perf_counter() - started


def timed_report(spark: Any, out: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """The report's sections one by one (as job.build_report computes them), each timed."""
    from mqgate.analytics import errors, latency, reports
    from mqgate.analytics.reports import Window

    times: dict[str, float] = {}
    report: dict[str, Any] = {"window": Window().describe(), "notes": [], "generated": "bench"}

    def section(name: str, call: Any) -> None:
        t = time.perf_counter()
        report[name] = call()
        times[name] = time.perf_counter() - t

    df = reports.load_events(spark, out, Window())
    section("malformed", lambda: reports.malformed(spark, out, Window()))
    section("counts", lambda: reports.counts(df))
    section("rates", lambda: reports.rates(df))
    section("capacity", lambda: reports.capacity(df))
    section("latency", lambda: latency.latency(df, 20))
    section("errors", lambda: errors.errors(df, 10))
    report["findings"] = errors.findings(report["errors"], report["latency"])
    return report, times


def duckdb_baseline(events_root: Path, threads: int) -> dict[str, float]:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    src = f"read_parquet('{events_root}/*/*/*.parquet', hive_partitioning = true)"
    queries = {
        "counts": f"SELECT project, hop, status, count(*) FROM {src} GROUP BY ALL",
        "rates": f"""SELECT project, floor(timeMs / 60000) AS minute,
            CASE WHEN status = 'error' THEN 'errors' ELSE hop END AS s, count(*)
            FROM {src} WHERE status = 'error' OR hop IN ('accepted', 'delivered', 'acked') GROUP BY ALL""",
        "capacity": f"""SELECT role, name, minute, count(*) FROM (
            SELECT 'producer' AS role, producer AS name, floor(timeMs / 60000) AS minute
                FROM {src} WHERE hop = 'accepted'
            UNION ALL SELECT 'consumer', consumer, floor(timeMs / 60000) FROM {src} WHERE hop = 'acked'
            UNION ALL SELECT 'client', clientId, floor(timeMs / 60000) FROM {src} WHERE hop = 'acked'
            UNION ALL SELECT 'gateway', gatewayId, floor(timeMs / 60000) FROM {src}
                WHERE hop IN ('accepted', 'delivered', 'acked')) WHERE name IS NOT NULL GROUP BY ALL""",
        "latency": f"""WITH m AS (SELECT project, topic, msgId,
                min(timeMs) FILTER (hop = 'accepted') AS a, min(timeMs) FILTER (hop = 'stored') AS s,
                min(timeMs) FILTER (hop = 'delivered') AS d1, max(timeMs) FILTER (hop = 'delivered') AS dn,
                max(timeMs) FILTER (hop = 'acked') AS k,
                first(consumer) FILTER (consumer IS NOT NULL) AS consumer,
                max(clientId) FILTER (hop = 'acked') AS client
              FROM {src} GROUP BY ALL),
            l AS (SELECT *, s - a AS store, d1 - s AS deliver, k - dn AS process, k - a AS e2e FROM m)
            SELECT project, topic, consumer,
              approx_quantile(store, [0.5, 0.9, 0.99]), max(store), count(store),
              approx_quantile(deliver, [0.5, 0.9, 0.99]), max(deliver), count(deliver),
              approx_quantile(process, [0.5, 0.9, 0.99]), max(process), count(process),
              approx_quantile(e2e, [0.5, 0.9, 0.99]), max(e2e), count(e2e),
              (SELECT list(msgId ORDER BY e2e DESC, msgId) FROM (
                 SELECT msgId, e2e FROM l WHERE e2e IS NOT NULL
                 ORDER BY e2e DESC, msgId LIMIT 20))
            FROM l GROUP BY ALL""",
        "errors": f"""SELECT coalesce(errorType, hop), coalesce(errorNode, gatewayId),
              coalesce(consumer, producer, service), project, topic, queue, count(*), min(timeMs), max(timeMs)
            FROM {src} WHERE status = 'error' GROUP BY ALL""",
    }
    times: dict[str, float] = {}
    for name, sql in queries.items():
        t = time.perf_counter()
        con.execute(sql).fetchall()
        times[name] = time.perf_counter() - t
    con.close()
    return times


def queue_fault_figures(work: Path, hours: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The timeline over `hours` of the load's queue state: (the section, its timings)."""
    from mqgate.analytics import queuefaults
    from mqgate.analytics.generator import LoadSpec
    from mqgate.analytics.queuestate_load import queue_state_rows
    from mqgate.analytics.queuestate_source import HistorySource
    from mqgate.queuestate.diagnosis import Thresholds
    from mqgate.queuestate.history import QueueStateHistory

    spec = LoadSpec(hours=hours)
    rows = queue_state_rows(spec)
    history = QueueStateHistory(work / "queue-state.sqlite")
    history.create_schema()
    t = time.perf_counter()
    history.write(rows)
    write_s = time.perf_counter() - t
    history.dispose()
    source = HistorySource(str(work / "queue-state.sqlite"))
    t = time.perf_counter()
    section = queuefaults.section(source, None, spec.start_ms, spec.end_ms, Thresholds())
    judge_s = time.perf_counter() - t
    source.close()
    intervals = sum(len(tl["intervals"]) for tl in section["projects"].values())
    return section, {
        "rows": len(rows),
        "intervals": intervals,
        "writeS": round(write_s, 2),
        "readAndJudgeS": round(judge_s, 2),
        "intervalsPerS": round(intervals / judge_s),
    }


def main(args: argparse.Namespace) -> int:
    from mqgate.analytics.ingest import ingest_frame
    from mqgate.analytics.job import start_spark
    from mqgate.analytics.plots import plots
    from mqgate.analytics.render import write_report

    incremental = args.incremental if args.incremental is not None else args.events // 10
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    out = args.work / "out"
    cold, more, n_cold, n_more, gen_s = write_raw(args.events, incremental, args.work)
    print(f"generated {n_cold:,} + {n_more:,} raw records in {gen_s:.1f}s", flush=True)
    t = time.perf_counter()
    conf = {
        "spark.driver.memory": args.driver_memory,
        "spark.sql.shuffle.partitions": str(2 * (os.cpu_count() or 2)),
    }
    spark = start_spark(args.master, conf)
    r: dict[str, Any] = {
        "events": n_cold,
        "incrementalEvents": n_more,
        "cores": os.cpu_count(),
        "sparkStartS": time.perf_counter() - t,
    }
    for phase, path, n in (("cold", cold, n_cold), ("incremental", more, n_more)):
        t = time.perf_counter()
        stats = ingest_frame(spark.read.parquet(str(path)), out)
        ingest_s = time.perf_counter() - t
        report, sections = timed_report(spark, out)
        report_s = sum(sections.values())
        total_events = report["counts"]["total"]["events"]
        r[phase] = {
            "recordsRead": n,
            "eventsWritten": stats.events,
            "malformed": stats.malformed,
            "ingestS": round(ingest_s, 2),
            "ingestEventsPerS": round(n / ingest_s),
            "reportS": round(report_s, 2),
            "reportEventsPerS": round(total_events / report_s),
            "jobS": round(ingest_s + report_s, 2),
            "jobEventsPerS(new events / (ingest + report))": round(n / (ingest_s + report_s)),
            "reportSections": {k: round(v, 2) for k, v in sections.items()},
            "datasetEvents": total_events,
        }
        print(phase, json.dumps(r[phase], indent=1), flush=True)
    spark.stop()
    threads = os.cpu_count() or 2
    duck_times = duckdb_baseline(out / "events", threads)
    duck_s = sum(duck_times.values())
    spark_same = sum(v for k, v in r["incremental"]["reportSections"].items() if k != "malformed")
    r["duckdb"] = {
        "threads": threads,
        "sections": {k: round(v, 2) for k, v in duck_times.items()},
        "totalS": round(duck_s, 2),
        "eventsPerS": round(r["incremental"]["datasetEvents"] / duck_s),
        "sparkOverDuckdb": round(spark_same / duck_s, 2),
    }
    report["queueFaults"], r["queueFaults"] = queue_fault_figures(args.work, args.queue_state_hours)
    t = time.perf_counter()
    svgs = plots(report)
    html_path, json_path = write_report(report, svgs, out, "http://127.0.0.1:8080/admin/traces?msgId=")
    r["render"] = {
        "seconds": round(time.perf_counter() - t, 2),
        "htmlBytes": html_path.stat().st_size,
        "jsonBytes": json_path.stat().st_size,
        "plots": len(svgs),
    }
    r["datasetBytes"] = sum(f.stat().st_size for f in (out / "events").rglob("*.parquet"))
    (args.work / "results.json").write_text(json.dumps(r, indent=1))
    c, i = r["cold"], r["incremental"]
    per_event = r["datasetBytes"] / max(1, i["datasetEvents"])
    rows = [
        results.Row(
            "analytics.cold",
            f"trace analytics on Spark, cold job over {n_cold:,} events (input stage + report)",
            f"{c['jobEventsPerS(new events / (ingest + report))']:,} events/s",
            notes=f"input stage {c['ingestEventsPerS']:,} events/s; incremental input "
            f"{i['ingestEventsPerS']:,}/s",
        ),
        results.Row(
            "analytics.report",
            f"the report over {i['datasetEvents']:,} events in Spark",
            f"{spark_same:.2f} s",
            f"DuckDB, same aggregates, same Parquet: {duck_s:.2f} s",
            f"{duck_s / spark_same:.2f}",
            f"render {r['render']['seconds']:.2f} s; {per_event:.1f} bytes per event",
        ),
    ]
    lines = [
        f"- Spark `{args.master}`, driver memory {args.driver_memory}; work dir {args.work} (results.json "
        f"there)"
    ]
    after = ["```json", json.dumps(r, indent=1), "```"]
    results.record(
        args, "trace analytics on Spark vs DuckDB (issue 14)", rows, lines, after, results.machine(args.work)
    )
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "analytics", __doc__, help="trace analytics on Spark, cold and incremental, vs DuckDB"
    )
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--incremental", type=int, default=None, help="default: a tenth of --events")
    p.add_argument("--work", type=Path, default=Path("/tmp/mqgate-analytics-bench"))
    p.add_argument("--master", default="local[*]")
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--queue-state-hours", type=int, default=168)
    p.set_defaults(func=main)
