"""The failover's Prometheus metrics (docs/FAILOVER.md names each)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class FailoverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.switches = Counter(
            "mqgate_project_switches", "Projects moved to another cluster", ["project", "to"], registry=r
        )
        self.state = Gauge(
            "mqgate_cluster_state", "1 for the state each cluster is in", ["cluster", "state"], registry=r
        )
        self.spooled = Counter(
            "mqgate_spooled_messages", "Produces kept in the spool", ["project"], registry=r
        )
        self.pending = Gauge("mqgate_spool_pending_messages", "Spooled produces not yet resent", registry=r)
        self.drained = Counter(
            "mqgate_drained_messages", "Backlog moved from a left cluster", ["project"], registry=r
        )
