"""The dataset across runs: a rerun adds only new records, a replayed batch is counted once
after compaction, and many small runs are compacted into few files per partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqgate.analytics import truth as truth_mod
from mqgate.analytics.generator import LoadSpec, generate
from mqgate.analytics.ingest import compact, data_files, ingest_frame, partition_dir
from mqgate.analytics.job import build_report
from mqgate.analytics.reports import Window, counts, load_events
from tests.analytics.conftest import write_raw

pytestmark = pytest.mark.slow


def test_runs_over_parts_of_the_input_add_up_and_a_replay_is_dropped_by_compaction(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    trace = generate(LoadSpec(messages=4_000, seed=7, malformed=0))
    raw = spark.read.parquet(str(write_raw(trace, tmp_path / "raw.parquet")))
    out = tmp_path / "out"
    # Ten runs, each over the next slice of every queue's offsets (what a consumer group gives).
    bounds = [(k * 600, (k + 1) * 600) for k in range(4)] + [(2400, 1 << 40)]
    written = 0
    for lo, hi in bounds:
        part = raw.where((F.col("offset") >= lo) & (F.col("offset") < hi))
        written += ingest_frame(part, out, compact_after=False).events
    assert written == len(trace.events)
    partitions = {(p.parent.name[5:], p.name[8:]) for p in (out / "events").glob("date=*/project=*")}
    assert len(partitions) == 4  # two dates (the run crosses midnight) x two projects
    files = {dp: len(data_files(partition_dir(out, *dp))) for dp in partitions}
    assert max(files.values()) > 2
    # Only partitions over the limit are rewritten, each into one file (they are small).
    assert compact(spark, out, partitions, max_files=2) == sum(1 for n in files.values() if n > 2)
    assert all(len(data_files(partition_dir(out, *dp))) <= 2 for dp in partitions)
    # A replayed batch (written twice): counted twice until compaction drops the copies.
    ingest_frame(raw.where(F.col("offset") < 600), out, compact_after=False)
    df = load_events(spark, out, Window())
    assert df is not None and counts(df)["total"]["events"] > len(trace.events)
    assert compact(spark, out, partitions, force=True) == 4
    for d, p in partitions:
        assert len(data_files(partition_dir(out, d, p))) == 1
    report = build_report(spark, out, Window())
    assert report["counts"]["total"] == truth_mod.compute(trace).counts["all"]
