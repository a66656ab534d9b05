"""Reading a topic with the `mqgate` Spark source, against Spark reading the same rows from Parquet.

    .venv/bin/python benchmarks/spark_read_bench.py [--messages 500000] [--queues 8]
        [--body-bytes 100] [--repeat 3] [--master local[*]] [--read-batch 10000]

Starts one `mqgate serve` (embedded store, fsync always) on a free loopback port, produces
`--messages` messages of `--body-bytes` over `--queues` queues (batch produce of 1,000, not
timed), then in one SparkSession (its start not timed) measures, `--repeat` times each,
alternating:

  (a) spark.read.format("mqgate") of the whole topic -> write.format("noop")
  (b) spark.read.parquet(the same rows, written once from (a)'s DataFrame) -> write.format("noop")
  (c) the floor of any Python data source: one that yields ready-made Arrow batches of the
      same schema and size (one partition per queue, no I/O, no decoding) -> the same action

The noop sink materialises every column of every row. All read every column (14, the
source's schema). Each figure is rows / wall time of the action, best of the repeats; the
CPU seconds of the gateway, the JVM and the Python workers over the best run are shown
(all processes on the machine share its cores, and other load skews every figure: the
load average at the start is printed). The rows are checked: (a) returns every message once.
Prints a Markdown section for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(ROOT / "src")]

from bench_gateway import Gateway  # noqa: E402
from machine_info import machine  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402

import mqgate.spark  # noqa: E402
from mqgate.spark.schema import SCHEMA  # noqa: E402

TOPIC = "spark-bench"


class _FloorReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, batch: int, body_bytes: int) -> None:
        self.rows, self.parts, self.batch, self.body_bytes = rows, partitions, batch, body_bytes

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(q) for q in range(self.parts)]

    def read(self, partition: InputPartition) -> Any:
        from mqgate.spark.arrow import Record, to_batch

        size = min(self.batch, self.rows)
        msgs = [
            Record(f"{i:032d}", 1_763_712_000_000 + i, f"{TOPIC}-p", f"{i:012d}".ljust(self.body_bytes, "x"))
            for i in range(size)
        ]
        ready = to_batch(TOPIC, "local", partition.value, 0, msgs)
        left = self.rows // self.parts + (partition.value < self.rows % self.parts)
        while left > 0:
            yield ready.slice(0, min(left, size))
            left -= size


class Floor(DataSource):
    """Ready-made Arrow batches: what any Python data source costs Spark and PySpark."""

    @classmethod
    def name(cls) -> str:
        return "mqgate-bench-floor"

    def schema(self) -> Any:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        o = self.options
        return _FloorReader(int(o["rows"]), int(o["partitions"]), int(o["batch"]), int(o["bodybytes"]))


def process_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of `root`'s descendants, by kind (jvm, python workers, gateway)."""
    procs: dict[int, tuple[int, str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (p / "cmdline").read_bytes()[:200]
            except OSError:
                continue
            procs[int(p.name)] = (
                int(fields[1]),
                cmd.decode(errors="replace"),
                (int(fields[11]) + int(fields[12])) / tick,
            )
    mine, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    out = {"jvm": 0.0, "python workers": 0.0, "gateway": 0.0}
    for pid in mine - {root}:
        _, cmd, cpu = procs[pid]
        if "java" in cmd:
            out["jvm"] += cpu
        elif "mqgate" in cmd and "serve" in cmd:
            out["gateway"] += cpu
        elif "pyspark" in cmd:
            out["python workers"] += cpu
    return out


def fill(gw: Gateway, messages: int, queues: int, body_bytes: int) -> float:
    gw.post("/admin/topics", {"name": TOPIC, "queues": queues})
    gw.post("/admin/producers", {"name": f"{TOPIC}-p", "topic": TOPIC})
    started = time.perf_counter()
    for i in range(0, messages, 1000):
        n = min(1000, messages - i)
        batch = [{"message": f"{i + j:012d}".ljust(body_bytes, "x")} for j in range(n)]
        gw.post("/mq/produce/batch", {"producer": f"{TOPIC}-p", "messages": batch})
    return time.perf_counter() - started


def timed(action: Any) -> tuple[float, dict[str, float]]:
    """Wall seconds of `action`, and the CPU seconds each kind of process spent meanwhile.
    Python workers that end during the action are not counted (Spark keeps them)."""
    before = process_cpu(os.getpid())
    started = time.perf_counter()
    action()
    wall = time.perf_counter() - started
    after = process_cpu(os.getpid())
    return wall, {k: after[k] - before.get(k, 0.0) for k in after}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--body-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--read-batch", type=int, default=10_000)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mqgate-spark-bench-"))
    gw = Gateway(tmp)
    try:
        produce_s = fill(gw, args.messages, args.queues, args.body_bytes)
        load = os.getloadavg()
        spark = mqgate.spark.session("spark-read-bench", args.master)
        spark.dataSource.register(Floor)

        def source() -> Any:
            return (
                spark.read.format("mqgate")
                .option("gateway", gw.url)
                .option("token", gw.token)
                .option("topic", TOPIC)
                .option("readBatchSize", args.read_batch)
                .load()
            )

        parquet = str(tmp / "rows.parquet")
        source().write.parquet(parquet)  # also warms the JVM and the Python workers up
        df = source()
        rows = df.count()
        distinct = df.select("messageId").distinct().count()
        if rows != args.messages or distinct != rows:
            raise SystemExit(f"the source read {rows} rows ({distinct} distinct), expected {args.messages}")
        spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()

        floor = (
            spark.read.format("mqgate-bench-floor")
            .option("rows", args.messages)
            .option("partitions", args.queues)
            .option("batch", args.read_batch)
            .option("bodyBytes", args.body_bytes)
        )
        actions = {
            "mqgate": lambda: source().write.format("noop").mode("overwrite").save(),
            "parquet": lambda: spark.read.parquet(parquet).write.format("noop").mode("overwrite").save(),
            "floor": lambda: floor.load().write.format("noop").mode("overwrite").save(),
        }
        actions["floor"]()
        runs: dict[str, list[tuple[float, dict[str, float]]]] = {k: [] for k in actions}
        for _ in range(args.repeat):
            for name, action in actions.items():
                runs[name].append(timed(action))
        version = spark.version
        spark.stop()
    finally:
        gw.stop()

    m = machine(tmp, Path(sys.executable))
    shutil.rmtree(tmp, ignore_errors=True)

    def best(name: str) -> tuple[float, dict[str, float]]:
        return min(runs[name], key=lambda r: r[0])

    def rate(name: str) -> float:
        return args.messages / best(name)[0]

    def note(name: str) -> str:
        walls = ", ".join(f"{w:.2f}" for w, _ in runs[name])
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in best(name)[1].items() if v >= 0.01)
        return f"runs {walls} s; CPU s in the best: {cpu}"

    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ratio = rate("mqgate") / rate("parquet")
    lines = [
        f"## {now} — Spark source read vs Parquet",
        "",
        f"- command: `python benchmarks/spark_read_bench.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, kernel {m['kernel']}, "
        f"data dir on {m['fs']}; gateway, Spark driver and workers on the same machine "
        f"(load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
        f"- software: {m['python']}; pyspark {version}",
        f"- code: git {m['git']}, src/mqgate sha1 {m['src_sha1']}",
        f"- data: {args.messages:,} messages of {args.body_bytes} B over {args.queues} queues "
        f"(produced in {produce_s:.1f} s, not timed); Spark `{args.master}`, readBatchSize "
        f'{args.read_batch}; action `write.format("noop")` on all 14 columns, best of {args.repeat}',
        "",
        "| # | read | rows/s | note |",
        "|---|---|---:|---|",
        f'| a | `format("mqgate")` via the gateway | {rate("mqgate"):,.0f} | {note("mqgate")} |',
        f"| b | `parquet` of the same rows | {rate('parquet'):,.0f} | {note('parquet')} |",
        f"| c | floor: Python source of ready Arrow batches | {rate('floor'):,.0f} | {note('floor')} |",
        f"| | ratio a / b | {ratio:.2f} | target >= 0.5 {'✅' if ratio >= 0.5 else '❌'}; "
        f"floor c / b {rate('floor') / rate('parquet'):.2f}, a / c {rate('mqgate') / rate('floor'):.2f} |",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
