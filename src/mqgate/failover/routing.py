"""Per-project store routing (SPEC P8): the gateway's services see one message store and one
offset store; these facades send each call to the cluster the project is active on.

- A topic of a project with clusters (its own topics, its consumers' dead-letter, retry and
  inbox topics) goes to the project's active cluster (`SwitchCoordinator.active`); every other
  topic, the trace topics and projects without clusters go to the gateway's own store.
- An offset call names a consumer group: the group's topic decides. A call with an ack token
  goes to the cluster whose broker name the token carries (the one that served the pull), so a
  batch delivered before a switch is settled where its lock is.
- A request keeps the cluster it started with: inside `request_scope()` (a produce, a pull) the
  first routed call of a project pins that project's cluster until the scope ends, so a switch
  in the middle of a pull cannot lease on one cluster and read on the other, and the broker name
  in a receipt or token is the cluster that did the work. Outside a scope (background jobs)
  every call asks again.
- A project's cluster takes its calls only once the project is declared there for the current
  move (its topics, side topics, inboxes and offset tables: failover/declare.py). The failover
  service answers `ready(project, cluster)` and `make_ready(project, cluster)`: a call that
  finds its project not yet declared on its cluster forces the declaration (one at a time per
  project and cluster, shared by every call waiting for it) and goes on once it is done, or
  gets `Unavailable` (a produce is spooled) when it cannot be done now; never a 404 for a topic
  the switch has not made yet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from mqgate.core.layout import inbox_topic, retry_topic
from mqgate.core.tokens import AckToken
from mqgate.errors import Unavailable
from mqgate.failover.declare import project_topology
from mqgate.offsets.interface import OffsetStore
from mqgate.registry.records import Snapshot
from mqgate.store.interface import MessageStore
from mqgate.store.scope import pins
from mqgate.tracing.events import trace_topic

if TYPE_CHECKING:
    from mqgate.failover.pool import Cluster, ClusterPool

T = TypeVar("T")


def _no_project(project: str) -> str:
    raise Unavailable(f"project {project}'s clusters are not known yet")


# Whether the current task's latest routed call got as far as its cluster's store. False: it
# failed before (no active cluster within its lease, the project not declared there, the
# cluster not opened), so nothing of it can have been stored (not a possible duplicate).
_reached: ContextVar[bool] = ContextVar("mqgate_cluster_call_reached", default=True)


def latest_call_reached() -> bool:
    return _reached.get()


def _always_ready(project: str, cluster: str) -> bool:
    return True


async def _nothing_to_do(project: str, cluster: str) -> None:
    return None


class ClusterRouter:
    def __init__(
        self,
        default_store: MessageStore,
        default_offsets: OffsetStore,
        pool: ClusterPool,
        snapshot: Callable[[], Snapshot],
    ) -> None:
        self.default_store = default_store
        self.default_offsets = default_offsets
        self.pool = pool
        self.snapshot = snapshot
        # project -> its active cluster's name (raises Unavailable past its lease); set by the
        # failover service to its switch coordinator's answer.
        self.active: Callable[[str], str] = _no_project
        # Whether a project is declared on a cluster for its current move there, and the
        # declaration itself (raises Unavailable when it cannot be done now); set by the
        # failover service.
        self.ready: Callable[[str, str], bool] = _always_ready
        self.make_ready: Callable[[str, str], Awaitable[None]] = _nothing_to_do
        self._assigned: frozenset[str] = frozenset()
        self._version = -1
        self._topics: dict[str, str] = {}  # store topic -> project (projects with clusters only)
        self._groups: dict[str, str] = {}  # consumer -> project
        self._listeners: list[Callable[[bool], None]] = []

    def assign(self, projects: Mapping[str, Any]) -> None:
        """The projects that have clusters (from the shared configuration)."""
        names = frozenset(projects)
        if names != self._assigned:
            self._assigned = names
            self._version = -1
            for listener in self._listeners:
                listener(bool(names))

    def on_assign(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(routes_any)` now and whenever the set of projects with clusters changes."""
        self._listeners.append(listener)
        listener(bool(self._assigned))

    def _refresh(self) -> None:
        snap = self.snapshot()
        if snap.version == self._version:
            return
        topics: dict[str, str] = {}
        groups: dict[str, str] = {}
        for project in self._assigned:
            top = project_topology(snap, project)
            for name in top.topics:
                topics[name] = project
            for c in top.consumers:
                groups[c] = project
                topics[retry_topic(c)] = topics[inbox_topic(c)] = project
            topics.pop(trace_topic(project), None)
        self._topics, self._groups, self._version = topics, groups, snap.version

    def project_of_topic(self, topic: str) -> str | None:
        if not self._assigned:
            return None
        self._refresh()
        return self._topics.get(topic)

    def project_of_group(self, group: str) -> str | None:
        if not self._assigned:
            return None
        self._refresh()
        return self._groups.get(group)

    def cluster_for(self, project: str) -> str:
        current = pins.get()
        if current is not None and project in current:
            return current[project]
        cluster = self.active(project)
        if current is not None:
            current[project] = cluster
        return cluster

    def _cluster(self, project: str) -> Cluster:
        cluster = self.pool.get(self.cluster_for(project))
        if not cluster.opened:
            raise Unavailable(f"cluster {cluster.name} of project {project} is not reachable")
        return cluster

    def store_for(self, topic: str) -> tuple[MessageStore, str | None]:
        """The store of `topic` and its cluster's name (None: the gateway's own store)."""
        store, cluster, _ = self.route_topic(topic)
        return store, cluster

    def route_topic(self, topic: str) -> tuple[MessageStore, str | None, str | None]:
        """The store of `topic`, its cluster's name and its project (None, None: the gateway's
        own store)."""
        project = self.project_of_topic(topic)
        if project is None:
            return self.default_store, None, None
        cluster = self._cluster(project)
        store: MessageStore = cluster.backends.store
        return store, cluster.name, project

    def offsets_for(self, group: str) -> tuple[OffsetStore, str | None]:
        offsets, cluster, _ = self.route_group(group)
        return offsets, cluster

    def route_group(self, group: str) -> tuple[OffsetStore, str | None, str | None]:
        project = self.project_of_group(group)
        if project is None:
            return self.default_offsets, None, None
        cluster = self._cluster(project)
        offsets: OffsetStore = cluster.backends.offsets
        return offsets, cluster.name, project

    def offsets_of_token(self, token: AckToken) -> tuple[OffsetStore, str | None]:
        if token.broker == self.default_store.broker:
            return self.default_offsets, None
        for cluster in self.pool.clusters():
            if cluster.settings.broker_name == token.broker:
                if not cluster.opened:
                    raise Unavailable(f"cluster {cluster.name}, which served this batch, is not reachable")
                offsets: OffsetStore = cluster.backends.offsets
                return offsets, cluster.name
        return self.default_offsets, None  # an unknown broker: the default store refuses it

    async def call(self, cluster: str | None, operation: Callable[[], Awaitable[T]]) -> T:
        """Run a store call; on a cluster, within the send time-out and seen by its detector."""
        if cluster is None:
            return await operation()
        return await self.pool.guarded(cluster, operation)

    async def declared(self, project: str | None, cluster: str | None) -> None:
        """Return once `project` is declared on `cluster` for its current move there (at once
        when it is); Unavailable when that cannot be done now."""
        if project is not None and cluster is not None and not self.ready(project, cluster):
            await self.make_ready(project, cluster)

    async def call_for(
        self, project: str | None, cluster: str | None, operation: Callable[[], Awaitable[T]]
    ) -> T:
        """`call`, once the project is declared on the cluster (see the module doc)."""
        if cluster is None:
            _reached.set(True)
            return await operation()
        if project is not None and not self.ready(project, cluster):
            await self.make_ready(project, cluster)
        _reached.set(True)
        return await self.pool.guarded(cluster, operation)

    async def call_topic(self, topic: str, call: Callable[[MessageStore], Awaitable[T]]) -> T:
        """A data-path call on `topic`'s store (`latest_call_reached` tells whether it got there)."""
        _reached.set(False)
        store, cluster, project = self.route_topic(topic)
        return await self.call_for(project, cluster, lambda: call(store))

    async def call_group(self, group: str, call: Callable[[OffsetStore], Awaitable[T]]) -> T:
        _reached.set(False)
        offsets, cluster, project = self.route_group(group)
        return await self.call_for(project, cluster, lambda: call(offsets))

    @property
    def routes_any(self) -> bool:
        """Some project has clusters (else every call is the gateway's own store's)."""
        return bool(self._assigned)

    def broker(self) -> str:
        """The broker of the cluster the current task worked with (the default store's if none)."""
        current = pins.get()
        if current:
            return str(self.pool.get(next(reversed(current.values()))).settings.broker_name)
        return self.default_store.broker

    def opened_stores(self) -> list[MessageStore]:
        return [self.default_store, *(c.backends.store for c in self.pool.clusters() if c.opened)]

    def opened_offsets(self) -> list[OffsetStore]:
        return [self.default_offsets, *(c.backends.offsets for c in self.pool.clusters() if c.opened)]
