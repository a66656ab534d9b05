"""Prometheus metrics of one gateway process."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.produced = Counter("mqgate_produced_messages", "Messages accepted", ["topic"], registry=r)
        self.consumed = Counter("mqgate_consumed_messages", "Messages delivered", ["consumer"], registry=r)
        self.acks = Counter("mqgate_acks", "Acks by outcome", ["consumer", "result"], registry=r)
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
        self.latency = Histogram(
            "mqgate_request_seconds",
            "Request latency",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter("mqgate_errors", "Error answers", ["route", "status"], registry=r)
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
