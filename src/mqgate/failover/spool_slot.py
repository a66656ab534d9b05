"""Which spool directory a gateway process writes: one per process, held by a lock.

The processes of one gateway (`serve --workers N`) share its data directory, and a spool is
written and recovered by one process (its segments' offsets, its marks). Each process takes the
first free slot — `spool/` itself, then `spool/worker-1`, `spool/worker-2`, … — held by an
exclusive lock on the slot's `.lock` for as long as the process lives. A worker that dies gives
its slot back; the worker started in its place (or the next gateway on the directory) takes it
and replays what the dead one had spooled.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Final

from mqgate.errors import StorageError

MAX_SLOTS: Final = 64
LOCK: Final = ".lock"


def claim(base: Path) -> tuple[Path, int]:
    """The first free slot under `base` and the descriptor that holds its lock (closing it
    gives the slot back)."""
    for i in range(MAX_SLOTS):
        directory = base if i == 0 else base / f"worker-{i}"
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return directory, fd
    raise StorageError(f"every spool slot under {base} is held ({MAX_SLOTS} processes)")
