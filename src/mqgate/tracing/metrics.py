"""The tracer's counters and the trace index's lag as Prometheus metrics, read at scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.recorder import TraceRecorder


class TracingMetrics:
    """A Prometheus collector (registered by services.tracing.Tracing while it runs)."""

    def __init__(self, recorder: TraceRecorder, indexer: TraceIndexer) -> None:
        self.recorder = recorder
        self.indexer = indexer

    def collect(self) -> Iterator[Metric]:
        rec, idx, lag = self.recorder.counters, self.indexer.counters, self.indexer.lag()
        for name, help_text, value in (
            ("mqgate_trace_events_recorded", "Trace events stored in trace topics", rec.recorded),
            ("mqgate_trace_events_dropped", "Trace events given up (buffer full or store down)", rec.dropped),
            (
                "mqgate_trace_append_failures",
                "Trace topic appends that failed (retried)",
                rec.append_failures,
            ),
            ("mqgate_trace_events_indexed", "Trace events written to the trace index", idx.indexed),
            ("mqgate_trace_events_malformed", "Trace records that did not decode (skipped)", idx.malformed),
            (
                "mqgate_trace_index_failures",
                "Trace indexing rounds that failed (retried with backoff)",
                idx.failures,
            ),
        ):
            yield CounterMetricFamily(name, help_text, value=value)
        yield GaugeMetricFamily(
            "mqgate_trace_index_lag_events", "Stored trace events not indexed yet", lag.events
        )
        yield GaugeMetricFamily(
            "mqgate_trace_index_lag_ms", "Since the index last held every event", lag.time_ms
        )
