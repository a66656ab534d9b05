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
from pathlib import Path

import msgspec
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge

from mqgate.core.failure_detection import ClusterState
from mqgate.errors import AlreadyExists, BadRequest, MqgateError, NotFound, Unavailable
from mqgate.failover.config import Assignment, SqlFailoverConfig, parse_clusters
from mqgate.failover.declare import clean_up, consumer_backlog, project_topology, redeclare
from mqgate.failover.drain import drain_backlog
from mqgate.failover.pool import ClusterPool, ClusterSpec, ClusterStatus
from mqgate.failover.replay import NotSent, Replayer
from mqgate.failover.routing import ClusterRouter, latest_call_reached
from mqgate.failover.spool import QueueKey, Spool, SpoolRecord, SpoolStats
from mqgate.failover.switch import ProjectClusters, SqlSwitchRecords, SwitchCoordinator, SwitchEvent
from mqgate.model import StoredMessage
from mqgate.names import validate_name
from mqgate.services.context import Context, now_ms
from mqgate.timeouts import wait_event


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
        self.stranded = Gauge(
            "mqgate_consumer_stranded_messages",
            "A consumer's backlog on a cluster its project left, not drained yet (last measured)",
            ["consumer", "cluster"],
            registry=r,
        )


log = logging.getLogger("mqgate.failover")
DRAIN_CLAIM_MS = 60_000  # a drain claim lapses after this (a gateway that died mid-drain)
# A property of a message resent from the spool after a send that may have stored it already:
# a consumer that has seen its id (unchanged) may drop it (docs/FAILOVER.md, "duplicates").
POSSIBLE_DUPLICATE = "mq.possible_duplicate"
_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder(StoredMessage)


class ProjectFailover(msgspec.Struct, frozen=True):
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


