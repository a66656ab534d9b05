"""Clusters and failover (SPEC P8, issue 29): the pools and their clusters with health, each
project's primary, backup and active cluster with its switches as a timeline, and a fail-back
that shows first what it moves. Admins only, as the admin API's cluster routes are.

What a gateway keeps of a cluster's probes is the latest one and the counts of the detector's
error window (failover/pool.py, core/failure_detection.py): no probe history, so the page shows
those. The switches are this gateway's (`Failover.history`, the last 100 it made or saw since it
started); a project's current switch record is shared, so it is shown even when this gateway
did not see the switch happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, Final

import msgspec

from mqgate.console.app import Console, now_ms, principal, route, when
from mqgate.console.formats import count, millis
from mqgate.console.pages.common import Pager, paginate, require_admin, snapshot
from mqgate.core.failure_detection import ClusterState
from mqgate.errors import BadRequest, Conflict, MqgateError, NotFound
from mqgate.failover.declare import consumer_backlog, project_topology
from mqgate.failover.pool import PROBE_HISTORY, ClusterStatus, ProbePoint
from mqgate.failover.service import Failover, ProjectFailover
from mqgate.names import INTERNAL_PREFIXES
from mqgate.registry.records import Snapshot
from mqgate.settings import Settings
from mqgate.urls import redact
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

PROJECTS_PER_PAGE: Final = 50
# A preview must not wait on a cluster that hangs (the send time-out is a minute by default).
PREVIEW_MEASURE_S: Final = 2.0
PREVIEW_CONSUMERS: Final = 200  # consumers whose backlog a preview measures, at most
STATE_CLASS: Final = {"healthy": "ok", "suspect": "warn", "recovering": "warn", "failed": "bad"}


def own_store(settings: Settings, admin: bool = True) -> str:
    """The gateway's own store, as the page names it: where it is only to admins (a Redis URL
    without its password), as the admin API shows cluster URLs only to them."""
    if settings.store == "embedded":
        return f"the embedded store in {settings.data_dir}" if admin else "the embedded store"
    return f"Redis {redact(settings.store)}" if admin else "a Redis store"


PROBES_LISTED: Final = 20  # the newest probes a cluster's row lists (its summary covers all kept)


class ClusterRow(msgspec.Struct, frozen=True):
    status: ClusterStatus
    window_outcomes: int  # outcomes (probes and data-path calls) in the detector's window
    window_bad: int
    projects: tuple[str, ...]  # the projects naming it as primary or backup
    history: tuple[ProbePoint, ...] = ()  # the probes the pool keeps, oldest first

    @property
    def latency(self) -> str:
        return millis(self.status.last_probe_latency_ms) if self.status.probes else "—"

    @property
    def newest_probes(self) -> list[ProbePoint]:
        return list(reversed(self.history[-PROBES_LISTED:]))

    @property
    def probe_summary(self) -> str:
        """The kept probes in a line: how many, how many failed, the latency's median and worst."""
        if not self.history:
            return "no probe yet"
        ok = sorted(p.latency_ms for p in self.history if p.outcome == "ok")
        failed = len(self.history) - len(ok)
        since = self.history[0].at_ms
        head = f"{count(len(self.history), 'probe')} since {when(since)}: {count(failed, 'failure')}"
        if not ok:
            return head
        return f"{head}; latency median {millis(ok[len(ok) // 2])}, worst {millis(ok[-1])}"


class Switch(msgspec.Struct, frozen=True):
    """One entry of a project's timeline."""

    epoch: int
    before: str | None  # None: the first choice
    after: str
    reason: str
    changed_ms: int
    seen: str  # "made here", "made by another gateway", or "recorded before this gateway watched"
    to_backup: bool


class ProjectRow(msgspec.Struct, frozen=True):
    state: ProjectFailover
    pool: str | None
    primary_state: str
    active_state: str | None
    switches: list[Switch]

    @property
    def name(self) -> str:
        return self.state.project

    @property
    def failed_over(self) -> bool:
        return self.state.active is not None and self.state.active != self.state.primary


class Backlog(msgspec.Struct, frozen=True):
    consumer: str
    topic: str
    on_source: int | None  # None: not measured
    on_target: int | None


def _state(f: Failover, cluster: str | None) -> str:
    if cluster is None:
        return "—"
    try:
        return f.pool.get(cluster).state.value
    except NotFound:
        return "unknown (not in this gateway's pool)"


