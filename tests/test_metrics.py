"""The data path's metrics (mqgate.metrics: LoopCounter, LoopHistogram) read exactly as
prometheus_client's own counter and histogram fed the same values, `_created` aside."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from mqgate.metrics import LATENCY_BUCKETS, LoopCounter, LoopHistogram, Metrics

VALUES = [0.0001, 0.0005, 0.0007, 0.003, 0.003, 0.01, 0.2, 4.0, 30.0, 31.5, 1e9]


def exposition(registry: CollectorRegistry) -> list[str]:
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if "_created" not in line and not line.startswith("# TYPE mqgate_x_created")
    ]


def test_a_loop_histogram_reads_as_prometheus_clients_histogram_of_the_same_values() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = LoopHistogram("mqgate_x", "doc", ["route"], ours, buckets=LATENCY_BUCKETS)
    ref = Histogram("mqgate_x", "doc", ["route"], buckets=LATENCY_BUCKETS, registry=theirs)
    for i, v in enumerate(VALUES):
        route = "/a" if i % 3 else "/b"
        h.labels(route).observe(v)
        ref.labels(route).observe(v)
    assert exposition(ours) == exposition(theirs)


def test_a_loop_counter_reads_as_prometheus_clients_counter_and_forgets_a_removed_series() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    c = LoopCounter("mqgate_x", "doc", ["consumer", "result"], ours)
    ref = Counter("mqgate_x", "doc", ["consumer", "result"], registry=theirs)
    for labels, n in [(("c1", "ok"), 1), (("c2", "ok"), 5), (("c1", "offset_moved"), 2), (("c1", "ok"), 3)]:
        c.labels(*labels).inc(n)
        ref.labels(*labels).inc(n)
    assert exposition(ours) == exposition(theirs)
    c.remove("c2", "ok")
    ref.remove("c2", "ok")
    assert exposition(ours) == exposition(theirs)


def test_a_loop_metric_takes_exactly_its_labels_and_its_name_once_a_registry() -> None:
    registry = CollectorRegistry()
    c = LoopCounter("mqgate_x", "doc", ["topic"], registry)
    assert c.labels(topic="a") is c.labels("a")
    with pytest.raises(ValueError, match="takes labels"):
        c.labels("a", "b")
    with pytest.raises(ValueError, match="takes labels"):
        c.labels(queue="a")
    with pytest.raises(ValueError, match="takes labels"):
        c.labels("a", topic="a")
    n = LoopCounter("mqgate_n", "doc", ["status"], registry)
    assert n.labels(404) is n.labels("404")  # label values are text, as prometheus_client's
    n.remove("500")  # a series never made: nothing to remove, as prometheus_client
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        LoopCounter("mqgate_x", "doc", ["topic"], registry)


def test_the_gateways_metrics_render_the_data_paths_series() -> None:
    m = Metrics()
    m.child(m.produced, "orders").inc(3)
    m.child(m.latency, "/mq/produce").observe(0.002)
    text = m.render().decode()
    assert 'mqgate_produced_messages_total{topic="orders"} 3.0' in text
    assert 'mqgate_request_seconds_bucket{le="0.0025",route="/mq/produce"} 1.0' in text
    assert 'mqgate_request_seconds_count{route="/mq/produce"} 1.0' in text