class StrandedBacklog(msgspec.Struct, frozen=True):
    """A consumer's messages left on a cluster its project moved away from, not drained yet:
    not in its lag (measured on the active cluster) until the drain moves them to its inbox."""

    cluster: str
    state: str  # the cluster's state now
    messages: int | None  # None: never measured there
    measured_ms: int  # when (0: never)
    live: bool  # measured just now (the cluster answers); else the last figure from before


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
        router.ready = self.declared_for
        router.make_ready = self.declare_now
        # (project, cluster it left) -> when: to drain once that cluster is healthy again.
        self._left: dict[tuple[str, str], int] = {}
        self.instance = secrets.token_hex(8)  # this gateway, in drain claims
        self.history: deque[SwitchEvent] = deque(maxlen=100)
        self._task: asyncio.Task[None] | None = None
        self.on_event = on_event
        self.on_resent = on_resent
        self._kick = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        # (project, cluster) -> the epoch of the switch record it was last declared there for;
        # a later move there (a higher epoch) declares it again.
        self._declared: dict[tuple[str, str], int] = {}
        self._declaring: dict[tuple[str, str], asyncio.Task[None]] = {}  # under way, shared
        self._unbuilt: set[str] = set()  # clusters in the configuration this gateway cannot build
        self.metrics = FailoverMetrics(ctx.metrics.registry)
        # (consumer, cluster) -> (its backlog there, when measured): measured on each project's
        # clusters every `backlog_every_s`, so a cluster that fails leaves a figure behind.
        self._backlogs: dict[tuple[str, str], tuple[int, int]] = {}
        self.backlog_every_s = 5 * s.failover_check_s
        self._next_measure = 0.0
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
        for declaring in list(self._declaring.values()):
            declaring.cancel()
            with contextlib.suppress(asyncio.CancelledError, MqgateError):
                await declaring
        await self.coordinator.stop()
        await self.pool.stop()
        await self.spool.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await wait_event(self._kick, self.ctx.settings.failover_check_s)
            self._kick.clear()
            started = loop.time()
            try:
                await self.sync()
                await self.declare_pending()
                await self.replay()
                await self.drain_left()
                if loop.time() >= self._next_measure:
                    self._next_measure = loop.time() + self.backlog_every_s
                    await self.measure_backlogs()
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
        self._declared = {d: e for d, e in self._declared.items() if d[0] in config.projects}
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

    async def failback(self, project: str, expected_epoch: int | None = None) -> ProjectFailover:
        """Back to the primary; with `expected_epoch`, only from that move (409 otherwise)."""
        await self.state_of(project)  # 404 for a project without clusters
        await self.coordinator.failback(project, expected_epoch)
        return self.project(project)

    def spool_stats(self) -> SpoolStats:
        return self.spool.stats()

    # --- around a switch -----------------------------------------------------------------

    def declared_for(self, project: str, cluster: str) -> bool:
        """`project` is declared on `cluster` for its current move there (the data path's
        question before each call to a cluster: two dictionary looks)."""
        epoch = self._declared.get((project, cluster))
        if epoch is None:
            return False
        rec = self.coordinator.record(project)
        # A request pinned to the cluster the project just left goes on where it started.
        return rec is None or rec.cluster != cluster or epoch >= rec.epoch

    async def declare_now(self, project: str, cluster: str) -> None:
        """Declare `project` on `cluster` now, for a call that found it not declared there: it
        waits for the declaration under way (one per project and cluster) or starts it.
        Unavailable when it cannot be done now (the cluster does not serve or does not answer,
        or it is not the project's active cluster): 503 and a produce is spooled, not a 404."""
        for _ in range(2):  # a second time when the record moved on while the first ran
            rec = self.coordinator.record(project)
            if rec is None or rec.cluster != cluster:
                raise Unavailable(f"project {project} is not declared on {cluster}, not its active cluster")
            if not self._serving(cluster):
                state = self.pool.get(cluster).state.value
                raise Unavailable(f"project {project} is not declared on cluster {cluster} ({state}) yet")
            await self._declare(project, cluster, rec.epoch)
            if self.declared_for(project, cluster):
                return
        raise Unavailable(f"project {project} is moving between clusters: try again")

    async def _declare(self, project: str, cluster: str, epoch: int) -> None:
        key = (project, cluster)
        task = self._declaring.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._declare_once(project, cluster, epoch), name=f"declare-{project}-{cluster}"
            )
            self._declaring[key] = task

            def done(t: asyncio.Task[None]) -> None:
                if self._declaring.get(key) is t:
                    del self._declaring[key]
                if not t.cancelled():
                    t.exception()  # retrieved: each caller that waited got it already

            task.add_done_callback(done)
        await asyncio.shield(task)  # a caller that gives up does not stop it for the others

    async def _declare_once(self, project: str, cluster: str, epoch: int) -> None:
        target = self.pool.get(cluster).backends
        top = project_topology(self.ctx.registry.snapshot, project)
        try:
            declare = functools.partial(redeclare, top, target.store, target.offsets, now_ms())
            await self.pool.guarded(cluster, declare)
        except MqgateError as exc:
            log.warning("declaring project %s on %s failed (next call or round): %s", project, cluster, exc)
            raise Unavailable(f"project {project} could not be declared on {cluster} yet: {exc}") from exc
        self._declared[project, cluster] = max(epoch, self._declared.get((project, cluster), 0))

    async def declare_pending(self) -> None:
        """Declare each project on its active cluster, once per move there; a cluster that
        cannot be reached now gets it at its next call or round."""
        for project in self._assigned:
            rec = self.coordinator.record(project)
            if rec is None or self.declared_for(project, rec.cluster) or not self._serving(rec.cluster):
                continue
            with contextlib.suppress(Unavailable):
                await self._declare(project, rec.cluster, rec.epoch)

    async def _switched(self, event: SwitchEvent) -> None:
        self.history.append(event)
        self.metrics.switches.labels(event.project, event.after).inc()
        await self.declare_pending()  # calls that came first have forced it already
        if event.before is not None:
            self._left[event.project, event.before] = now_ms()
            self._show_stranded(event.project, event.before)  # its last figures, until drained
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
    ) -> bool:
        """Keep the messages for a later send (fsynced before this returns), all of them or
        none (SpoolFull, or the write's error: nothing of the batch is sent later). `tried`:
        the send that failed may have stored them; not so when it failed before it reached
        the cluster (no active cluster within its lease, not declared there, not opened).
        Returns the records' `tried`: whether they are possible duplicates (their receipts
        say so; their resend is counted and marked)."""
        tried = tried and latest_call_reached()
        records = [
            (project, topic, str(q), m.msg_id, _ENCODE.encode(m)) for q, msgs in batches.items() for m in msgs
        ]
        await self.spool.append_batch(records, tried=tried)
        self.metrics.spooled.labels(project).inc(len(records))
        return tried

    def _serving(self, cluster: str) -> bool:
        c = self.pool.get(cluster)
        return c.opened and c.state in (ClusterState.HEALTHY, ClusterState.SUSPECT)

    async def replay(self) -> None:
        """Resend the spooled produces of each project whose active cluster serves and has the
        project declared (a failing one would only fail the sends and stop the queues)."""
        for project in {k[0] for k in self.spool.queues()}:
            rec = self.coordinator.record(project)
            if rec is not None and self.declared_for(project, rec.cluster) and self._serving(rec.cluster):
                await self.replayer.replay(self._send, project)

    async def _send(self, key: QueueKey, batch: list[SpoolRecord]) -> None:
        project, topic, queue = key
        try:
            cluster = self.coordinator.active(project)  # past its lease: Unavailable
        except MqgateError as exc:
            raise NotSent(exc.message) from exc
        if not self.declared_for(project, cluster):
            raise NotSent(f"project {project} is not declared on {cluster} yet")
        if not self.pool.get(cluster).opened:
            raise NotSent(f"cluster {cluster} of project {project} is not reachable")
        store = self.pool.get(cluster).backends.store
        msgs = [_DECODE.decode(r.payload) for r in batch]
        # Records tried before may be stored already (on this cluster or the one the project
        # left): the copy sent now says so, and its id is kept for the drain into this cluster
        # to skip the copy in the left cluster's topic.
        repeats = [i for i, r in enumerate(batch) if self.spool.is_repeat(r.seq)]
        for i in repeats:
            m = msgs[i]
            msgs[i] = msgspec.structs.replace(m, properties={**m.properties, POSSIBLE_DUPLICATE: "1"})
        first = await self.pool.guarded(cluster, lambda: store.append(topic, int(queue), msgs))
        if repeats:
            ids = [msgs[i].msg_id for i in repeats]
            try:
                await asyncio.to_thread(self.config.record_resent, project, cluster, ids, now_ms())
            except Exception as exc:  # stored all the same: only the drain's dedup misses them
                log.warning("project %s: %d resent ids not recorded: %r", project, len(ids), exc)
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
            if not self.declared_for(project, active):
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
            self._forget_backlogs(project, cluster)
            self.ctx.store.wake_all()  # the inboxes have news

    async def _drain(self, project: str, cluster: str, active: str, switched_ms: int) -> None:
        top = project_topology(self.ctx.registry.snapshot, project)
        await self.pool.get(cluster).connections_ready()
        src = self.pool.get(cluster).backends
        dst = self.pool.get(active).backends.store
        t = now_ms()
        resent = await asyncio.to_thread(self.config.resent_to, project, active)
        cleaned = await clean_up(top, src.store, src.offsets, now_ms=t, locked_before_ms=switched_ms)
        report = await drain_backlog(top, src.store, src.offsets, dst, t, skip=resent)
        self.metrics.drained.labels(project).inc(report.total)
        if report.total or cleaned.released or report.skipped:
            log.warning(
                "project %s: cluster %s drained (%d messages moved to %s, %d locks released, "
                "%d possible duplicates, %d copies of messages resent from a spool skipped)",
                project, cluster, report.total, active, len(cleaned.released), report.duplicates,
                report.skipped,
            )  # fmt: skip
        retention = [tp.retention_ms for tp in top.topics.values()]
        if retention and min(retention) > 0:  # no copy of a message is kept longer than this
            await asyncio.to_thread(self.config.forget_resent, project, t - max(retention))

    # --- backlogs left on other clusters -------------------------------------------------

    async def measure_backlogs(self) -> None:
        """Measure each consumer's backlog on its project's active cluster and on the clusters
        it left that answer (a round, every `backlog_every_s`): the last figure of a cluster
        is what `stranded` shows once it has failed."""
        for project in list(self._assigned):
            rec = self.coordinator.record(project)
            if rec is None:
                continue
            left = {c for p, c in self._left if p == project}
            for cluster in sorted({rec.cluster} | left):
                if cluster == rec.cluster and not self.declared_for(project, cluster):
                    continue
                with contextlib.suppress(MqgateError):
                    await self._measure(project, cluster, None)

    async def stranded(self, consumer: str) -> list[StrandedBacklog]:
        """`consumer`'s backlog on each cluster its project left that is not drained yet:
        measured now where the cluster answers, else the last figure measured there."""
        project = self.router.project_of_group(consumer)
        found: list[StrandedBacklog] = []
        for p, cluster in sorted(self._left):
            if p != project:
                continue
            try:
                live = await self._measure(project, cluster, consumer)
            except MqgateError:
                live = False
            messages, measured_ms = self._backlogs.get((consumer, cluster), (None, 0))
            self._show_stranded(project, cluster, consumer)
            if messages == 0:
                continue
            state = self.pool.get(cluster).state.value
            found.append(StrandedBacklog(cluster, state, messages, measured_ms, live))
        return found

    async def _measure(self, project: str, cluster: str, consumer: str | None) -> bool:
        """Measure the backlog of `consumer` (None: every consumer of the project) on `cluster`
        if it answers; whether it did."""
        c = self.pool.get(cluster)
        if not c.opened or c.state is ClusterState.FAILED:
            return False
        top = project_topology(self.ctx.registry.snapshot, project)
        names = list(top.consumers) if consumer is None else [consumer]
        active = self.coordinator.record(project)
        stranded = active is not None and active.cluster != cluster
        b = c.backends
        for name in names:
            try:
                count = await self.pool.guarded(
                    cluster, functools.partial(consumer_backlog, top, name, b.store, b.offsets)
                )
            except NotFound:  # its topics were never made there: nothing of it is there
                count = 0
            self._backlogs[name, cluster] = (count, now_ms())
            if stranded:
                self._show_stranded(project, cluster, name)
        return True

    def _show_stranded(self, project: str, cluster: str, consumer: str | None = None) -> None:
        """The gauge of what is stranded on `cluster` (a cluster `project` left), from the
        last figures measured there."""
        names = (
            [consumer]
            if consumer is not None
            else project_topology(self.ctx.registry.snapshot, project).consumers
        )
        for name in names:
            count = self._backlogs.get((name, cluster), (0, 0))[0]
            if count:
                self.metrics.stranded.labels(name, cluster).set(count)
            else:
                with contextlib.suppress(KeyError):
                    self.metrics.stranded.remove(name, cluster)

    def _forget_backlogs(self, project: str, cluster: str) -> None:
        """`cluster` was drained for `project`: nothing of its consumers is stranded there."""
        for name in project_topology(self.ctx.registry.snapshot, project).consumers:
            self._backlogs.pop((name, cluster), None)
            with contextlib.suppress(KeyError):
                self.metrics.stranded.remove(name, cluster)
