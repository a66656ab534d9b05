"""A bounded set of open files: the least recently used one is closed when more are needed.

The embedded store has one or more files per queue; with thousands of queues, keeping each
open would exhaust the process's file descriptors (`ulimit -n`). A `Handle` is a file that
may be closed at any time by its `FileHandles` and is opened again on its next use. A file
descriptor that the group commit is fsyncing at that moment is closed only after that round.
"""

from __future__ import annotations

import errno
import os
import resource
from collections import OrderedDict
from pathlib import Path
from typing import Final, Protocol

# At most this share of the process's descriptor limit goes to cached files; the rest is left
# for connections, the registry, the journals and the fsync threads.
_SHARE_OF_LIMIT: Final = 2
_MIN_CAPACITY: Final = 16
_MAX_CAPACITY: Final = 4096


class InFlight(Protocol):
    def close_when_synced(self, fd: int) -> bool:
        """Close `fd` once the fsync round that has it is done; False if no round has it."""


def default_capacity() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_CAPACITY
    return max(_MIN_CAPACITY, min(_MAX_CAPACITY, soft // _SHARE_OF_LIMIT))


class FileHandles:
    def __init__(self, capacity: int | None = None, committer: InFlight | None = None) -> None:
        self.capacity = capacity or default_capacity()
        self.committer = committer
        self._open: OrderedDict[int, Handle] = OrderedDict()
        self.reopened = 0  # how often an evicted file was opened again (a sign of thrashing)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def open(self, handle: Handle, flags: int) -> int:
        self._make_room(self.capacity - 1)
        try:
            fd = os.open(handle.path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._open:
                raise
            # Out of descriptors anyway (connections took them): give back half of ours.
            self._make_room(len(self._open) // 2)
            fd = os.open(handle.path, flags, 0o644)
        self._open[id(handle)] = handle
        return fd

    def used(self, handle: Handle) -> None:
        self._open.move_to_end(id(handle))

    def forget(self, handle: Handle) -> None:
        self._open.pop(id(handle), None)

    def _make_room(self, keep: int) -> None:
        while len(self._open) > keep:
            _, oldest = self._open.popitem(last=False)
            oldest.evict()

    def release_fd(self, fd: int) -> None:
        if self.committer is None or not self.committer.close_when_synced(fd):
            os.close(fd)


class Handle:
    """One file, opened with `flags` at first and `reopen_flags` after an eviction."""

    __slots__ = ("_fd", "_handles", "closed", "path", "reopen_flags")

    def __init__(self, path: Path, flags: int, reopen_flags: int, handles: FileHandles | None) -> None:
        self.path = path
        self.reopen_flags = reopen_flags
        self._handles = handles
        self.closed = False
        self._fd = handles.open(self, flags) if handles is not None else os.open(path, flags, 0o644)

    @property
    def fd(self) -> int:
        """The open descriptor (opened again if it was evicted); -1 once closed."""
        if self._fd >= 0:
            if self._handles is not None:
                self._handles.used(self)
            return self._fd
        if self.closed or self._handles is None:
            return -1
        self._fd = self._handles.open(self, self.reopen_flags)
        self._handles.reopened += 1
        return self._fd

    def evict(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0 and self._handles is not None:
            self._handles.release_fd(fd)

    def close(self) -> None:
        self.closed = True
        fd, self._fd = self._fd, -1
        if self._handles is not None:
            self._handles.forget(self)
        if fd >= 0:
            if self._handles is not None:
                self._handles.release_fd(fd)
            else:
                os.close(fd)
