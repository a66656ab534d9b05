"""Bad input: an unknown project, an empty window, bad options, a Spark that cannot start.
(Malformed records: test_ground_truth.) None of them crashes; each says what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mqgate.analytics.job import build_report
from mqgate.analytics.plots import plots
from mqgate.analytics.render import write_report
from mqgate.analytics.reports import Window
from mqgate.cli.analytics import main
from mqgate.errors import NotFound
from tests.analytics.conftest import Loaded

pytestmark = pytest.mark.slow


def test_an_unknown_project_is_refused_naming_the_known_ones(spark: Any, loaded: Loaded) -> None:
    with pytest.raises(NotFound, match=r"no trace events of project nosuch .*\(projects: pay, shop\)"):
        build_report(spark, loaded.out, Window(project="nosuch"))


def test_an_empty_window_gives_a_report_of_zeros_that_says_so(
    spark: Any, loaded: Loaded, tmp_path: Path
) -> None:
    year_2030 = 1_893_456_000_000
    report = build_report(spark, loaded.out, Window(year_2030, year_2030 + 3_600_000, "shop"))
    assert report["counts"]["total"]["events"] == 0
    assert report["rates"]["perHour"] == [] and report["capacity"] == [] and report["findings"] == []
    assert report["latency"]["slowest"] == []
    assert "No trace events in this window." in report["notes"]
    html, js = write_report(report, plots(report), tmp_path, None)
    assert "No trace events in this window." in html.read_text()
    assert json.loads(js.read_text())["counts"]["total"]["produced"] == 0


def test_an_empty_dataset_gives_a_report_that_says_so(spark: Any, tmp_path: Path) -> None:
    report = build_report(spark, tmp_path / "nothing", Window())
    assert report["counts"]["total"]["events"] == 0
    assert "The dataset has no events yet." in report["notes"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "yesterday"], "--from 'yesterday' is neither epoch milliseconds nor an ISO 8601 time"),
        (["--from", "2026-01-05T22:00Z", "--to", "2026-01-05T21:00Z"], "--to must be after --from"),
        (["--top", "0"], "--top must be between 1 and 1000"),
        (["--threshold", "silent_after=5"], "--threshold 'silent_after=5': give NAME=VALUE, NAME one of"),
        (["--threshold", "silent_after_ms=soon"], "--threshold silent_after_ms: 'soon' is not a number"),
        (["--threshold", "full_ratio=0"], "--threshold full_ratio must be positive"),
        (["--queue-state-url", "/nonexistent/queue-state.sqlite"], "no queue state history at /nonexistent/"),
    ],
)
def test_bad_options_are_refused_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["--out", str(tmp_path), "--report-only", *argv]) == 2
    assert message in capsys.readouterr().err


def test_thresholds_are_read_over_the_gateway_s_defaults() -> None:
    from mqgate.cli.analytics import parse_thresholds
    from mqgate.queuestate.diagnosis import Thresholds

    given = ["silent_after_ms=2000", "full_ratio=0.9", "store_error_types=storage, disk_full"]
    assert parse_thresholds(given) == Thresholds(
        silent_after_ms=2000, full_ratio=0.9, store_error_types=frozenset({"storage", "disk_full"})
    )
    assert parse_thresholds(None) == Thresholds()


def test_an_unreachable_gateway_is_reported_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["--out", str(tmp_path), "--gateway", url, "--admin-token", "t"]) == 2
    assert f"cannot reach the gateway at {url}" in capsys.readouterr().err


def test_a_spark_that_cannot_start_gives_one_clear_line(tmp_path: Path) -> None:
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    argv = ["--out", str(tmp_path), "--report-only"]
    code = f"from mqgate.cli.analytics import main; raise SystemExit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"mqgate: Spark cannot start: JAVA_HOME={tmp_path / 'no-java'} has no bin/java"
    )
