"""A local Spark for the analytics tests, and one generated load trace ingested once."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from mqgate.analytics.job import start_spark

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if IN_CI:
            pytest.fail("Java is not installed: Spark needs it (required in CI)")
        pytest.skip("SKIPPED LOUDLY: Java is not installed, Spark cannot start")
    s = start_spark("local[2]", {"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2"})
    yield s
    s.stop()


@dataclass
class Loaded:
    trace: Any  # LoadTrace
    raw: Path  # the raw records as Parquet (the input stage's input)
    out: Path  # the dataset and report folder
    report: dict[str, Any]


def write_raw(trace: Any, path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqgate.analytics.tracefile import raw_batches

    pq.write_table(pa.Table.from_batches(list(raw_batches(trace))), path)
    return path


@pytest.fixture(scope="session")
def loaded(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    """40,000 messages (~157,000 events, 8 hours) through the input stage and the report."""
    from mqgate.analytics.generator import LoadSpec, generate
    from mqgate.analytics.ingest import ingest_frame
    from mqgate.analytics.job import build_report
    from mqgate.analytics.reports import Window

    base = tmp_path_factory.mktemp("analytics")
    trace = generate(LoadSpec(messages=40_000))
    raw = write_raw(trace, base / "raw.parquet")
    out = base / "out"
    ingest_frame(spark.read.parquet(str(raw)), out)
    return Loaded(trace, raw, out, build_report(spark, out, Window(), slowest=20))
