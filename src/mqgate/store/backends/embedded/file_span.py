"""A run of a queue file's records, read by another process: the workers of `serve --workers N`
read a lease's batch from the file the store process names, instead of the store process
reading it and sending it over its socket (a pull's 100 records: the store process's read and
its largest write). The store process names the file by path and inode, and the span by its
first record's frame header (its length and CRC, which covers the message's unique id), so a
file made since under that name (a topic deleted and made again, whose new file may even get
the old inode) is not read; every record is checked as the store's own reads check it (its
CRC, its offset). Whatever does not check out is None: the caller then asks the store process
for the records.
"""

from __future__ import annotations

import os

import msgspec

from mqgate.store.backends.embedded.records import read_span


class FileSpan(msgspec.Struct, frozen=True, array_like=True):
    """Records `[first, end)` of a queue, whole and in order at bytes `[start, stop)` of the
    file at `path` (inode `inode`)."""

    path: str
    inode: int
    start: int
    stop: int
    first: int
    end: int
    head: bytes  # the first record's frame header, as the store process read it


def read_file_span(span: FileSpan) -> list[tuple[int, bytes]] | None:
    """The span's (offset, message) records, or None when the file is gone, is another one, or
    a record fails its check."""
    try:
        fd = os.open(span.path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_ino != span.inode:
            return None
        data = os.pread(fd, span.stop - span.start, span.start)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data.startswith(span.head):
        return None
    return read_span(data, span.first, span.end)
