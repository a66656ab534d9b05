"""Failover between store clusters per project, wired into the gateway (SPEC P8, E7).

Owns the cluster pool (probes), the switch coordinator (which cluster each project writes to,
agreed through the registry's database), the producer spool and its replay, and the steps
around a switch: declare the project on the new cluster, replay the spool there, and once
the cluster it left is healthy again release that cluster's stale locks and drain what its
consumers had not consumed (failover/drain.py). docs/FAILOVER.md has the rules and figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge

from mqgate.core.failure_detection import ClusterState
from mqgate.errors import AlreadyExists, BadRequest, MqgateError, NotFound, Unavailable
from mqgate.failover.config import Assignment, SqlFailoverConfig, parse_clusters
from mqgate.failover.declare import clean_up, project_topology, redeclare
from mqgate.failover.drain import drain_backlog
from mqgate.failover.pool import ClusterPool, ClusterSpec, ClusterStatus
from mqgate.failover.replay import Replayer
from mqgate.failover.routing import ClusterRouter
from mqgate.failover.spool import QueueKey, Spool, SpoolRecord, SpoolStats
from mqgate.failover.switch import ProjectClusters, SqlSwitchRecords, SwitchCoordinator, SwitchEvent
from mqgate.model import StoredMessage
from mqgate.names import validate_name
from mqgate.services.context import Context, now_ms


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


log = logging.getLogger("mqgate.failover")
DRAIN_CLAIM_MS = 60_000  # a drain claim lapses after this (a gateway that died mid-drain)
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


class Failover:
    def __init__(
        self,
        ctx: Context,
        engine: sa.Engine,
        router: ClusterRouter,
        pool: ClusterPool,
        *,
        on_event: Callable[..., None] | None = None,
        on_resent: Callable[[str, int, list[StoredMessage], int, str], None] | None = None,
    ) -> None:
        """`on_event`: told of every switch this gateway made (the alerts' webhook: SPEC P8
        "recorded"); `on_resent`: told of every spooled batch stored at last (its trace hops)."""
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
        # (project, cluster it left) -> when: to drain once that cluster is healthy again.
        self._left: dict[tuple[str, str], int] = {}
        self.instance = secrets.token_hex(8)  # this gateway, in drain claims
        self.history: deque[SwitchEvent] = deque(maxlen=100)
        self._task: asyncio.Task[None] | None = None
        self.on_event = on_event
        self.on_resent = on_resent
        self._kick = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        self._declared: set[tuple[str, str]] = set()  # (project, cluster) declared there
        self._unbuilt: set[str] = set()  # clusters in the configuration this gateway cannot build
        self.metrics = FailoverMetrics(ctx.metrics.registry)
        pool.listen(self._state_changed)

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.config.create_schema)
        await asyncio.to_thread(self.records.create_schema)
        for spec in parse_clusters(self.ctx.settings.failover_clusters):
            with contextlib.suppress(AlreadyExists):
                await asyncio.to_thread(self.config.add_cluster, spec, now_ms())
        await self.spool.open()
        self.metrics.pending.set_function(lambda: self.spool.stats().pending)
        await self.pool.start()
        await self.sync()
        await self.coordinator.start()
        self._check_left_clusters()
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
                await self.declare_pending()
                await self.replay()
                await self.drain_left()
            except Exception as exc:  # the registry or a cluster is away: next round
                self.ctx.health.fault("background", "failover", repr(exc))
                log.warning("failover check failed after %.2fs: %r", loop.time() - started, exc)

    def _state_changed(self, _change: object) -> None:
        """A cluster changed state: check the switches and do this round's work now."""
        self._show_states()
        self.coordinator.notice()
        self._kick.set()  # a cluster came back: replay and drain now

    def _show_states(self) -> None:
        for status in self.pool.statuses():
            for state in ClusterState:
                self.metrics.state.labels(status.name, state.value).set(
                    1 if status.state == state.value else 0
                )
            if status.state == ClusterState.FAILED.value:
                self.ctx.health.degrade(f"cluster {status.name}", status.reason)
            else:
                self.ctx.health.restore(f"cluster {status.name}")

    # --- configuration -------------------------------------------------------------------

    async def sync(self) -> None:
        """Bring this gateway in line with the shared configuration (one at a time: a read
        older than an admin change must not undo it)."""
        async with self._sync_lock:
            await self._sync()

    async def _sync(self) -> None:
        config = await asyncio.to_thread(self.config.read)
        for name in set(self.pool.names()) - set(config.clusters):
            await self.pool.remove(name)
            self.ctx.health.restore(f"cluster {name}")
        for name in self._unbuilt - set(config.clusters):
            self._unbuilt.discard(name)
            self.ctx.health.restore(f"cluster {name}")
        for spec in config.clusters.values():
            if spec.name not in self.pool.names():
                try:
                    await self.pool.add(spec)
                except BadRequest as exc:
                    # Kept by a gateway that can build it (the rows are shared), not by this one
                    # (no Redis driver): shown degraded, logged once, and the rest goes on.
                    self._unbuilt.add(spec.name)
                    self.ctx.health.degrade(f"cluster {spec.name}", exc.message)
        new = [p for p in config.projects if p not in self._assigned]
        self._declared = {d for d in self._declared if d[0] in config.projects}
        self._assigned = config.projects
        self.router.assign(self._assigned)
        self._show_states()
        if new:
            await self.coordinator.check()
        await self.declare_pending()

    def _project_clusters(self) -> dict[str, ProjectClusters]:
        return {
            p: ProjectClusters(p, a.primary, a.backup, a.auto_failback)
            for p, a in self._assigned.items()
            if p in self.ctx.registry.snapshot.projects
        }

    async def add_cluster(self, spec: ClusterSpec) -> ClusterStatus:
        validate_name(spec.name, "name")
        validate_name(spec.pool, "pool")
        from mqgate.failover.pool import cluster_settings

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
            await self.ctx.registry.refresh_on_miss()
        if self.ctx.registry.project(project) is None:
            raise NotFound(f"project {project} does not exist", field="project")
        await asyncio.to_thread(self.config.assign, Assignment(project, primary, backup, auto_failback))
        await self.sync()
        return self.project(project)

    async def state_of(self, project: str) -> ProjectFailover:
        """A project's state; a project assigned through another gateway moments ago is found
        (the shared configuration is read again on a miss)."""
        if project not in self._assigned:
            await self.sync()
        return self.project(project)

    def project(self, project: str) -> ProjectFailover:
        a = self._assigned.get(project)
        if a is None:
            raise NotFound(f"project {project} has no clusters", field="project")
        rec = self.coordinator.record(project)
        pending = self.spool.pending(project)
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
            sorted(c for p, c in self._left if p == project),
        )

    async def failback(self, project: str) -> ProjectFailover:
        await self.state_of(project)  # 404 for a project without clusters
        await self.coordinator.failback(project)
        return self.project(project)

    def spool_stats(self) -> SpoolStats:
        return self.spool.stats()

    # --- around a switch -----------------------------------------------------------------

    async def declare_pending(self) -> None:
        """Declare each project on its active cluster, once per cluster it moves to; a cluster
        that cannot be reached now gets it when it answers (the next round)."""
        for project in self._assigned:
            rec = self.coordinator.record(project)
            if rec is None or (project, rec.cluster) in self._declared:
                continue
            cluster = self.pool.get(rec.cluster)
            if not self._serving(rec.cluster):
                continue
            target = cluster.backends
            top = project_topology(self.ctx.registry.snapshot, project)
            try:
                declare = functools.partial(redeclare, top, target.store, target.offsets, now_ms())
                await self.pool.guarded(rec.cluster, declare)
            except MqgateError as exc:
                log.warning("declaring project %s on %s failed (next round): %s", project, rec.cluster, exc)
                continue
            self._declared.add((project, rec.cluster))

    async def _switched(self, event: SwitchEvent) -> None:
        self.history.append(event)
        self.metrics.switches.labels(event.project, event.after).inc()
        self._declared.discard((event.project, event.after))
        await self.declare_pending()
        if event.before is not None:
            self._left[event.project, event.before] = now_ms()
        self._left.pop((event.project, event.after), None)
        if event.won and event.before is not None and self.on_event is not None:
            self.on_event(
                "project_switched",
                f"project {event.project} moved from {event.before} to {event.after}: {event.reason}",
                project=event.project,
                before=event.before,
                after=event.after,
                epoch=event.epoch,
                reason=event.reason,
            )
        self.ctx.store.wake_all()  # waiting pulls look at the new cluster
        self._kick.set()  # replay the spool there now

    # --- the spool -----------------------------------------------------------------------

    @property
    def routes_any(self) -> bool:
        return self.router.routes_any

    def project_of_topic(self, topic: str) -> str | None:
        return self.router.project_of_topic(topic)

    def must_spool(self, project: str, topic: str, queues: list[int]) -> bool:
        """Earlier produces of one of these queues wait in the spool: order says spool too."""
        return any(self.spool.has_pending(project, topic, str(q)) for q in queues)

    async def spool_produce(
        self, project: str, topic: str, batches: dict[int, list[StoredMessage]], tried: bool
    ) -> None:
        """Keep the messages for a later send (each fsynced before this returns), all of them
        or none (SpoolFull)."""
        records = [
            (project, topic, str(q), m.msg_id, _ENCODE.encode(m)) for q, msgs in batches.items() for m in msgs
        ]
        self.spool.check_room(records)
        appends = [self.spool.append(*r, tried=tried) for r in records]
        await asyncio.gather(*appends)  # started in order: each writes before its first wait
        self.metrics.spooled.labels(project).inc(len(appends))

    def _serving(self, cluster: str) -> bool:
        c = self.pool.get(cluster)
        return c.opened and c.state in (ClusterState.HEALTHY, ClusterState.SUSPECT)

    async def replay(self) -> None:
        """Resend the spooled produces of each project whose active cluster serves and has the
        project declared (a failing one would only fail the sends and stop the queues)."""
        for project in {k[0] for k in self.spool.queues()}:
            rec = self.coordinator.record(project)
            if rec is not None and (project, rec.cluster) in self._declared and self._serving(rec.cluster):
                await self.replayer.replay(self._send, project)

    async def _send(self, key: QueueKey, batch: list[SpoolRecord]) -> None:
        project, topic, queue = key
        cluster = self.coordinator.active(project)
        if (project, cluster) not in self._declared:
            raise Unavailable(f"project {project} is not declared on {cluster} yet")
        store = self.pool.get(cluster).backends.store
        msgs = [_DECODE.decode(r.payload) for r in batch]
        first = await self.pool.guarded(cluster, lambda: store.append(topic, int(queue), msgs))
        self.ctx.store.wake(topic)
        if self.on_resent is not None:
            self.on_resent(topic, int(queue), msgs, first, cluster)

    # --- the clusters projects left ------------------------------------------------------

    def _check_left_clusters(self) -> None:
        """Every cluster of a project that is not its active one may hold a backlog (a switch
        this gateway did not see through, e.g. it was restarted): look at each once."""
        for project, a in self._assigned.items():
            rec = self.coordinator.record(project)
            if rec is None:
                continue
            for cluster in (a.primary, a.backup):
                if cluster is not None and cluster != rec.cluster:
                    self._left.setdefault((project, cluster), rec.changed_ms)

    async def drain_left(self) -> None:
        """Once a left cluster is healthy: release its stale locks, move its consumers' backlog
        to the active cluster, and let it go (it serves again as a primary or backup). One
        gateway at a time drains a cluster (a claim in the shared database)."""
        for (project, cluster), switched_ms in list(self._left.items()):
            source = self.pool.get(cluster)
            active = self.coordinator.active(project)
            if active == cluster:
                del self._left[project, cluster]
                continue
            if source.state is not ClusterState.HEALTHY or not source.opened or not self._serving(active):
                continue
            if (project, active) not in self._declared:
                continue  # the inboxes it drains into are made by the declaration
            t = now_ms()
            claimed = await asyncio.to_thread(
                self.config.claim_drain, project, cluster, self.instance, t, DRAIN_CLAIM_MS
            )
            if not claimed:
                continue  # another gateway drains it; looked at again next round
            try:
                await self._drain(project, cluster, active, switched_ms)
            finally:
                await asyncio.to_thread(self.config.release_drain, project, cluster, self.instance)
            del self._left[project, cluster]
            self.ctx.store.wake_all()  # the inboxes have news

    async def _drain(self, project: str, cluster: str, active: str, switched_ms: int) -> None:
        top = project_topology(self.ctx.registry.snapshot, project)
        src = self.pool.get(cluster).backends
        dst = self.pool.get(active).backends.store
        t = now_ms()
        cleaned = await clean_up(top, src.store, src.offsets, now_ms=t, locked_before_ms=switched_ms)
        report = await drain_backlog(top, src.store, src.offsets, dst, t)
        self.metrics.drained.labels(project).inc(report.total)
        if report.total or cleaned.released:
            log.warning(
                "project %s: cluster %s drained (%d messages moved to %s, %d locks released, "
                "%d possible duplicates)",
                project, cluster, report.total, active, len(cleaned.released), report.duplicates,
            )  # fmt: skip
