"""Group commit: many writers, one fsync.

Writers write to their files, mark them dirty and await `durable()`. One flusher task fsyncs
every dirty file in a worker thread and then wakes every writer whose bytes were written
before that fsync began; writes that arrive meanwhile ride the next round. With
`interval_ms` set, writers do not wait and the flusher runs on a timer: a crash may lose the
last interval (documented loss window).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, Protocol

from mqgate.errors import StorageError
from mqgate.health import Health

log = logging.getLogger(__name__)


class Syncable(Protocol):
    def sync_fds(self) -> list[int]:
        """The file descriptors to fsync for this object's pending writes."""

    def after_sync(self) -> None:
        """Called on the event loop once the fds returned by `sync_fds` are durable."""


# fsyncs of different files proceed in parallel on ext4/xfs: a round costs about one fsync,
# not one per dirty file.
_SYNC_THREADS: Final = 8
_pool: Final = ThreadPoolExecutor(_SYNC_THREADS, thread_name_prefix="fsync")


def _fsync_all(fds: list[int]) -> None:
    if len(fds) == 1:
        os.fsync(fds[0])
    else:
        for _ in _pool.map(os.fsync, fds):
            pass


class GroupCommitter:
    def __init__(self, interval_ms: int | None, health: Health | None = None) -> None:
        self.interval_ms = interval_ms
        self.health = health or Health()
        self._fsyncing: frozenset[int] = frozenset()
        self._dirty: dict[int, Syncable] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._deferred_close: list[Callable[[], None]] = []
        self.rounds = 0

    @property
    def waits_for_fsync(self) -> bool:
        return self.interval_ms is None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    def fsyncing(self, fd: int) -> bool:
        """True while the current round fsyncs `fd` (it must not be closed before it ends)."""
        return fd in self._fsyncing

    def mark_dirty(self, item: Syncable) -> None:
        self._dirty[id(item)] = item

    def close_after_next_sync(self, closer: Callable[[], None]) -> None:
        """Close a file only after the flusher is done with it."""
        self._deferred_close.append(closer)
        self._wake.set()

    async def durable(self) -> None:
        """Wait until everything written before this call is on disk (fsync=always)."""
        if self.interval_ms is not None:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake.set()
        await fut

    async def flush(self) -> None:
        """Force one round now, whatever the mode (used on shutdown and checkpoints)."""
        await self._round()

    async def _run(self) -> None:
        while not self._closing:
            if self.interval_ms is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval_ms / 1000)
            self._wake.clear()
            try:
                await self._round()
            except Exception as exc:
                # The flusher must outlive any one round: writers wait on it, and so does stop().
                log.exception("group commit round failed")
                self.health.fault("group_commit", "round_failed", repr(exc))

    async def _round(self) -> None:
        dirty, self._dirty = self._dirty, {}
        waiters, self._waiters = self._waiters, []
        closers, self._deferred_close = self._deferred_close, []
        items = list(dirty.values())
        error: BaseException | None = None
        try:
            fds = [fd for item in items for fd in item.sync_fds()]
        except OSError as exc:  # a file could not be opened again to fsync it
            fds = []
            error = StorageError(f"fsync failed: {exc.strerror}")
        if fds:
            self._fsyncing = frozenset(fds)
            try:
                await asyncio.get_running_loop().run_in_executor(None, _fsync_all, fds)
            except OSError as exc:
                error = StorageError(f"fsync failed: {exc.strerror}")
            finally:
                self._fsyncing = frozenset()
        self.rounds += 1
        if error is None:
            for item in items:
                item.after_sync()
        else:
            self.health.fault("group_commit", "fsync_failed", str(error))
            for key, item in dirty.items():  # their bytes are still to be made durable
                self._dirty.setdefault(key, item)
        for closer in closers:
            try:
                closer()
            except OSError as exc:
                self.health.fault("group_commit", "close_failed", str(exc))
        for fut in waiters:
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)

    async def stop(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self._round()
