"""What one gateway process runs: the data path and the features attached to it, as the
composition root (mqgate/app.py) built them. The API's routes and the console's pages take it
to reach a feature without knowing how it was built."""

from __future__ import annotations

import msgspec

from mqgate.alerts.service import Alerts
from mqgate.failover.service import Failover
from mqgate.metrics_history import MetricsHistory
from mqgate.projects.service import Projects
from mqgate.push.service import PushService
from mqgate.queuestate.service import QueueState
from mqgate.services.gateway import Gateway
from mqgate.tracing.lookup import TraceLookup
from mqgate.tracing.service import Tracing


class Platform(msgspec.Struct, frozen=True):
    gateway: Gateway  # the data path
    tracing: Tracing
    trace_lookup: TraceLookup
    queue_state: QueueState
    projects: Projects
    metrics_history: MetricsHistory
    alerts: Alerts
    failover: Failover
    push: PushService | None = None
