"""Record framing: `<u32 payload length><u32 crc32(payload)><payload>`, little-endian.

Every durable file of the embedded backends is a sequence of such records. A reader checks
both fields before trusting a payload, so a torn or corrupt write is detected instead of
served; `iter_payloads` (strict: stops at the first bad record) and `scan` (recovery: skips
a damaged record and goes on with the intact ones after it) are where that check is made.
The format is on disk in every existing data directory: changing it needs a new `FORMAT` of
the message store.
"""

from __future__ import annotations

import re
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
# Where a header may start when resynchronising: its length's most significant byte is at most
# that of MAX_PAYLOAD_BYTES (0x04), 3 bytes after the header's start.
_LENGTH_TOP_BYTE: Final = re.compile(rb"[\x00-\x04]")


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


def payload_from(buf: bytes | memoryview, pos: int = 0) -> tuple[bytes, int] | None:
    """The payload of the record whose header starts at `pos` and where the record ends, or
    None if it is torn (runs past the end of `buf`) or corrupt (a reader that knows where a
    record starts: one bad record costs that record)."""
    if pos + HEADER_BYTES > len(buf):
        return None
    length, crc = HEADER.unpack_from(buf, pos)
    end = pos + HEADER_BYTES + length
    if end > len(buf):
        return None
    payload = bytes(buf[pos + HEADER_BYTES : end])
    return (payload, end) if _crc32(payload) == crc else None


def payload_at(buf: bytes | memoryview, pos: int, end: int) -> bytes | None:
    """The payload of the record that spans `buf[pos:end]` exactly, or None if it fails its
    check."""
    found = payload_from(buf, pos)
    return found[0] if found is not None and found[1] == end else None


def _intact_end(view: memoryview, pos: int, end: int) -> int:
    """Where the record at `pos` ends if it is intact, else -1. No writer frames an empty
    payload, so a zero length (a stretch of zeros, say) counts as damage here."""
    if pos + HEADER_BYTES > end:
        return -1
    length, crc = HEADER.unpack_from(view, pos)
    body_end = pos + HEADER_BYTES + length
    if length == 0 or length > MAX_PAYLOAD_BYTES or body_end > end:
        return -1
    return body_end if _crc32(view[pos + HEADER_BYTES : body_end]) == crc else -1


def _resumes_at(view: memoryview, pos: int, end: int) -> bool:
    """An intact record starts at `pos` and is followed by another one or by the end: one
    chance match inside damaged bytes is not enough to trust."""
    after = _intact_end(view, pos, end)
    return after == end or (after > 0 and _intact_end(view, after, end) > 0)


def _next_intact(view: memoryview, damaged: int, end: int) -> int:
    """Where intact records resume after the damaged record at `damaged`, or -1."""
    if damaged + HEADER_BYTES <= end:
        # Damage inside one record whose length survived: the next one starts where it says.
        length: int = HEADER.unpack_from(view, damaged)[0]
        after = damaged + HEADER_BYTES + length
        if 0 < length <= MAX_PAYLOAD_BYTES and after < end and _resumes_at(view, after, end):
            return after
    for match in _LENGTH_TOP_BYTE.finditer(view, damaged + 4):
        candidate = match.start() - 3
        if candidate + HEADER_BYTES > end:
            break
        if _resumes_at(view, candidate, end):
            return candidate
    return -1


def scan(buf: bytes | memoryview, start: int = 0) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield `(position, end, payload)` for each record from `start`, for recovery. A damaged
    stretch followed by intact records is yielded once with payload None (it stands for one
    record) and the scan goes on after it; damage with no intact record after it is a torn
    tail and is not yielded: the last `end` yielded is where the intact data ends."""
    view = memoryview(buf)
    end = len(view)
    unpack = HEADER.unpack_from
    pos = start
    while pos < end:
        # The intact case inline, as in iter_payloads: this loop reads whole logs at start-up.
        if pos + HEADER_BYTES <= end:
            length, crc = unpack(view, pos)
            body_end = pos + HEADER_BYTES + length
            if 0 < length <= MAX_PAYLOAD_BYTES and body_end <= end:
                payload = bytes(view[pos + HEADER_BYTES : body_end])
                if _crc32(payload) == crc:
                    yield pos, body_end, payload
                    pos = body_end
                    continue
        resume = _next_intact(view, pos, end)
        if resume < 0:
            return
        yield pos, resume, None
        pos = resume
