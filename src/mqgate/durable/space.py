"""Free space: the floor below which new messages are refused, and what a failed write means.

`DiskSpace.check()` costs a `statvfs` at most every `CHECK_EVERY_S` (and at once near the
floor); a write that would go below the floor marks the gateway degraded and raises
`InsufficientStorage` (507), and once space is back the next write clears it: writes resume
by themselves. `write_error` turns the OSError of a failed
write into the error a client gets: 507 for a full disk or quota, 503 for anything else.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Final

from mqgate.errors import InsufficientStorage, MqgateError, StorageError
from mqgate.health import Health

CHECK_EVERY_S: Final = 0.25
CONDITION: Final = "disk_below_floor"
_FULL: Final = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in _FULL


class DiskSpace:
    def __init__(self, path: Path, floor_bytes: int, health: Health) -> None:
        self.path = path
        self.floor_bytes = floor_bytes
        self.health = health
        self._checked_at = -CHECK_EVERY_S
        self._free = -1
        self._written = 0  # by this gateway since the last look
        self._refused_bytes = 0  # the last refused write, while refusing

    def free_bytes(self, fresh: bool = False) -> int:
        now = time.monotonic()
        if fresh or now - self._checked_at >= CHECK_EVERY_S:
            st = os.statvfs(self.path)
            self._free = st.f_bavail * st.f_frsize
            self._checked_at = now
            self._written = 0
            if self._free - self._refused_bytes >= self.floor_bytes:
                self.health.restore(CONDITION)
        return self._free

    def check(self, nbytes: int) -> None:
        """Refuse a write of `nbytes` that would take free space below the floor. Between two
        looks at the file system the bytes written meanwhile are counted, and a write that
        comes near the floor looks again at once, so a burst does not overshoot it."""
        if self.floor_bytes <= 0:
            return
        free = self.free_bytes()
        if free - self._written - nbytes < self.floor_bytes:
            free = self.free_bytes(fresh=True)
        if free - nbytes < self.floor_bytes:
            self._refused_bytes = nbytes
            self.health.fault("disk", "write_refused_below_floor", f"{free} bytes free")
            self.health.degrade(
                CONDITION,
                f"{free} bytes free on {self.path}, at the floor of {self.floor_bytes} "
                "(disk_free_floor_bytes): new messages are refused until space is freed",
            )
            raise InsufficientStorage(
                f"the data directory has {free} bytes free, below the floor of "
                f"{self.floor_bytes} (disk_free_floor_bytes): nothing was stored; retry once "
                "space is freed"
            )
        self._written += nbytes
        self._refused_bytes = 0
        self.health.restore(CONDITION)

    def write_error(self, exc: OSError, component: str, what: str, where: str = "") -> MqgateError:
        """The error for a write that failed (and was cut back): counted, logged, translated."""
        detail = f"{what} {where}: {exc.strerror}" if where else f"{what}: {exc.strerror}"
        if is_disk_full(exc):
            self._checked_at = -CHECK_EVERY_S  # look again at the next write
            self.health.fault(component, "disk_full", detail)
            return InsufficientStorage(
                f"disk full: {what} failed ({exc.strerror}); nothing was stored, retry once space is freed"
            )
        self.health.fault(component, "write_failed", detail)
        return StorageError(f"{what} failed: {exc.strerror}")
