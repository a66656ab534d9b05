"""Which cluster each project writes to, agreed by every gateway (SPEC P8).

The shared switch record, one row per project in `mqgate_project_active(project, cluster,
epoch, reason, changed_ms)`, names the project's active cluster. It changes only by
compare-and-set on `epoch`, so of two gateways that switch a project at once exactly one wins
and the other adopts its choice. Each gateway's `SwitchCoordinator` reads every row every
`check_s` (and at once on `notice()`), decides from its own view of the clusters' states
(`core.failure_detection.choose_active`) and writes a switch when its view says so.

The bound. A gateway uses a row it read for at most `lease_s` (default 2 x check_s) measured
on its own monotonic clock from the moment it *started* that read; past that, `active()` raises
`Unavailable` and the caller spools. A switch committed at time T was not yet visible to reads
started before T, and those views expire before T + lease_s. Hence no gateway starts a write
of a project to the old cluster later than `lease_s` after the switch: two gateways write one
project to different clusters for at most `lease_s` (a write already in flight may still land
up to the send time-out later; it is stored on the old cluster and drained from there). No
clock is shared between gateways: only durations on each one's own clock matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import msgspec
import sqlalchemy as sa

from mqgate.core.failure_detection import ClusterState, choose_active
from mqgate.errors import BadRequest, Conflict, NotFound, Unavailable
from mqgate.sqlschema import create_all_shared
from mqgate.timeouts import wait_event

T = TypeVar("T")
log = logging.getLogger("mqgate.failover")

metadata = sa.MetaData()
project_active = sa.Table(
    "mqgate_project_active",
    metadata,
    sa.Column("project", sa.String(128), primary_key=True),
    sa.Column("cluster", sa.String(128), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.String(1024), nullable=False),
    sa.Column("changed_ms", sa.BigInteger, nullable=False),
)


class ActiveRecord(msgspec.Struct, frozen=True):
    project: str
    cluster: str
    epoch: int  # 1 for the first choice, +1 at every switch
    reason: str
    changed_ms: int


class SwitchRecords(Protocol):
    """The shared record of each project's active cluster. Blocking calls (run in a thread)."""

    def read_all(self) -> dict[str, ActiveRecord]: ...

    def compare_and_set(
        self, project: str, expected_epoch: int, cluster: str, reason: str, changed_ms: int
    ) -> ActiveRecord | None:
        """Write epoch `expected_epoch + 1` if the row is still at `expected_epoch` (0: no row
        yet); the new record, or None when another writer got there first."""


