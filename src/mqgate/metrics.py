"""Prometheus metrics of one gateway process."""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _LoopMetric(Collector):
    """A labelled metric of the data path, changed on the event loop's thread only: a child's
    `inc` or `observe` is one Python call and no lock, where prometheus_client's takes five
    calls and one or two locks a time (each request counts one or two). The registry reads it
    as a Prometheus metric of the same name and samples (not `_created`)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry):
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        registry.register(self)

    def _new(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: str, **named: str) -> Any:
        child = None if named else self._children.get(values)
        if child is None:
            if named:
                if values or set(named) != set(self.labelnames):
                    raise ValueError(f"{self.name} takes labels {self.labelnames}, not {values} {named}")
                values = tuple(named[n] for n in self.labelnames)
            elif len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, not {values}")
            values = tuple(map(str, values))  # as prometheus_client: label values are text
            child = self._children.get(values)
            if child is None:
                child = self._children[values] = self._new()
        return child

    def remove(self, *values: str) -> None:
        self._children.pop(tuple(map(str, values)), None)

    def _items(self) -> list[tuple[tuple[str, ...], Any]]:
        return list(self._children.items())  # one C call: safe against the loop adding a child

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> Any:
        raise NotImplementedError


class LoopCounter(_LoopMetric):
    def _new(self) -> _Count:
        return _Count()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._items():
            family.add_metric(values, child.value)
        yield family


class LoopHistogram(_LoopMetric):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self._edges = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> _Buckets:
        return _Buckets(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._items():
            counts, total = list(child.counts), child.sum
            cumulative, running = [], 0
            for edge, count in zip(self._edges, counts, strict=True):
                running += count
                cumulative.append((edge, float(running)))
            family.add_metric(values, cumulative, total)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The data path's: changed on the event loop's thread only.
        self.produced = LoopCounter("mqgate_produced_messages", "Messages accepted", ["topic"], r)
        self.consumed = LoopCounter("mqgate_consumed_messages", "Messages delivered", ["consumer"], r)
        self.acks = LoopCounter("mqgate_acks", "Acks by outcome", ["consumer", "result"], r)
        self.dead_lettered = Counter(
            "mqgate_dead_lettered_messages", "Messages moved to a DLQ", ["consumer"], registry=r
        )
        self.redriven = Counter(
            "mqgate_redriven_messages", "Dead letters copied back to their topic", ["consumer"], registry=r
        )
        self.waiting = Gauge(
            "mqgate_waiting_pulls", "Long polls waiting for messages", ["consumer"], registry=r
        )
        self.expired = Counter(
            "mqgate_expired_messages",
            "Messages past their deadline when pulled, dead-lettered",
            ["consumer"],
            registry=r,
        )
        self.expired_held = Counter(
            "mqgate_expired_held_messages",
            "Scheduled destinations past their deadline before they came due",
            ["target"],
            registry=r,
        )
        self.dropped_held = Counter(
            "mqgate_dropped_held_messages",
            "Scheduled destinations dropped when due because their topic or consumer was deleted",
            ["target"],
            registry=r,
        )
        self.lag = Gauge("mqgate_consumer_lag", "Unconsumed messages", ["consumer"], registry=r)
        self.lag_passes = Counter(
            "mqgate_lag_passes",
            "Passes over the lag gauges: of the consumers whose lag may have moved (changes), "
            "or of every consumer (full: the first, and where moves can go unheard)",
            ["kind"],
            registry=r,
        )
        self.lag_recomputed = Counter(
            "mqgate_lag_recomputed", "Consumer lag gauges recomputed by the passes", registry=r
        )
        self.latency = LoopHistogram(
            "mqgate_request_seconds", "Request latency", ["route"], r, buckets=LATENCY_BUCKETS
        )
        self.errors = LoopCounter("mqgate_errors", "Error answers", ["route", "status"], r)
        self.push_attempts = Counter(
            "mqgate_push_attempts",
            "Push deliveries by consumer and outcome (ok, http_<status>, timeout, connection, tls, "
            "protocol, refused)",
            ["consumer", "outcome"],
            registry=r,
        )
        self.push_latency = Histogram(
            "mqgate_push_latency_seconds",
            "Push attempts' time from connect to the endpoint's answer",
            ["consumer"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.sqs_requests = Counter(
            "mqgate_sqs_requests",
            "SQS API requests by action and outcome (ok, or the error's name)",
            ["action", "outcome"],
            registry=r,
        )
        self.alerts_active = Gauge("mqgate_alerts_active", "Active alerts", ["kind"], registry=r)
        self.alert_checks = Counter(
            "mqgate_alert_checks",
            "Alert checks: of the consumers whose figures may have moved or whose window passed a "
            "point (changes), or of every consumer (full: the first, and where moves can go unheard)",
            ["kind"],
            registry=r,
        )
        self.alert_consumers_checked = Counter(
            "mqgate_alert_consumers_checked", "Consumers whose alert rules the checks evaluated", registry=r
        )
        self.alert_notifications = Counter(
            "mqgate_alert_notifications",
            "Alert notifications by status (firing, resolved) and outcome (sent; failed: every "
            "attempt failed; dropped: too many waiting)",
            ["status", "outcome"],
            registry=r,
        )
        self.alert_webhook_errors = Counter(
            "mqgate_alert_webhook_errors",
            "Failed alert webhook attempts by reason (timeout, connection, http_<status>)",
            ["reason"],
            registry=r,
        )

        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: label lookup is on every request's path."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def forget_gauge(self, metric: Any, *labels: str) -> None:
        """Drop a gauge's series (its subject was deleted), so it does not linger at its last value."""
        self._children.pop((id(metric), labels), None)
        with contextlib.suppress(KeyError):
            metric.remove(*labels)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
