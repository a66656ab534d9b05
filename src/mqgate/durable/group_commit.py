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
from typing import Any, Final, Protocol

from mqgate.errors import StorageError
from mqgate.health import Health
from mqgate.timeouts import wait_event

log = logging.getLogger(__name__)


class Syncable(Protocol):
    def sync_fds(self) -> list[int]:
        """The file descriptors to fsync for this object's pending writes."""

    def after_sync(self) -> None:
        """Called on the event loop once the fds returned by `sync_fds` are durable."""


class PendingWriteFailed(StorageError):
    """A round could not write the records that waited for it (a full disk, an I/O error): every
    one of them was taken back, so every writer of the round is refused, none acknowledged."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(f"write failed: {os_error.strerror}")
        self.os_error = os_error


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


class _Round:
    __slots__ = ("closing", "fds")

    def __init__(self) -> None:
        self.fds: set[int] = set()
        self.closing: list[int] = []


class GroupCommitter:
    def __init__(self, interval_ms: int | None, health: Health | None = None) -> None:
        self.interval_ms = interval_ms
        self.health = health or Health()
        self._in_flight: list[_Round] = []  # rounds collecting or fsyncing their fds
        self._dirty: dict[int, Syncable] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._deferred_close: list[Callable[[], None]] = []
        self._before_round: list[Callable[[], None]] = []
        # One round at a time: a flush waits for the round in progress, then runs its own. An
        # item's state between its `sync_fds` and `after_sync` belongs to one round.
        self._one_round = asyncio.Lock()
        self.rounds = 0

    @property
    def waits_for_fsync(self) -> bool:
        return self.interval_ms is None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    def close_when_synced(self, fd: int) -> bool:
        """Close `fd` once the round fsyncing it is done, if one is; False if none is (the
        caller closes it now)."""
        for round_ in reversed(self._in_flight):
            if fd in round_.fds:
                round_.closing.append(fd)
                return True
        return False

    def before_round(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call `hook` at the start of every round, before its files are collected (writes it
        makes ride that round); returns the function that removes it. Hooks must not raise."""
        self._before_round.append(hook)
        return lambda: self._before_round.remove(hook)

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
        """Force one round now, whatever the mode (used on shutdown and checkpoints). Shielded:
        a round cancelled half-way would leave its writers waiting for ever, and its items
        between `sync_fds` and `after_sync`."""
        await asyncio.shield(asyncio.ensure_future(self._flush_round()))

    async def _flush_round(self) -> None:
        async with self._one_round:
            await self._round()

    async def last_round(self, then: Callable[[], None]) -> None:
        """One more round, then `then()` before any other round begins (a store closing its
        files while the committer goes on for others). Shielded, as `flush`."""
        await asyncio.shield(asyncio.ensure_future(self._last_round(then)))

    async def _last_round(self, then: Callable[[], None]) -> None:
        async with self._one_round:
            try:
                await self._round()
            finally:
                then()

    def forget(self, item: Syncable) -> None:
        """An item closed for good: no round collects it any more."""
        self._dirty.pop(id(item), None)

    async def _run(self) -> None:
        while not self._closing:
            if self.interval_ms is None:
                await self._wake.wait()
            else:
                await wait_event(self._wake, self.interval_ms / 1000)
            self._wake.clear()
            try:
                async with self._one_round:
                    await self._round()
            except Exception as exc:
                # The flusher must outlive any one round: writers wait on it, and so does stop().
                log.exception("group commit round failed")
                self.health.fault("group_commit", "round_failed", repr(exc))

    async def _round(self) -> None:
        for hook in self._before_round:
            hook()
        dirty, self._dirty = self._dirty, {}
        waiters, self._waiters = self._waiters, []
        closers, self._deferred_close = self._deferred_close, []
        items = list(dirty.values())
        error: BaseException | None = None
        # Marked as they are collected: opening one file again (a bounded FileHandles) may
        # evict another one collected already, whose close must then wait for this round.
        round_ = _Round()
        self._in_flight.append(round_)
        # Items whose records wait for the round to write them (a queue log with fsync=always),
        # with where those records begin: a failed write takes all of them back.
        waiting: list[tuple[Any, Any]] = []
        writing = True
        syncing = False  # the fsyncs began: a failure now is theirs
        try:
            for item in items:
                unwritten = getattr(item, "unwritten_mark", None)
                mark = unwritten() if unwritten is not None else None
                if mark is not None:
                    waiting.append((item, mark))
                round_.fds.update(item.sync_fds())  # writes what waits first
            writing = False
            if round_.fds:
                syncing = True
                await asyncio.get_running_loop().run_in_executor(None, _fsync_all, list(round_.fds))
        except OSError as exc:  # a write or an fsync failed, or a file could not be opened again
            if writing and waiting:
                error = PendingWriteFailed(exc)
                for item, mark in waiting:
                    try:
                        item.drop_unsynced(mark)
                    except Exception as undo_exc:  # its writers are refused all the same
                        self.health.fault("group_commit", "take_back_failed", repr(undo_exc))
            else:
                error = StorageError(f"fsync failed: {exc.strerror}")
        finally:
            self._in_flight.remove(round_)
            for fd in round_.closing:
                if not self.close_when_synced(fd):  # unless another round still has it
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self.rounds += 1
        if error is None:
            for item in items:
                item.after_sync()
        else:
            kind = "write_failed" if isinstance(error, PendingWriteFailed) else "fsync_failed"
            self.health.fault("group_commit", kind, str(error))
            for key, item in dirty.items():  # their bytes are still to be made durable
                self._dirty.setdefault(key, item)
                failed = getattr(item, "sync_failed", None)
                if failed is not None:
                    failed(syncing)
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
        async with self._one_round:
            await self._round()
