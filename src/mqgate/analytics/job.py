"""`mqgate analytics`: ingest the trace topics (incrementally), compute the report over a
window from the Parquet dataset, write report.html and report.json."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqgate.analytics.reports import Window
from mqgate.errors import MqgateError, NotFound, Unavailable
from mqgate.queuestate.diagnosis import Thresholds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkUnavailable(Unavailable):
    pass


@dataclass(frozen=True)
class AnalyticsOptions:
    out: Path
    gateway: str | None = None  # None: report from the dataset as it is, read nothing new
    token: str = ""
    window: Window = field(default_factory=Window)
    master: str | None = None
    topics: list[str] | None = None  # read these topics instead of the trace topics
    top_n: int = 10
    slowest: int = 20
    max_per_trigger: int = 1_000_000
    spark_conf: dict[str, str] = field(default_factory=dict)
    # The queue state history's database (SQLite file or PostgreSQL URL); None: the gateway's API.
    queue_state_url: str | None = None
    queue_state_prefix: str = "mqgate_qstate_"
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass
class AnalyticsSummary:
    events_read: int = 0
    malformed_read: int = 0
    ingest_s: float = 0.0
    report_s: float = 0.0
    render_s: float = 0.0
    html: Path | None = None
    json: Path | None = None
    report: dict[str, Any] = field(default_factory=dict)


def start_spark(master: str | None, conf: dict[str, str] | None = None) -> SparkSession:
    """A session, or SparkUnavailable with the reason in one sentence (no Java, a master
    that cannot be reached) instead of a JVM stack trace."""
    import shutil

    try:
        import mqgate.spark
    except ImportError as exc:
        raise SparkUnavailable(f"PySpark is not installed ({exc}): pip install 'mqgate[spark]'") from exc
    import os

    java_home = os.environ.get("JAVA_HOME")
    if java_home and not Path(java_home, "bin", "java").exists():
        raise SparkUnavailable(f"Spark cannot start: JAVA_HOME={java_home} has no bin/java")
    if not java_home and shutil.which("java") is None:
        raise SparkUnavailable(
            "Spark cannot start: Java 17 is not installed (no java on PATH, JAVA_HOME unset)"
        )
    try:
        return mqgate.spark.session("mqgate-analytics", master, conf)
    except Exception as exc:  # py4j and PySpark raise several unrelated types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SparkUnavailable(f"Spark cannot start on {master or 'local[*]'}: {first}") from exc


def build_report(
    spark: SparkSession, out: Path, window: Window, top_n: int = 10, slowest: int = 20
) -> dict[str, Any]:
    """Every figure of the report (JSON-ready) from the dataset under `out`."""
    from mqgate.analytics import errors, latency, reports

    report: dict[str, Any] = {
        "window": window.describe(),
        "generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "notes": [],
        "malformed": reports.malformed(spark, out, window),
    }
    if window.project is not None and window.project not in reports.known_projects(out):
        known = ", ".join(reports.known_projects(out)) or "none"
        raise NotFound(
            f"no trace events of project {window.project} in {out} (projects: {known})", field="project"
        )
    df = reports.load_events(spark, out, window)
    if df is None:
        report["notes"].append("The dataset has no events yet.")
        df = spark.createDataFrame([], _empty_schema(spark))
    report["counts"] = reports.counts(df)
    if report["counts"]["total"]["events"] == 0:
        report["notes"].append("No trace events in this window.")
    report["rates"] = reports.rates(df)
    report["capacity"] = reports.capacity(df)
    report["latency"] = latency.latency(df, slowest)
    report["errors"] = errors.errors(df, top_n)
    report["findings"] = errors.findings(report["errors"], report["latency"])
    return report


def _empty_schema(spark: SparkSession) -> Any:
    from pyspark.sql.types import StructType

    from mqgate.analytics.columns import EVENT_COLUMNS, EVENT_JSON, SOURCE_COLUMNS

    del spark
    types = {f.name: f.dataType for f in EVENT_JSON.fields}
    types.update({f.name: f.dataType for f in EVENT_JSON["resource"].dataType.fields})  # type: ignore[attr-defined]
    from pyspark.sql.types import IntegerType, LongType, StringType

    src = {
        "srcTopic": StringType(),
        "srcQueue": IntegerType(),
        "srcOffset": LongType(),
        "storedMs": LongType(),
    }
    schema = StructType()
    for name in (*SOURCE_COLUMNS, *EVENT_COLUMNS, "date", "project"):
        schema = schema.add(name, src.get(name, types.get(name, StringType())))
    return schema


def queue_fault_report(opts: AnalyticsOptions, gateway: Any = None) -> dict[str, Any] | None:
    """The queue fault section (mqgate.analytics.queuefaults) from the history's database when
    given, else from the gateway's API (`gateway`, a Client), else None (nothing to read)."""
    from mqgate.analytics import queuefaults
    from mqgate.analytics.queuestate_source import GatewaySource, HistorySource

    w = opts.window
    if opts.queue_state_url is not None:
        history = HistorySource(opts.queue_state_url, opts.queue_state_prefix)
        try:
            return queuefaults.section(history, w.project, w.from_ms, w.to_ms, opts.thresholds)
        finally:
            history.close()
    if gateway is None:
        return None
    return queuefaults.section(GatewaySource(gateway), w.project, w.from_ms, w.to_ms, opts.thresholds)


def run_analytics(opts: AnalyticsOptions, spark: SparkSession | None = None) -> AnalyticsSummary:
    from mqgate.analytics.plots import plots
    from mqgate.analytics.render import write_report

    own = spark is None
    summary = AnalyticsSummary()
    # Before Spark starts: a gateway or a history that cannot be read fails fast.
    if opts.gateway is not None:
        from mqgate.analytics.source import trace_sources
        from mqgate.client import Client

        with Client(opts.gateway, opts.token, retry_for_s=2.0) as gw:
            sources = trace_sources(gw, opts.window.project, opts.topics)
            queue_faults = queue_fault_report(opts, gw)
    else:
        queue_faults = queue_fault_report(opts)
    session = spark or start_spark(opts.master, opts.spark_conf)
    try:
        if opts.gateway is not None:
            from mqgate.analytics.source import ingest_topics

            started = time.perf_counter()
            try:
                stats = ingest_topics(
                    session, opts.gateway, opts.token, sources, opts.out, opts.max_per_trigger
                )
            except MqgateError:
                raise
            except Exception as exc:  # a failed streaming query: say which, not a JVM trace
                raise Unavailable(
                    f"reading the trace topics failed: {str(exc).strip().splitlines()[0]}"
                ) from exc
            summary.events_read, summary.malformed_read = stats.events, stats.malformed
            summary.ingest_s = time.perf_counter() - started
        started = time.perf_counter()
        report = build_report(session, opts.out, opts.window, opts.top_n, opts.slowest)
        summary.report_s = time.perf_counter() - started
        report["run"] = {"eventsRead": summary.events_read, "malformedRead": summary.malformed_read}
        report["queueFaults"] = queue_faults
        started = time.perf_counter()
        link = f"{opts.gateway.rstrip('/')}/admin/traces?msgId=" if opts.gateway else None
        summary.html, summary.json = write_report(report, plots(report), opts.out, link)
        summary.render_s = time.perf_counter() - started
        summary.report = report
        return summary
    finally:
        if own:
            session.stop()
