"""What the producer spool keeps on disk and reports: its records, marks and figures (see
spool.py for the format and its guarantees)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from mqgate.durable import framing
from mqgate.errors import Unavailable

SEGMENT_SUFFIX: Final = ".spool"
MARKS: Final = "marks.log"
MARK_TRY: Final = 0
MARK_SENT: Final = 1
QueueKey = tuple[str, str, str]  # (project, topic, queue or order key)


class SpoolFull(Unavailable):
    """The spool is at its byte bound: the produce was not taken (503 + Retry-After)."""

    code = "spool_full"
    retry_after_s = 5.0


class SpoolRecord(msgspec.Struct, array_like=True, frozen=True):
    seq: int
    project: str
    topic: str
    key: str
    msg_id: str
    spooled_ms: int
    payload: bytes  # what the produce path needs to send it again; opaque here


class Mark(msgspec.Struct, array_like=True, frozen=True):
    kind: int
    seqs: list[int]


RECORD_DECODER: Final = msgspec.msgpack.Decoder(SpoolRecord)
MARK_DECODER: Final = msgspec.msgpack.Decoder(Mark)
ENCODE: Final = msgspec.msgpack.Encoder().encode


@dataclass(slots=True)
class Entry:
    seq: int
    key: QueueKey
    msg_id: str
    spooled_ms: int
    segment: int  # the first seq of its segment
    pos: int
    end: int


@dataclass(slots=True)
class Segment:
    first_seq: int
    path: Path
    size: int
    pending: int = 0


@dataclass(slots=True, frozen=True)
class SpoolStats:
    pending: int
    pending_bytes: int
    disk_bytes: int
    max_bytes: int
    spooled_total: int  # appended by this process
    resent_total: int  # marked sent by this process
    oldest_age_ms: int  # of the oldest pending record (0 when empty)
    possible_duplicates: int
    torn_tails_cut: int
    corrupt_skipped: int


@dataclass(slots=True)
class Scan:
    """What reading one spool file found: its records (with their byte span), how far it is
    intact, and how many damaged records inside it were skipped."""

    records: list[tuple[int, int, bytes]]  # (start, end, payload) of each intact record
    intact: int
    corrupt: int

    def torn(self, size: int) -> bool:
        return self.intact < size


def scan(data: bytes) -> Scan:
    found = Scan([], 0, 0)
    for pos, end, payload in framing.scan(data):
        found.intact = end
        if payload is None:
            found.corrupt += 1
        else:
            found.records.append((pos, end, payload))
    return found
