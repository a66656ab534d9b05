"""Record framing: `<u32 payload length><u32 crc32(payload)><payload>`, little-endian.

Every durable file of the embedded backends is a sequence of such records. A reader checks
both fields before trusting a payload, so a torn or corrupt write is detected instead of
served; `iter_payloads` is the one place that check is made. The format is on disk in every
existing data directory: changing it needs a new `FORMAT` of the message store.
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


def framed_size(header: bytes | memoryview, pos: int = 0) -> int:
    """Bytes taken by the record whose header starts at `pos` (header and payload)."""
    length: int = HEADER.unpack_from(header, pos)[0]
    return HEADER_BYTES + length


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
