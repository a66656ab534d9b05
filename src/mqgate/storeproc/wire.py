"""Frames between gateway workers and the store process.

A frame is a 4-byte big-endian length and a pickle. The socket is a file in the data
directory (or, when that path is too long for a Unix socket, the temp directory) with mode
0600, and the server admits only peers of its own user (SO_PEERCRED): pickle is for a peer
that could read the data files anyway, never for the network.

Worker → store process: (call id, target, method, args, kwargs), or (call id, CANCEL, "", (), {})
to cancel a call still running (a long poll whose request went away); call id 0 wants no
answer (a wake-up). Store process → worker: (call id, True, value), (call id, False,
exception), or (0, NOTICE, version) for a registry notice.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import struct
import tempfile
from pathlib import Path
from typing import Any, Final, cast

HEADER: Final = struct.Struct(">I")
# A read of a thousand messages of the largest size is far below this; a frame above it is a
# broken peer, not data.
MAX_FRAME_BYTES: Final = 1 << 30

STORE: Final = 0
OFFSETS: Final = 1
SCHEDULER: Final = 2
CONTROL: Final = 3
CANCEL: Final = -1
NOTICE: Final = -2

# Linux's limit on a Unix socket's path (sun_path) is 108 bytes with its terminating zero.
_MAX_SOCKET_PATH: Final = 100


def frame(value: Any) -> bytes:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into decoded frames."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        buffer += data
        out: list[Any] = []
        start = 0
        end = len(buffer)
        with memoryview(buffer) as view:
            while end - start >= 4:
                (size,) = HEADER.unpack_from(view, start)
                if size > MAX_FRAME_BYTES:
                    raise ValueError(f"a frame of {size} bytes (at most {MAX_FRAME_BYTES})")
                if end - start - 4 < size:
                    break
                with view[start + 4 : start + 4 + size] as body:
                    out.append(pickle.loads(body))
                start += 4 + size
        if start:
            del buffer[:start]
        return out


class FramedConnection(asyncio.Protocol):
    """One socket's frames: out, coalesced per turn of the loop (a burst of calls or answers is
    one write); in, cut by a `FrameReader`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader()
        self.out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def send(self, data: bytes) -> None:
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(data)

    def flush(self) -> None:
        out, self.out = self.out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)


def socket_path(data_dir: Path) -> Path:
    """Where the store process of `data_dir` listens."""
    path = Path(data_dir).resolve() / "store.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"mqgate-{os.getuid()}-{digest}.sock"