class SqlSwitchRecords:
    """`SwitchRecords` in a SQL database (SQLite or PostgreSQL), e.g. the registry's."""

    def __init__(self, url_or_engine: str | sa.Engine) -> None:
        if isinstance(url_or_engine, sa.Engine):
            self.engine = url_or_engine  # e.g. the registry's: one connection pool, not two
        else:
            self.engine = sa.create_engine(url_or_engine, pool_pre_ping=True)

    def create_schema(self) -> None:
        create_all_shared(metadata, self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    def read_all(self) -> dict[str, ActiveRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(project_active)).all()
        return {r.project: ActiveRecord(r.project, r.cluster, r.epoch, r.reason, r.changed_ms) for r in rows}

    def compare_and_set(
        self, project: str, expected_epoch: int, cluster: str, reason: str, changed_ms: int
    ) -> ActiveRecord | None:
        new = ActiveRecord(project, cluster, expected_epoch + 1, reason[:1024], changed_ms)
        values = {"cluster": cluster, "epoch": new.epoch, "reason": new.reason, "changed_ms": changed_ms}
        try:
            with self.engine.begin() as conn:
                if expected_epoch == 0:
                    conn.execute(sa.insert(project_active).values(project=project, **values))
                    return new
                done = conn.execute(
                    sa.update(project_active)
                    .where(project_active.c.project == project, project_active.c.epoch == expected_epoch)
                    .values(**values)
                )
                return new if done.rowcount == 1 else None
        except sa.exc.IntegrityError:
            return None  # another gateway inserted the first row


class ProjectClusters(msgspec.Struct, frozen=True):
    project: str
    primary: str
    backup: str | None = None
    auto_failback: bool = False

    def __post_init__(self) -> None:
        if self.backup is not None and self.backup == self.primary:
            raise BadRequest(f"the backup of project {self.project} is its primary", field="backup")


class SwitchEvent(msgspec.Struct, frozen=True):
    project: str
    before: str | None
    after: str
    epoch: int
    reason: str
    won: bool  # this gateway wrote it (False: adopted another gateway's switch)
    changed_ms: int = 0  # the switch record's time (shared by every gateway), for the console's timeline


class _View(msgspec.Struct):
    record: ActiveRecord
    read_at: float  # monotonic time the read that saw it started


class SwitchCoordinator:
    def __init__(
        self,
        records: SwitchRecords,
        states: Callable[[], Mapping[str, ClusterState]],
        projects: Callable[[], Mapping[str, ProjectClusters]],
        *,
        check_s: float = 1.0,
        lease_s: float | None = None,
        min_dwell_s: float = 60.0,
        on_switch: Callable[[SwitchEvent], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.records = records
        self.states = states
        self.projects = projects
        self.check_s = check_s
        self.lease_s = lease_s if lease_s is not None else 2 * check_s
        if self.lease_s < check_s:
            raise ValueError("lease_s must be at least check_s, or every view expires between reads")
        self.min_dwell_s = min_dwell_s  # no automatic fail-back sooner than this after a switch
        self.on_switch = on_switch
        self.clock = clock
        self._views: dict[str, _View] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_threads: set[asyncio.Future[Any]] = set()  # database calls under way
        self.checks = 0
        self.failed_checks = 0

    # --- what the data path asks ---------------------------------------------------------

    def active(self, project: str) -> str:
        """The cluster to write `project` to now. NotFound for a project never read;
        Unavailable when this gateway's view is older than the lease (spool instead)."""
        view = self._views.get(project)
        if view is None:
            raise NotFound(f"project {project} has no active cluster yet", field="project")
        age = self.clock() - view.read_at
        if age >= self.lease_s:
            raise Unavailable(
                f"the active cluster of project {project} was last read {age:.1f}s ago, past the "
                f"{self.lease_s:g}s lease: not writing until the switch record is read again"
            )
        return view.record.cluster

    def record(self, project: str) -> ActiveRecord | None:
        view = self._views.get(project)
        return None if view is None else view.record

    # --- the loop --------------------------------------------------------------------------

    def notice(self) -> None:
        """Check now (a cluster changed state here, or another gateway announced a switch)."""
        self._wake.set()

    async def start(self) -> None:
        await self.check()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="switch-coordinator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # A cancelled check leaves its database call running in its thread: wait for it, so
        # the caller's `records.dispose()` finds every connection back in the pool.
        await asyncio.gather(*self._in_threads, return_exceptions=True)

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        done = asyncio.ensure_future(asyncio.to_thread(call, *args))
        self._in_threads.add(done)
        done.add_done_callback(self._in_threads.discard)
        return await asyncio.shield(done)

    async def _run(self) -> None:
        last = self.clock()
        while True:
            # Reads start every check_s (not check_s after the last one ended): a slow read
            # does not push the next one past the lease.
            await wait_event(self._wake, self.check_s - (self.clock() - last))
            self._wake.clear()
            last = self.clock()
            try:
                await self.check()
            except Exception as exc:  # the database is away: views expire, the caller spools
                self.failed_checks += 1
                log.warning("switch check failed: %s", exc)

    async def check(self) -> list[SwitchEvent]:
        """Read every project's record, switch those this gateway's view says to; the events."""
        read_at = self.clock()
        found = await self._in_thread(self.records.read_all)
        states = self.states()
        events: list[SwitchEvent] = []
        for project, clusters in self.projects().items():
            rec = found.get(project)
            now_ms = int(time.time() * 1000)
            dwelt = rec is None or now_ms - rec.changed_ms >= self.min_dwell_s * 1000
            choice = choose_active(
                primary=clusters.primary,
                backup=clusters.backup,
                current=None if rec is None else rec.cluster,
                states=states,
                auto_failback=clusters.auto_failback and dwelt,
            )
            if rec is None or choice.switched:
                rec, event = await self._write(project, rec, choice.cluster, choice.reason)
                events.append(event)
            else:
                old = self._views.get(project)
                if old is not None and old.record.epoch < rec.epoch:
                    events.append(
                        SwitchEvent(
                            project,
                            old.record.cluster,
                            rec.cluster,
                            rec.epoch,
                            rec.reason,
                            False,
                            rec.changed_ms,
                        )
                    )
            self._views[project] = _View(rec, read_at)
        self.checks += 1
        for event in events:
            log.warning(
                "project %s: %s -> %s (epoch %d, %s)%s",
                event.project, event.before, event.after, event.epoch, event.reason,
                "" if event.won else " by another gateway",
            )  # fmt: skip
            if self.on_switch is not None:
                await self.on_switch(event)
        return events

    async def _write(
        self, project: str, rec: ActiveRecord | None, cluster: str, reason: str
    ) -> tuple[ActiveRecord, SwitchEvent]:
        before = None if rec is None else rec.cluster
        expected = 0 if rec is None else rec.epoch
        now_ms = int(time.time() * 1000)
        new = await self._in_thread(self.records.compare_and_set, project, expected, cluster, reason, now_ms)
        if new is not None:
            return new, SwitchEvent(project, before, cluster, new.epoch, reason, True, new.changed_ms)
        # Another gateway switched first: take its record (read again, it is newer than ours).
        latest = (await self._in_thread(self.records.read_all))[project]
        return latest, SwitchEvent(
            project, before, latest.cluster, latest.epoch, latest.reason, False, latest.changed_ms
        )

    async def switch_to(
        self, project: str, cluster: str, reason: str, expected_epoch: int | None = None
    ) -> ActiveRecord:
        """An operator's switch (e.g. a manual fail-back to the primary): written at once. With
        `expected_epoch`, only from that move: one another gateway made since the operator
        looked is refused (409), not undone unseen."""
        clusters = self.projects().get(project)
        if clusters is None:
            raise NotFound(f"no project named {project!r}", field="project")
        if cluster not in (clusters.primary, clusters.backup):
            raise BadRequest(f"{cluster} is neither primary nor backup of {project}", field="cluster")
        read_at = self.clock()
        rec = (await self._in_thread(self.records.read_all)).get(project)
        if expected_epoch is not None and (rec.epoch if rec is not None else 0) != expected_epoch:
            now = rec.epoch if rec is not None else 0
            raise Conflict(
                f"project {project} moved since (epoch {expected_epoch}, now {now}): look again",
                field="epoch",
            )
        if rec is not None and rec.cluster == cluster:
            self._views[project] = _View(rec, read_at)
            return rec  # already there (a retried request, or another gateway's): no new epoch
        new, event = await self._write(project, rec, cluster, reason)
        self._views[project] = _View(new, read_at)
        if self.on_switch is not None:
            await self.on_switch(event)
        return new

    async def failback(self, project: str, expected_epoch: int | None = None) -> ActiveRecord:
        clusters = self.projects().get(project)
        if clusters is None:
            raise NotFound(f"no project named {project!r}", field="project")
        return await self.switch_to(project, clusters.primary, "manual fail-back", expected_epoch)
