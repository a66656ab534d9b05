"""A message log's record: the offset it was written at, then the message.

Each framed payload (`durable/framing.py`) is `<u8 TAG><u64 offset, little-endian><message>`.
The CRC covers the offset, so a record says where it belongs: a read checks that the index led
it to the record of the offset it asked for, and recovery and `mqgate check --repair` index
each record at its own offset, so a damaged stretch keeps the offsets it held (as a gap) and no
offset after it moves. Records written by format 2 (`data_format.py`) are the message alone, a
JSON object: they carry no offset and are numbered by their place.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from mqgate.durable.framing import HEADER, HEADER_BYTES, frame

TAG: Final = 0x01  # never b"{", the first byte of a format-2 record
_TAG_BYTE: Final = bytes((TAG,))
_JSON_START: Final = ord("{")
_HEAD: Final = struct.Struct("<BQ")
_pack = _HEAD.pack
HEAD_BYTES: Final = _HEAD.size
# The frame's header and the record's head, read in one go by `read_span`.
_FRAME_AND_HEAD: Final = struct.Struct(HEADER.format + _HEAD.format[1:])
_crc32 = zlib.crc32
# What a record adds to its message on disk.
OVERHEAD: Final = HEADER_BYTES + HEAD_BYTES
LEGACY: Final = -1  # a format-2 record: no offset of its own
NOT_A_RECORD: Final = -2  # bytes that passed the CRC but are neither: never served


def framed(first: int, messages: list[bytes]) -> bytes:
    """The records of `messages` at offsets `first`, `first + 1`, … as a segment holds them."""
    return b"".join([frame(_pack(TAG, first + i) + m) for i, m in enumerate(messages)])


def decode(payload: bytes) -> tuple[int, bytes]:
    """(the offset the record carries, its message): LEGACY for a format-2 record,
    NOT_A_RECORD for anything else."""
    if payload[:1] == _TAG_BYTE and len(payload) > HEAD_BYTES:
        return _HEAD.unpack_from(payload)[1], payload[HEAD_BYTES:]
    if payload[:1] == b"{":
        return LEGACY, payload
    return NOT_A_RECORD, payload


def own_offset(payload: bytes) -> int:
    """`decode(payload)[0]` without copying the message (recovery scans whole segments)."""
    if payload[:1] == _TAG_BYTE and len(payload) > HEAD_BYTES:
        offset: int = _HEAD.unpack_from(payload)[1]
        return offset
    return LEGACY if payload[:1] == b"{" else NOT_A_RECORD


def read_span(data: bytes, first: int, stop: int) -> list[tuple[int, bytes]] | None:
    """The messages of offsets `[first, stop)` if `data` is exactly their records, intact and
    in order, each carrying its offset (a format-2 record: the next one); else None, and the
    caller checks each record on its own. Every pull reads through here: one pass, one copy
    of each message, instead of `framing.iter_payloads` and `decode`, which copy it twice."""
    out: list[tuple[int, bytes]] = []
    view = memoryview(data)
    end = len(data)
    unpack = _FRAME_AND_HEAD.unpack_from
    pos = 0
    offset = first
    while pos < end and offset < stop:
        if pos + OVERHEAD > end:
            return None
        length, crc, tag, own = unpack(data, pos)
        body = pos + HEADER_BYTES
        pos = body + length
        if pos > end or _crc32(view[body:pos]) != crc:
            return None
        if tag == TAG and own == offset and length > HEAD_BYTES:
            out.append((offset, data[body + HEAD_BYTES : pos]))
        elif data[body] == _JSON_START:
            out.append((offset, data[body:pos]))
        else:
            return None
        offset += 1
    return out if offset == stop and pos == end else None
