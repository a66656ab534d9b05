"""Failover between store clusters per project, wired into the gateway (SPEC P8, E7).

Owns the cluster pool (probes), the switch coordinator (which cluster each project writes to,
agreed through the registry's database), the producer spool and its replay, and the steps
around a switch: declare the project on the new cluster, replay the spool there, and once
the cluster it left is healthy again release that cluster's stale locks and drain what its
consumers had not consumed (clusters/drain.py). docs/FAILOVER.md has the rules and figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgspec
import sqlalchemy as sa
from prometheus_client import Counter, Gauge

from mqgate.clusters.config import Assignment, SqlFailoverConfig, parse_clusters
from mqgate.clusters.declare import clean_up, project_topology, redeclare
from mqgate.clusters.drain import drain_backlog
from mqgate.clusters.pool import ClusterPool, ClusterSpec, ClusterStatus
from mqgate.clusters.replay import Replayer
from mqgate.clusters.routing import ClusterRouter
from mqgate.clusters.spool import QueueKey, Spool, SpoolRecord, SpoolStats
from mqgate.clusters.switch import ProjectClusters, SqlSwitchRecords, SwitchCoordinator, SwitchEvent
from mqgate.core.failover import ClusterState
from mqgate.errors import AlreadyExists, MqgateError, NotFound
from mqgate.model import StoredMessage
from mqgate.names import validate_name
from mqgate.services.context import Context, now_ms

log = logging.getLogger("mqgate.failover")
_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder(StoredMessage)


@dataclass(slots=True, frozen=True)
class ProjectFailover:
    """What the admin API shows of one project's clusters."""

    project: str
    primary: str
    backup: str | None
    auto_failback: bool
    active: str | None
    epoch: int
    reason: str
    changed_ms: int
    spooled: int  # produces of the project waiting in this gateway's spool
    draining: list[str]  # clusters it left that still hold its consumers' backlog


@dataclass(slots=True)
class _Left:
    project: str
    cluster: str
    switched_ms: int


