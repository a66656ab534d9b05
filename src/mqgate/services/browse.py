"""Browsing a queue without consuming: from an offset or a time, or searching for a key or a
message id within a bounded number of records (docs/PROTOCOL.md, "Browse")."""

from __future__ import annotations

from typing import Final

import msgspec

from mqgate.errors import BadRequest
from mqgate.model import decode_stored
from mqgate.services.context import Context
from mqgate.services.logread import LogReading

# Records read per store call while searching.
SCAN_CHUNK: Final = 1000


class Query(msgspec.Struct, frozen=True):
    offset: int | None = None
    timestamp_ms: int | None = None
    key: str | None = None
    message_id: str | None = None
    max_count: int = 100
    scan: int = 10_000  # records a key or message-id search reads at most

    @property
    def searching(self) -> bool:
        return self.key is not None or self.message_id is not None

    def check(self) -> None:
        if self.offset is not None and self.timestamp_ms is not None:
            raise BadRequest("give offset or timestamp, not both", field="timestamp")
        if self.key is not None and self.message_id is not None:
            raise BadRequest("give key or messageId, not both", field="messageId")

    def matches(self, raw: bytes) -> bool:
        m = decode_stored(raw)
        return m.msg_id == self.message_id if self.message_id is not None else self.key in m.keys


class Page(msgspec.Struct):
    start: int  # the first offset looked at
    next: int  # where to continue: the offset after the last one looked at
    scanned: int
    records: list[tuple[int, bytes]]  # (offset, stored JSON object)


class Browsing:
    def __init__(self, ctx: Context, log_reading: LogReading) -> None:
        self.ctx = ctx
        self.log_reading = log_reading

    async def browse(self, topic: str, queue: int, q: Query) -> Page:
        q.check()
        bounds = await self.log_reading.bounds(topic)
        if not 0 <= queue < len(bounds):
            raise BadRequest(f"queue must be between 0 and {len(bounds) - 1}", field="queue")
        b = bounds[queue]
        if q.timestamp_ms is not None:
            start = await self.ctx.store.offset_for_time(topic, queue, q.timestamp_ms)
        else:
            start = q.offset if q.offset is not None else b.min
        start = max(start, b.min)
        if not q.searching:
            raw = await self.log_reading.read_within(topic, queue, start, q.max_count)
            first = raw[0][0] if raw else start
            return Page(first, raw[-1][0] + 1 if raw else start, len(raw), raw)
        wanted = 1 if q.message_id is not None else q.max_count
        page = Page(start, start, 0, [])
        settings = self.ctx.settings
        budget = settings.max_answer_bytes
        # Chunks sized from the bytes scanned so far: a search's memory stays near the budget
        # whatever its messages' size; so do the matches it answers (at least one).
        size = kept = 0
        chunk = max(1, budget // settings.max_message_bytes)
        while page.scanned < q.scan and len(page.records) < wanted:
            got = await self.ctx.store.read_raw(
                topic, queue, page.next, min(SCAN_CHUNK, chunk, q.scan - page.scanned)
            )
            if not got:
                break
            for o, raw_record in got:
                if q.matches(raw_record):
                    if page.records and kept + len(raw_record) > budget:
                        return page
                    page.records.append((o, raw_record))
                    kept += len(raw_record)
                page.scanned += 1
                page.next = o + 1
                size += len(raw_record)
                if len(page.records) == wanted:
                    break
            chunk = max(1, int(budget // (size / page.scanned)))
        return page
