"""Each gateway's copy of the registry, refreshed periodically and at once after its own changes.

A refresh loads only the rows changed since the copy's version (the registry's change log), so
a registration costs the same with ten consumers or ten thousand; the whole registry is read at
start and when the log cannot tell what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import msgspec

from mqgate.errors import MqgateError
from mqgate.registry.records import (
    DEFAULT_PROJECT,
    ConsumerRecord,
    ProducerRecord,
    ProjectRecord,
    Snapshot,
    TopicRecord,
)
from mqgate.registry.sql import Changes, SqlRegistry

log = logging.getLogger(__name__)

MISS_REFRESH_S: Final = 0.2


class Notices(Protocol):
    """Registry changes announced between gateways as they happen (e.g. Redis pub/sub)."""

    async def start(self, on_notice: Callable[[int], Awaitable[None]]) -> None: ...

    async def announce(self, version: int) -> None: ...

    async def stop(self) -> None: ...


class RegistryCache:
    def __init__(self, registry: SqlRegistry, refresh_s: float, notices: Notices | None = None) -> None:
        self.registry = registry
        self.refresh_s = refresh_s
        self.notices = notices
        self.snapshot = Snapshot(0, {}, {}, {})
        # Each project's topics by name, for one snapshot: made again only after a change, so a
        # page of projects costs its projects' topics, not a pass over every topic per project.
        self._by_project: tuple[Snapshot | None, dict[str, list[TopicRecord]]] = (None, {})
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._miss_refresh_at = -MISS_REFRESH_S
        self._miss_lock = asyncio.Lock()
        # Called after each refresh that changed something (e.g. to make the store topics of new
        # registrations), with the records that changed (and the topics of changed consumers)
        # as a Snapshot (the whole snapshot after a full reload or a failed call), and the
        # records that are gone.
        self.on_change: Callable[[Snapshot, Removed], Awaitable[None]] | None = None
        self.on_change_failures = 0
        self._resync = False  # the last on_change failed: hand the next one everything
        self.full_reloads = 0

    async def start(self) -> None:
        await asyncio.to_thread(self.registry.create_schema)
        await self.refresh(force=True)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="registry-refresh")
        if self.notices is not None:
            await self.notices.start(self._noticed)

    async def _noticed(self, version: int) -> None:
        """Another gateway changed the registry (version -1: maybe; look)."""
        if version < 0 or version > self.snapshot.version:
            try:
                await self.refresh()
            except MqgateError as exc:
                log.warning("registry refresh on notice failed, the next one retries: %s", exc.message)

    async def stop(self) -> None:
        if self.notices is not None:
            await self.notices.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.registry.dispose)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except MqgateError as exc:
                log.warning("registry refresh failed, keeping the cached copy: %s", exc.message)

    async def refresh(self, force: bool = False) -> bool:
        """Catch up with the registry if its version moved; True if it did."""
        async with self._lock:
            found = None
            if not force and self.snapshot.version > 0:
                found = await asyncio.to_thread(self.registry.changes_since, self.snapshot.version)
            if found is not None and found.version == self.snapshot.version:
                if self._resync:
                    await self._apply(self.snapshot)
                return False
            if found is None:
                old = self.snapshot
                self.snapshot = await asyncio.to_thread(self.registry.snapshot)
                self.full_reloads += 1
                changed, removed = self.snapshot, removed_between(old, self.snapshot)
            else:
                self.snapshot, changed = _merged(self.snapshot, found)
                removed = Removed(*(frozenset(k for k, v in d.items() if v is None) for d in _parts(found)))
            await self._apply(self.snapshot if self._resync else changed, removed)
            return True

    async def _apply(self, changed: Snapshot, removed: Removed | None = None) -> None:
        self._resync = False
        if self.on_change is None:
            return
        try:
            await self.on_change(changed, removed or Removed())
        except MqgateError as exc:  # e.g. Redis briefly down: the next refresh retries
            self._resync = True
            self.on_change_failures += 1
            log.warning(
                "applying registry version %d failed (%d so far): %s",
                self.snapshot.version,
                self.on_change_failures,
                exc.message,
            )

    async def refresh_on_miss(self) -> bool:
        """A name was not found: maybe it was just registered through another gateway. Look,
        in a look that starts after the miss (so a registration that came before it is seen),
        and at most one look every MISS_REFRESH_S (so unknown names cannot flood the database):
        misses meanwhile wait for the next look and share it."""
        missed = time.monotonic()
        async with self._miss_lock:
            if self._miss_refresh_at >= missed:
                return True  # a look that started after this miss has ended
            wait = self._miss_refresh_at + MISS_REFRESH_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._miss_refresh_at = time.monotonic()
            await self.refresh()
        return True

    async def change(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Apply a change through the registry and refresh this gateway's copy at once."""
        await asyncio.to_thread(getattr(self.registry, method), *args, **kwargs)
        await self.refresh()
        if self.notices is not None:
            await self.notices.announce(self.snapshot.version)

    def topic(self, name: str) -> TopicRecord | None:
        return self.snapshot.topics.get(name)

    def producer(self, name: str) -> ProducerRecord | None:
        return self.snapshot.producers.get(name)

    def consumer(self, name: str) -> ConsumerRecord | None:
        return self.snapshot.consumers.get(name)

    def paused(self, name: str) -> bool:
        """Whether consumer `name` is paused now: a long poll that began before a pause asks
        when it wakes, and hands out nothing more."""
        found = self.snapshot.consumers.get(name)
        return found is not None and found.paused

    def project(self, name: str) -> ProjectRecord | None:
        return self.snapshot.projects.get(name)

    def topics_in(self, project: str) -> list[TopicRecord]:
        """Every topic of `project` (its trace topic too), by name."""
        snapshot = self.snapshot
        seen, by_project = self._by_project
        if seen is not snapshot:
            by_project = {}
            for t in sorted(snapshot.topics.values(), key=lambda t: t.name):
                by_project.setdefault(t.project or DEFAULT_PROJECT, []).append(t)
            self._by_project = (snapshot, by_project)
        return by_project.get(project, [])