class Failover:
    def __init__(self, ctx: Context, engine: sa.Engine, router: ClusterRouter, pool: ClusterPool) -> None:
        s = ctx.settings
        self.ctx = ctx
        self.router = router
        self.pool = pool
        self.config = SqlFailoverConfig(engine)
        self.spool = Spool(Path(s.data_dir) / "spool", s.spool_max_bytes)
        self.replayer = Replayer(self.spool)
        self._assigned: dict[str, Assignment] = {}
        self.records = SqlSwitchRecords(engine)
        self.coordinator = SwitchCoordinator(
            self.records,
            pool.states,
            self._project_clusters,
            check_s=s.failover_check_s,
            min_dwell_s=s.failover_failback_dwell_s,
            on_switch=self._switched,
        )
        router.active = self.coordinator.active
        self._left: list[_Left] = []  # clusters this gateway switched projects away from
        self.history: deque[SwitchEvent] = deque(maxlen=100)
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        r = ctx.metrics.registry
        self.m_switches = Counter(
            "mqgate_project_switches", "Projects moved to another cluster", ["project", "to"], registry=r
        )
        self.m_state = Gauge(
            "mqgate_cluster_state", "1 for the state each cluster is in", ["cluster", "state"], registry=r
        )
        self.m_spooled = Counter(
            "mqgate_spooled_messages", "Produces kept in the spool", ["project"], registry=r
        )
        self.m_pending = Gauge("mqgate_spool_pending_messages", "Spooled produces not yet resent", registry=r)
        self.m_drained = Counter(
            "mqgate_drained_messages", "Backlog moved from a left cluster", ["project"], registry=r
        )
        pool.listen(self._state_changed)

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.config.create_schema)
        await asyncio.to_thread(self.records.create_schema)
        for spec in parse_clusters(self.ctx.settings.failover_clusters):
            with contextlib.suppress(AlreadyExists):
                await asyncio.to_thread(self.config.add_cluster, spec, now_ms())
        await self.spool.open()
        self.m_pending.set_function(lambda: self.spool.stats().pending)
        await self.pool.start()
        await self.sync()
        await self.coordinator.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="failover")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.coordinator.stop()
        await self.pool.stop()
        await self.spool.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.ctx.settings.failover_check_s)
            self._kick.clear()
            started = loop.time()
            try:
                await self.sync()
                await self.replay()
                await self.drain_left()
            except Exception as exc:  # the registry or a cluster is away: next round
                self.ctx.health.fault("background", "failover", repr(exc))
                log.warning("failover check failed after %.2fs: %r", loop.time() - started, exc)

    def _state_changed(self, _change: object) -> None:
        for status in self.pool.statuses():
            for state in ClusterState:
                self.m_state.labels(status.name, state.value).set(1 if status.state == state.value else 0)
        self.coordinator.notice()
        self._kick.set()  # a cluster came back: replay and drain now

    # --- configuration -------------------------------------------------------------------

    async def sync(self) -> None:
        """Bring this gateway in line with the shared configuration, then check every switch."""
        config = await asyncio.to_thread(self.config.read)
        for name in set(self.pool.names()) - set(config.clusters):
            await self.pool.remove(name)
        for spec in config.clusters.values():
            if spec.name not in self.pool.names():
                await self.pool.add(spec)
        new = [p for p in config.projects if p not in self._assigned]
        self._assigned = config.projects
        self.router.assign(self._assigned)
        self._state_changed(None)
        if new:
            await self.coordinator.check()
        for project in new:
            await self._declare(project, self.coordinator.active(project))

    def _project_clusters(self) -> dict[str, ProjectClusters]:
        return {
            p: ProjectClusters(p, a.primary, a.backup, a.auto_failback)
            for p, a in self._assigned.items()
            if p in self.ctx.registry.snapshot.projects
        }

    async def add_cluster(self, spec: ClusterSpec) -> ClusterStatus:
        validate_name(spec.name, "name")
        validate_name(spec.pool, "pool")
        from mqgate.clusters.pool import cluster_settings

        cluster_settings(self.ctx.settings, spec)  # a bad url: 400 before anything is kept
        await asyncio.to_thread(self.config.add_cluster, spec, now_ms())
        await self.sync()
        return self.cluster(spec.name)

    async def remove_cluster(self, name: str) -> None:
        await asyncio.to_thread(self.config.remove_cluster, name)
        await self.sync()

    def clusters(self) -> list[ClusterStatus]:
        return self.pool.statuses()

    def cluster(self, name: str) -> ClusterStatus:
        return self.pool.get(name).status()

    async def assign(
        self, project: str, primary: str, backup: str | None, auto_failback: bool
    ) -> ProjectFailover:
        if self.ctx.registry.project(project) is None:
            raise NotFound(f"project {project} does not exist", field="project")
        await asyncio.to_thread(self.config.assign, Assignment(project, primary, backup, auto_failback))
        await self.sync()
        return self.project(project)

    def project(self, project: str) -> ProjectFailover:
        a = self._assigned.get(project)
        if a is None:
            raise NotFound(f"project {project} has no clusters", field="project")
        rec = self.coordinator.record(project)
        pending = sum(len(self.spool.head(k, 1_000_000)) for k in self.spool.queues(project))
        return ProjectFailover(
            project,
            a.primary,
            a.backup,
            a.auto_failback,
            None if rec is None else rec.cluster,
            0 if rec is None else rec.epoch,
            "" if rec is None else rec.reason,
            0 if rec is None else rec.changed_ms,
            pending,
            [x.cluster for x in self._left if x.project == project],
        )

    async def failback(self, project: str) -> ProjectFailover:
        self.project(project)  # 404 for a project without clusters
        await self.coordinator.failback(project)
        return self.project(project)

    def spool_stats(self) -> SpoolStats:
        return self.spool.stats()

    # --- around a switch -----------------------------------------------------------------

    async def _declare(self, project: str, cluster: str) -> None:
        target = self.pool.get(cluster).backends
        top = project_topology(self.ctx.registry.snapshot, project)
        await self.pool.guarded(cluster, lambda: redeclare(top, target.store, target.offsets, now_ms()))

    async def _switched(self, event: SwitchEvent) -> None:
        self.history.append(event)
        self.m_switches.labels(event.project, event.after).inc()
        try:
            await self._declare(event.project, event.after)
        except MqgateError as exc:
            log.warning("declaring project %s on %s failed: %s", event.project, event.after, exc)
        if event.won and event.before is not None:
            self._left.append(_Left(event.project, event.before, now_ms()))
        self._left = [x for x in self._left if not (x.project == event.project and x.cluster == event.after)]
        self.ctx.store.wake_all()  # waiting pulls look at the new cluster
        self._kick.set()  # replay the spool there now

    # --- the spool -----------------------------------------------------------------------

    def project_of_topic(self, topic: str) -> str | None:
        return self.router.project_of_topic(topic)

    def must_spool(self, project: str, topic: str, queues: list[int]) -> bool:
        """Earlier produces of one of these queues wait in the spool: order says spool too."""
        return any(self.spool.has_pending(project, topic, str(q)) for q in queues)

    async def spool_produce(
        self, project: str, topic: str, batches: dict[int, list[StoredMessage]], tried: bool
    ) -> None:
        """Keep the messages for a later send (each fsynced before this returns)."""
        appends = [
            self.spool.append(project, topic, str(q), m.msg_id, _ENCODE.encode(m), tried=tried)
            for q, msgs in batches.items()
            for m in msgs
        ]
        await asyncio.gather(*appends)  # started in order: each writes before its first wait
        self.m_spooled.labels(project).inc(len(appends))

    async def replay(self) -> None:
        if self.spool.stats().pending:
            await self.replayer.replay(self._send)

    async def _send(self, key: QueueKey, batch: list[SpoolRecord]) -> None:
        project, topic, queue = key
        cluster = self.coordinator.active(project)
        store = self.pool.get(cluster).backends.store
        msgs = [_DECODE.decode(r.payload) for r in batch]
        await self.pool.guarded(cluster, lambda: store.append(topic, int(queue), msgs))
        self.ctx.store.wake(topic)

    # --- the clusters projects left ------------------------------------------------------

    async def drain_left(self) -> None:
        """Once a left cluster is healthy: release its stale locks, move its consumers' backlog
        to the active cluster, and let it go (it serves again as a primary or backup)."""
        for left in list(self._left):
            source = self.pool.get(left.cluster)
            if source.state is not ClusterState.HEALTHY or not source.opened:
                continue
            active = self.coordinator.active(left.project)
            if active == left.cluster:
                self._left.remove(left)
                continue
            top = project_topology(self.ctx.registry.snapshot, left.project)
            src = source.backends
            dst = self.pool.get(active).backends.store
            t = now_ms()
            cleaned = await clean_up(top, src.store, src.offsets, now_ms=t, locked_before_ms=left.switched_ms)
            report = await drain_backlog(top, src.store, src.offsets, dst, t)
            self.m_drained.labels(left.project).inc(report.total)
            log.warning(
                "project %s: cluster %s drained (%d messages moved to %s, %d locks released, "
                "%d possible duplicates)",
                left.project, left.cluster, report.total, active, len(cleaned.released), report.duplicates,
            )  # fmt: skip
            self._left.remove(left)
            self.ctx.store.wake_all()  # the inboxes have news
