"""Record framing: `<u32 payload length><u32 crc32(payload)><payload>`, little-endian.

A reader checks both before trusting a payload, so a torn or corrupt write is detected
instead of served.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Final

HEADER: Final = struct.Struct("<II")
HEADER_BYTES: Final = HEADER.size
# Larger than any record the gateway accepts; a longer length field means a corrupt header.
MAX_PAYLOAD_BYTES: Final = 64 * 1024 * 1024

_crc32 = zlib.crc32
_pack = HEADER.pack


def frame(payload: bytes) -> bytes:
    return _pack(len(payload), _crc32(payload)) + payload


def iter_payloads(buf: bytes | memoryview, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield `(position, payload)` for each intact record from `start`; stop at the first
    record that is torn (too short) or corrupt (bad length or CRC)."""
    end = len(buf)
    unpack = HEADER.unpack_from
    pos = start
    while pos + HEADER_BYTES <= end:
        length, crc = unpack(buf, pos)
        body_start = pos + HEADER_BYTES
        body_end = body_start + length
        if length > MAX_PAYLOAD_BYTES or body_end > end:
            return
        payload = bytes(buf[body_start:body_end])
        if _crc32(payload) != crc:
            return
        yield pos, payload
        pos = body_end
