"""Reading a topic with the `mqgate` Spark source, against Spark reading the same rows from
Parquet (`run.py spark-read`).

Starts one gateway (embedded store, fsync always), produces `--messages` messages of
`--body-bytes` over `--queues` queues (batch produce of 1,000, not timed), then in one
SparkSession (its start not timed) measures, `--repeat` times each, alternating:

  (a) spark.read.format("mqgate") of the whole topic -> write.format("noop")
  (b) spark.read.parquet(the same rows, written once from (a)'s DataFrame) -> write.format("noop")
  (c) the floor of any Python data source: one that yields ready-made Arrow batches of the
      same schema and size (one partition per queue, no I/O, no decoding) -> the same action

The noop sink materialises every column of every row. All read every column (14, the
source's schema). Each figure is rows / wall time of the action, best of the repeats; the
CPU seconds of the gateway, the JVM and the Python workers over the best run are shown (all
processes on the machine share its cores, and other load skews every figure: the load
average at the start is given). The rows are checked: (a) returns every message once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import procs, results
from .servers import Gateway, produce_batches

TOPIC = "spark-bench"
KINDS = {"jvm": "java", "gateway": "serve", "python workers": "pyspark"}


def floor_source() -> Any:
    """A data source of ready-made Arrow batches: what any Python data source costs Spark."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from mqgate.spark.schema import SCHEMA

    class FloorReader(DataSourceReader):
        def __init__(self, rows: int, partitions: int, batch: int, body_bytes: int) -> None:
            self.rows, self.parts, self.batch, self.body_bytes = rows, partitions, batch, body_bytes

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(q) for q in range(self.parts)]

        def read(self, partition: InputPartition) -> Any:
            from mqgate.spark.arrow import Record, to_batch

            size = min(self.batch, self.rows)
            msgs = [
                Record(
                    f"{i:032d}", 1_763_712_000_000 + i, f"{TOPIC}-p", f"{i:012d}".ljust(self.body_bytes, "x")
                )
                for i in range(size)
            ]
            ready = to_batch(TOPIC, "local", partition.value, 0, msgs)
            left = self.rows // self.parts + (partition.value < self.rows % self.parts)
            while left > 0:
                yield ready.slice(0, min(left, size))
                left -= size

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "mqgate-bench-floor"

        def schema(self) -> Any:
            return SCHEMA

        def reader(self, schema: Any) -> DataSourceReader:
            o = self.options
            return FloorReader(int(o["rows"]), int(o["partitions"]), int(o["batch"]), int(o["bodybytes"]))

    return Floor


def timed(action: Any) -> tuple[float, dict[str, float]]:
    """Wall seconds of `action`, and the CPU seconds each kind of process spent meanwhile.
    Python workers that end during the action are not counted (Spark keeps them)."""
    before = procs.cpu_by_kind(os.getpid(), KINDS)
    started = time.perf_counter()
    action()
    wall = time.perf_counter() - started
    after = procs.cpu_by_kind(os.getpid(), KINDS)
    return wall, {k: after[k] - before.get(k, 0.0) for k in after}


def main(args: argparse.Namespace) -> int:
    from mqgate.spark import session as spark_session

    tmp = Path(tempfile.mkdtemp(prefix="mqgate-spark-bench-"))
    gw = Gateway(tmp / "data")
    try:
        gw.start(30)
        gw.post("/admin/topics", {"name": TOPIC, "queues": args.queues})
        token = gw.post("/admin/producers", {"name": f"{TOPIC}-p", "topic": TOPIC})["token"]

        def bodies(first: int, n: int) -> list[dict]:
            return [{"message": f"{first + j:012d}".ljust(args.body_bytes, "x")} for j in range(n)]

        produce_s = produce_batches(
            gw.port, token, f"{TOPIC}-p", args.messages, 1000, conns=1, messages=bodies
        )
        load = os.getloadavg()
        spark = spark_session("spark-read-bench", args.master)
        spark.dataSource.register(floor_source())

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
        rows, distinct = df.count(), df.select("messageId").distinct().count()
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
        m = results.machine(tmp)
    finally:
        gw.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def best(name: str) -> tuple[float, dict[str, float]]:
        return min(runs[name], key=lambda r: r[0])

    def rate(name: str) -> float:
        return args.messages / best(name)[0]

    def note(name: str) -> str:
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in best(name)[1].items() if v >= 0.01)
        return f"runs {', '.join(f'{w:.2f}' for w, _ in runs[name])} s; CPU s in the best: {cpu}"

    ratio, target = (
        rate("mqgate") / rate("parquet"),
        f"target ≥ 0.5 {'✅' if rate('mqgate') / rate('parquet') >= 0.5 else '❌'}",
    )
    rows = [
        results.Row(
            "spark-read",
            f'(a) `format("mqgate")` via the gateway: {args.messages:,} messages, noop sink, best of '
            f"{args.repeat}",
            f"{rate('mqgate'):,.0f} rows/s",
            f"(b) Spark reading the same rows from Parquet: {rate('parquet'):,.0f} rows/s",
            f"{ratio:.2f}",
            f"{target}; a / c {rate('mqgate') / rate('floor'):.2f}",
            note("mqgate"),
        ),
        results.Row(
            "", "(b) `parquet` of the same rows", f"{rate('parquet'):,.0f} rows/s", more=note("parquet")
        ),
        results.Row(
            "",
            "(c) floor: a Python source of ready Arrow batches",
            f"{rate('floor'):,.0f} rows/s",
            ratio=f"{rate('floor') / rate('parquet'):.2f}",
            notes="c / b",
            more=note("floor"),
        ),
    ]
    lines = [
        f"- pyspark {version}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"- data: {args.messages:,} messages of {args.body_bytes} B over {args.queues} queues (produced in "
        f"{produce_s:.1f} s, "
        f"not timed); Spark `{args.master}`, readBatchSize {args.read_batch}; action "
        f'`write.format("noop")` on all 14 '
        "columns",
    ]
    results.record(args, "Spark source read vs Parquet", rows, lines, m=m)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub, common, "spark-read", __doc__, help="the mqgate Spark source vs Spark reading Parquet"
    )
    p.add_argument("--messages", type=int, default=500_000)
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--body-bytes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--read-batch", type=int, default=10_000)
    p.set_defaults(func=main)
