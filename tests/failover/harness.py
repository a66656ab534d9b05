"""A gateway's data path and failover service in the test's own process, built as mqgate/app.py
builds them (routed store and offsets, the failover service as the produce path's spool), with
every background round stopped: the test drives the switch checks, declarations, replays,
drains and cluster states itself, so the order of events is the test's, not the timers'.

The clusters are real redis-servers of the test's own (tests/failover/conftest.py); a cluster's
state is moved by real probes (`probe`) or by the data path's own outcomes, or, where a test
only needs a cluster to count as failed, by feeding its detector the failures the data path
would have seen (`fail`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqgate.api.shapes import MessageIn
from mqgate.app import build_core
from mqgate.core.failure_detection import ClusterState, Outcome
from mqgate.core.tokens import decode_token
from mqgate.failover.pool import ClusterPool, ClusterSpec
from mqgate.failover.service import Failover
from mqgate.model import Receipt, decode_stored
from mqgate.projects.service import Projects
from mqgate.services.consume import PullResult
from mqgate.services.gateway import Gateway
from mqgate.services.observers import Observers
from mqgate.services.topology import Topology
from mqgate.settings import load_settings

QUEUES = 4
NEVER_S = 3600.0  # a background timer that must not fire during a test


@dataclass
class InProcess:
    gateway: Gateway
    failover: Failover
    pool: ClusterPool

    # --- the data path ---------------------------------------------------------------------

    async def produce(self, bodies: list[str], order_key: str | None = None) -> list[Receipt]:
        producer = await self.gateway.topology.producer("orders-p")
        messages = [MessageIn(body=b, order_key=order_key) for b in bodies]
        return await self.gateway.producing.produce(producer, messages)

    async def pull(self, max_count: int = 100) -> PullResult:
        c = await self.gateway.topology.consumer("orders-c")
        return await self.gateway.consuming.pull(
            c, client_id=None, max_count=max_count, wait_s=0, request_id=None, owner="test"
        )

    async def ack(self, result: PullResult) -> None:
        assert result.request_id is not None
        c = await self.gateway.topology.consumer("orders-c")
        await self.gateway.consuming.ack(c, decode_token(result.request_id, self.gateway.ctx.secret))

    async def consume_all(self) -> list[tuple[str, dict[str, str]]]:
        """Pull and ack until nothing is left: (message id, properties) of each delivery."""
        got: list[tuple[str, dict[str, str]]] = []
        while True:
            res = await self.pull()
            if res.status != "FOUND":
                return got
            assert res.messages is not None
            for _, raw in res.messages:
                m = decode_stored(raw)
                got.append((m.msg_id, m.properties))
            await self.ack(res)

    # --- the clusters ----------------------------------------------------------------------

    async def quiet(self) -> None:
        """Stop the gateway's own loops (lag gauges, retention, delivery): from here the
        test's calls are the only ones sent to the clusters (a lag pass timing out on a hung
        cluster is a real failure, and would be counted as one)."""
        for task in self.gateway._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def state(self, cluster: str) -> ClusterState:
        return self.pool.get(cluster).state

    def fail(self, cluster: str) -> None:
        """The hard failures the data path sees calling a dead cluster, until it is failed."""
        while self.state(cluster) is not ClusterState.FAILED:
            self.pool.observe(cluster, Outcome.CONNECT_FAILED, 0.0, "connection refused")

    async def probe(self, cluster: str) -> Outcome:
        """One real probe of `cluster`, fed to its detector as the probe loop does."""
        outcome, detail = await self.pool.get(cluster).probe_once()
        self.pool.observe(cluster, outcome, 0.0, detail)
        return outcome

    async def rejoin(self, cluster: str, timeout_s: float = 30.0) -> None:
        """Probe a restarted cluster until it is healthy again (rejoin_probes good answers)."""
        deadline = time.monotonic() + timeout_s
        while self.state(cluster) is not ClusterState.HEALTHY:
            assert time.monotonic() < deadline, f"{cluster} still {self.state(cluster)}"
            await self.probe(cluster)

    def epoch(self) -> int:
        rec = self.failover.coordinator.record("shop")
        assert rec is not None
        return rec.epoch

    def active(self) -> str:
        rec = self.failover.coordinator.record("shop")
        assert rec is not None
        return rec.cluster


def settings_for(data: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "failover_send_timeout_s": 2.0,
        "failover_fail_after": 2,
        "failover_rejoin_probes": 3,
        "failover_check_s": NEVER_S,
        "failover_probe_interval_s": NEVER_S,
        "failover_probe_timeout_s": 2.0,
        "failover_failback_dwell_s": 0.0,
    }
    values.update(overrides)
    return load_settings(env={}, data_dir=data, **values)


@contextlib.asynccontextmanager
async def in_process(
    data: Path, primary_url: str, backup_url: str, **overrides: Any
) -> AsyncIterator[InProcess]:
    """Project `shop` on clusters p (primary) and b (backup): topic `orders` (4 queues),
    producer `orders-p`, cluster-mode consumer `orders-c`; active on p, declared there."""
    core = build_core(settings_for(data, **overrides))  # as a gateway's, below its features
    sql, backends, pool, router, ctx = core.sql, core.backends, core.pool, core.router, core.ctx
    observers = Observers()
    topology = Topology(ctx)
    projects = Projects(ctx, topology)
    failover = Failover(ctx, sql.engine, router, pool)
    gateway = Gateway(ctx, topology, observers, features=(projects,), spool=failover)
    await backends.start()
    await gateway.start()
    await failover.start()
    # The rounds are the test's: no failover loop, no switch-check loop (probes: NEVER_S).
    task = failover._task
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await failover.coordinator.stop()
    h = InProcess(gateway, failover, pool)
    try:
        await failover.add_cluster(ClusterSpec("p", primary_url))
        await failover.add_cluster(ClusterSpec("b", backup_url))
        await projects.create("shop", "")
        await failover.assign("shop", "p", "b", False)
        await topology.create_topic("orders", QUEUES, 3_600_000, None, project="shop")
        await topology.register_producer("orders-p", "orders")
        await topology.register_consumer("orders-c", "orders", "cluster", "earliest", 30.0, 16)
        assert h.active() == "p"
        yield h
    finally:
        await failover.stop()
        await gateway.stop()
        await backends.stop()
        sql.engine.dispose()