def switches_of(f: Failover, state: ProjectFailover) -> list[Switch]:
    """The project's switches this gateway made or saw, oldest first, ending with the current
    record (shared) when this gateway has not seen that switch itself."""
    by_epoch: dict[int, Switch] = {}
    for e in f.history:
        if e.project != state.project:
            continue
        # Two checks of this gateway racing for one epoch (an admin's assign and the loop's)
        # record it twice: the one that wrote it, once.
        if e.epoch in by_epoch and not e.won:
            continue
        seen = "made here" if e.won else "made by another gateway"
        by_epoch[e.epoch] = Switch(
            e.epoch, e.before, e.after, e.reason, e.changed_ms, seen, e.after != state.primary
        )
    out = sorted(by_epoch.values(), key=lambda s: s.epoch)
    if state.active is not None and not any(s.epoch == state.epoch for s in out):
        out.append(
            Switch(
                state.epoch,
                None,
                state.active,
                state.reason,
                state.changed_ms,
                "recorded before this gateway watched",
                state.active != state.primary,
            )
        )
    return out


def project_row(f: Failover, state: ProjectFailover) -> ProjectRow:
    try:
        pool: str | None = f.pool.get(state.primary).spec.pool
    except NotFound:
        pool = None
    return ProjectRow(state, pool, _state(f, state.primary), _state(f, state.active), switches_of(f, state))


def where_it_lives(c: Console, v: Request, project: str) -> dict[str, Any]:
    """What the project page says of where the project's messages are."""
    f = c.platform.failover
    found: ProjectRow | None = None
    with contextlib.suppress(NotFound):  # a project without clusters
        found = project_row(f, f.project(project))
    return {
        "row": found,
        "clusters": len(f.clusters()),
        "store": own_store(c.settings, principal(v).is_admin),
        "href": c.url(f"/clusters?project={project}#project-{project}"),
    }


async def measure(
    f: Failover, project: str, cluster: str | None, consumers: list[str]
) -> tuple[dict[str, int], str]:
    """Each consumer's backlog on `cluster` (counted as its lag is), and why it was not
    measured ("" when it was)."""
    if cluster is None:
        return {}, "no cluster"
    try:
        c = f.pool.get(cluster)
    except NotFound as exc:
        return {}, exc.message
    if not c.opened or c.state is ClusterState.FAILED:
        return {}, f"{cluster} is {c.state.value}{'' if c.opened else ', not opened'}: not measured"
    top = project_topology(snapshot_of(f), project)
    b = c.backends

    async def one(name: str) -> int:
        try:
            return await f.pool.guarded(
                cluster, functools.partial(consumer_backlog, top, name, b.store, b.offsets)
            )
        except NotFound:  # its topics were never made there: nothing of it is there
            return 0

    try:
        async with asyncio.timeout(PREVIEW_MEASURE_S):
            counts = await asyncio.gather(*(one(n) for n in consumers))
    except TimeoutError:
        return {}, f"{cluster} did not answer within {PREVIEW_MEASURE_S:g} s: not measured"
    except MqgateError as exc:
        return {}, f"{cluster}: {exc.message}: not measured"
    except Exception as exc:  # the driver's own error (a connection lost): a preview still shows
        return {}, f"{cluster}: {type(exc).__name__}: {exc}: not measured"
    return dict(zip(consumers, counts, strict=True)), ""


def snapshot_of(f: Failover) -> Snapshot:
    return f.ctx.registry.snapshot


class ClusterPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    @property
    def failover(self) -> Failover:
        return self.c.platform.failover

    def _clusters(self, assigned: dict[str, tuple[str, str | None]]) -> dict[str, list[ClusterRow]]:
        f = self.failover
        t = now_ms()
        by_pool: dict[str, list[ClusterRow]] = {}
        for status in f.clusters():
            outcomes, bad = f.pool.get(status.name).detector.window(t)
            users = tuple(
                p for p, (primary, backup) in sorted(assigned.items()) if status.name in (primary, backup)
            )
            history = tuple(f.pool.get(status.name).history)
            by_pool.setdefault(status.pool, []).append(ClusterRow(status, outcomes, bad, users, history))
        return dict(sorted(by_pool.items()))

    async def _states(self, names: list[str]) -> list[ProjectFailover]:
        f = self.failover
        out = []
        for name in names:
            try:
                out.append(await f.state_of(name))
            except NotFound:  # unassigned since the configuration was read
                continue
        return out

    async def listing(self, v: Request) -> Response:
        require_admin(v)
        f = self.failover
        config = await self.c.db(f.config.read)
        assigned = {p: (a.primary, a.backup) for p, a in config.projects.items()}
        wanted, moved_only = v.arg("q").lower(), v.arg("moved") == "1"
        names = sorted(p for p in assigned if wanted in p.lower())
        if moved_only:
            names = [
                s.project for s in await self._states(names) if s.active is not None and s.active != s.primary
            ]
        at = v.arg("project")
        if at in names and not v.arg("page"):
            shown, pager = self._page_with(v, names, names.index(at))
        else:
            shown, pager = paginate(v, names, PROJECTS_PER_PAGE)
        rows = [project_row(f, s) for s in await self._states(shown)]
        return self.c.page(
            v,
            "clusters.html",
            pools=self._clusters(assigned),
            rows=rows,
            pager=pager,
            assigned=len(assigned),
            q={"q": v.arg("q"), "moved": moved_only},
            at=at,
            window_s=f.pool.rules.window_s,
            probe_every_s=f.pool.probe_interval_s,
            probes_kept=PROBE_HISTORY,
            store=own_store(self.c.settings),
            state_class=STATE_CLASS,
        )

    def _page_with(self, v: Request, names: list[str], index: int) -> tuple[list[str], Pager]:
        """The page that holds names[index] (a link to one project's entry)."""
        per = PROJECTS_PER_PAGE
        page = index // per + 1
        query = tuple(
            (k, val) for k, values in v.query.items() if k not in ("page", "project") for val in values
        )
        pager = Pager(page, max(1, -(-len(names) // per)), len(names), per, "page", query)
        return names[(page - 1) * per : page * per], pager

    async def _plan(self, name: str) -> dict[str, Any]:
        f = self.failover
        state = await f.state_of(name)
        row = project_row(f, state)
        top = project_topology(snapshot(self.c), name)
        consumers = sorted(top.consumers)
        measured = consumers[:PREVIEW_CONSUMERS]
        (source, source_why), (target, target_why) = (
            await asyncio.gather(
                measure(f, name, state.active, measured), measure(f, name, state.primary, measured)
            )
            if row.failed_over
            else (({}, ""), ({}, ""))  # nothing to fail back: the page says so, nothing measured
        )
        backlogs = [Backlog(n, top.consumers[n].topic, source.get(n), target.get(n)) for n in measured]
        # Their consumers' dead-letter, retry and inbox topics move with them (the page says so).
        own = [t for t in top.topics.values() if not t.name.startswith(INTERNAL_PREFIXES)]
        return {
            "row": row,
            "topics": sorted(own, key=lambda t: t.name),
            "queues": sum(t.store_queues for t in own),
            "backlogs": backlogs,
            "unmeasured": len(consumers) - len(measured),
            "source_why": source_why,
            "target_why": target_why,
            "to_drain": None if source_why else sum(b.on_source or 0 for b in backlogs),
        }

    async def preview(self, v: Request) -> Response:
        require_admin(v)
        plan = await self._plan(v.params["name"])
        return self.c.page(v, "failback_confirm.html", **plan, state_class=STATE_CLASS)

    async def failback(self, v: Request) -> Response:
        require_admin(v)
        name = v.params["name"]
        if v.arg("confirmed") != "yes":
            raise BadRequest("a fail-back needs its confirmation: use the preview", field="confirmed")
        f = self.failover
        before = await f.state_of(name)
        if before.active is None or before.active == before.primary:
            raise BadRequest(f"project {name} is on its primary {before.primary} already", field="name")
        if str(before.epoch) != v.arg("epoch"):
            # The preview described another move: what it said would move may no longer hold.
            raise Conflict(
                f"project {name} moved since the preview (epoch {v.arg('epoch') or '?'}, now "
                f"{before.epoch}): look at the preview again",
                field="epoch",
            )
        after = await f.failback(name, before.epoch)  # the store's record, not this view, decides
        await self.c.audit_change(
            v,
            "project.failback",
            name,
            name,
            {"active": before.active, "epoch": before.epoch, "spooled": before.spooled},
            {"active": after.active, "epoch": after.epoch, "reason": after.reason},
        )
        note = f"project {name} failed back from {before.active} to {after.active} (epoch {after.epoch})"
        return redirect(self.c.url(f"/clusters?project={name}&note={note}#project-{name}"))

    def routes(self) -> list[Route]:
        one = "/clusters/projects/{name}/failback"
        return [
            route("GET", "/clusters", self.listing),
            route("POST", one + "/preview", self.preview),
            route("POST", one, self.failback),
        ]
