"""The whole job against a real gateway: trace records produced to a topic, read with
format("mqgate") (Trigger.AvailableNow, its own consumer group), reported; a rerun reads
only what was produced since. The generated records go to an ordinary topic named with
--topic (the gateway's own trace topics: test_trace_topics.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mqgate.analytics import truth as truth_mod
from mqgate.analytics.generator import LoadSpec, generate
from mqgate.analytics.job import AnalyticsOptions, run_analytics
from mqgate.analytics.source import UnknownProject
from mqgate.analytics.tracefile import raw_batches
from mqgate.client import Client
from tests.conftest import Server, store_server

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Server]:
    srv, cleanup = store_server(tmp_path / "data", "embedded")
    srv.start()
    yield srv
    srv.stop()
    cleanup()


def produce(server: Server, producer: str, records: pa.Table) -> None:
    messages = [{"message": b} for b in records.column("body").to_pylist()]
    with Client(server.url, server.admin_token) as gw:
        assert gw.produce(producer, messages) == len(messages)


def test_the_job_reads_trace_records_through_the_gateway_incrementally(
    spark: Any, gateway: Server, tmp_path: Path
) -> None:
    trace = generate(LoadSpec(messages=1_500, seed=3))
    records = pa.Table.from_batches(list(raw_batches(trace)))
    cut = trace.spec.start_ms + 4 * 3_600_000
    early = pc.less(records.column("timestamp"), pa.scalar(cut, pa.timestamp("ms", tz="UTC")))
    first, second = records.filter(early), records.filter(pc.invert(early))
    topic = "trace-e2e"
    gateway.admin("POST", "/admin/topics", name=topic, queues=4)
    gateway.admin("POST", "/admin/producers", name="tracer", topic=topic)
    produce(gateway, "tracer", first)
    out = tmp_path / "out"
    opts = AnalyticsOptions(out=out, gateway=gateway.url, token=gateway.admin_token, topics=[topic])

    one = run_analytics(opts, spark)
    assert (one.events_read, one.malformed_read) == (first.num_rows, 0)
    assert one.report["counts"]["total"] == truth_mod.compute(trace, to_ms=cut).counts["all"]
    with Client(gateway.url, gateway.admin_token) as gw:
        assert gw.progress("analytics-trace-e2e")["lag"] == 0  # the job's group is caught up

    produce(gateway, "tracer", second)
    two = run_analytics(opts, spark)
    assert (two.events_read + two.malformed_read, two.malformed_read) == (second.num_rows, 7)
    assert two.report["counts"]["total"] == truth_mod.compute(trace).counts["all"]
    assert two.report["malformed"]["count"] == 7
    with Client(gateway.url, gateway.admin_token) as gw:
        assert gw.progress("analytics-trace-e2e")["lag"] == 0
    html = (out / "report.html").read_text()
    # Five plots, and a queue state timeline once the gateway closed a 60 s interval.
    assert html.count("<svg") == 5 + len(two.report["queueFaults"]["projects"])
    slowest = two.report["latency"]["slowest"][0]["msgId"]
    assert f'href="{gateway.url}/admin/traces?msgId={slowest}"' in html

    faults = two.report["queueFaults"]  # through the gateway's API: queue intervals only
    assert faults["source"]["kind"] == "gateway" and faults["complete"] is False
    assert "Queue fault vs consumer fault over time" in html

    three = run_analytics(opts, spark)  # nothing new: nothing read, same figures
    assert (three.events_read, three.malformed_read) == (0, 0)
    assert three.report["counts"] == two.report["counts"]


def test_an_unknown_project_is_refused_before_spark_runs(gateway: Server, tmp_path: Path) -> None:
    opts = AnalyticsOptions(out=tmp_path, gateway=gateway.url, token=gateway.admin_token)
    with pytest.raises(
        UnknownProject, match=r"project nosuch has no trace topic at .* \(traced projects: none\)"
    ):
        run_analytics(AnalyticsOptions(**{**opts.__dict__, "window": type(opts.window)(project="nosuch")}))