class Removed(msgspec.Struct, frozen=True):
    """The records a refresh found gone, by name."""

    topics: frozenset[str] = frozenset()
    producers: frozenset[str] = frozenset()
    consumers: frozenset[str] = frozenset()
    projects: frozenset[str] = frozenset()
    policies: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.topics or self.producers or self.consumers or self.projects or self.policies)


def removed_between(old: Snapshot, new: Snapshot) -> Removed:
    return Removed(*(frozenset(o.keys() - n.keys()) for o, n in zip(_parts(old), _parts(new), strict=True)))


def _parts(changes: Changes | Snapshot) -> tuple[dict[str, Any], ...]:
    return changes.topics, changes.producers, changes.consumers, changes.projects, changes.policies


def _merged(old: Snapshot, changes: Changes) -> tuple[Snapshot, Snapshot]:
    """(the copy with `changes` applied, the changed records with their consumers' topics).
    New dicts rather than updates in place: a reader may be iterating the old ones."""
    new = Snapshot(
        changes.version, *(_apply_to(o, c) for o, c in zip(_parts(old), _parts(changes), strict=True))
    )
    consumers = {k: v for k, v in changes.consumers.items() if v is not None}
    topics = {k: v for k, v in changes.topics.items() if v is not None}
    for c in consumers.values():
        t = new.topics.get(c.topic)
        if t is not None:
            topics.setdefault(t.name, t)
    producers = {k: v for k, v in changes.producers.items() if v is not None}
    projects = {k: v for k, v in changes.projects.items() if v is not None}
    policies = {k: v for k, v in changes.policies.items() if v is not None}
    return new, Snapshot(changes.version, topics, producers, consumers, projects, policies)


def _apply_to(records: dict[str, Any], changed: dict[str, Any]) -> dict[str, Any]:
    if not changed:
        return records
    out = {**records, **changed}
    for name, rec in changed.items():
        if rec is None:
            del out[name]
    return out
