"""Append-only files of framed records: the one place the embedded backends write them.

An `AppendFile` is open for appending at the end of its intact records (`size`). A write
that fails part-way is cut back, so a torn record never sits before records appended later;
the caller decides what the failure means for its writers. A file is made durable by the
owner's group commit (`fd`) or by `sync`; a new file takes its place by `install`. Given a
`FileHandles`, its descriptor may be closed while unused and is opened again when needed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from mqgate.durable.handles import FileHandles, Handle

_WRITE_FLAGS: Final = os.O_WRONLY | os.O_APPEND


class AppendFile:
    __slots__ = ("_handle", "size")

    def __init__(self, handle: Handle, size: int) -> None:
        self._handle = handle
        self.size = size  # where the next record goes: the end of what was written

    @property
    def fd(self) -> int:
        """The file's descriptor (reopened if a bounded `FileHandles` closed it); -1 once closed."""
        return self._handle.fd

    @property
    def path(self) -> Path:
        return self._handle.path

    @classmethod
    def create(cls, path: Path, handles: FileHandles | None = None) -> AppendFile:
        """A new, empty file at `path` (an existing one is emptied)."""
        return cls(Handle(path, _WRITE_FLAGS | os.O_CREAT | os.O_TRUNC, _WRITE_FLAGS, handles), 0)

    @classmethod
    def reopen(cls, path: Path, intact_end: int, handles: FileHandles | None = None) -> AppendFile:
        """Append to an existing file after its first `intact_end` bytes: cut what follows (a
        torn or corrupt tail) and fsync, since a crash may have left the last writes in the
        page cache only."""
        handle = Handle(path, _WRITE_FLAGS, _WRITE_FLAGS, handles)
        try:
            fd = handle.fd
            if os.fstat(fd).st_size > intact_end:
                os.ftruncate(fd, intact_end)
            os.fsync(fd)
        except BaseException:
            handle.close()
            raise
        return cls(handle, intact_end)

    def append(self, data: bytes | memoryview) -> int:
        """Write all of `data` at the end and return its length. On an OSError (a short write
        included: the next one raises) the file is cut back to where it was and the error
        raised."""
        view = memoryview(data)
        done = 0
        fd = self.fd
        try:
            while done < len(view):
                done += os.write(fd, view[done:])
        except OSError:
            # If even this fails, a reader's frame check stops at the torn record instead.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise
        self.size += done
        return done

    def cut_back(self, size: int) -> None:
        """Drop what was appended after `size` (a batch that must not stay half-written)."""
        os.ftruncate(self.fd, size)
        self.size = size

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        self._handle.close()


def write_new(path: Path, pieces: Iterable[bytes | memoryview]) -> AppendFile:
    """Create `path` with these bytes, fsync it and return it open for appending."""
    file = AppendFile.create(path)
    try:
        for piece in pieces:
            file.append(piece)
        file.sync()
    except BaseException:
        file.close()
        raise
    return file


def install(new: Path, path: Path) -> None:
    """Atomically put the fsynced file `new` in place of `path`, durably."""
    os.replace(new, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
