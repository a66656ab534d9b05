"""The answer to a trace query (SPEC P6): the paths the index holds, and whether they may be
incomplete because the indexer has not yet read everything the store holds; and a bounded sample
of a topic's produce→delivered latencies over time, for the console's charts."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
from collections.abc import Sequence
from typing import Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from mqgate.core.ids import message_id_time_ms
from mqgate.errors import BadRequest, Unavailable
from mqgate.tracing.index import TraceIndex, events
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.paths import MessagePath


class TraceAnswer(msgspec.Struct, frozen=True):
    paths: list[MessagePath]  # one per message, newest first for a request id or key
    may_be_incomplete: bool  # stored trace events are not indexed yet
    index_lag_events: int
    index_lag_ms: int


class TraceQuery:
    def __init__(self, index: TraceIndex, indexer: TraceIndexer | None) -> None:
        self.index = index
        self.indexer = indexer  # None: no indexer in this process, so lag is unknown

    async def find(
        self, *, msg_id: str | None = None, request_id: str | None = None, key: str | None = None
    ) -> TraceAnswer:
        given = {"msgId": msg_id, "requestId": request_id, "key": key}
        named = [name for name, value in given.items() if value is not None]
        if len(named) != 1:
            raise BadRequest("give exactly one of msgId, requestId, key", field="msgId")
        for name in named:
            if not given[name]:
                raise BadRequest(f"{name} is empty", field=name)
        # The lag first: when it is zero, every event stored before the query is in the index
        # the query then reads.
        lag = None if self.indexer is None else await self.indexer.lag_now()
        paths = await asyncio.to_thread(self.index.paths, msg_id=msg_id, request_id=request_id, key=key)
        if lag is None:
            return TraceAnswer(paths, may_be_incomplete=True, index_lag_events=-1, index_lag_ms=-1)
        return TraceAnswer(paths, lag.events > 0, lag.events, lag.time_ms)

    async def latencies(
        self,
        *,
        topic: str,
        consumer: str | None,
        starts: Sequence[int],
        step_ms: int,
        max_bytes: int,
        scan_rows: int | None = None,
    ) -> Latencies:
        """`delivery_latencies` over this index, in a worker thread."""
        return await asyncio.to_thread(
            delivery_latencies,
            self.index,
            topic=topic,
            consumer=consumer,
            starts=starts,
            step_ms=step_ms,
            max_bytes=max_bytes,
            scan_rows=LATENCY_SCAN_ROWS if scan_rows is None else scan_rows,
        )


# --- produce→delivered latency, sampled from the index ----------------------------------------

# Index rows one latency chart scans at most, over all its points (a sample of each point's rows
# where it holds more), and primary-key look-ups per level of the map from time to row id.
LATENCY_SCAN_ROWS: Final = 12_000
TIME_MAP_PROBES: Final = 512
ID_CHARS: Final = 32  # a message id the gateway made (core.ids): its first 12 hex digits, the ms


class _Delivered(msgspec.Struct, rename="camel"):
    """The fields of a stored event the latency needs (the others are skipped, not decoded)."""

    msg_id: str
    hop: str
    time_ms: int
    topic: str
    consumer: str | None = None
    source: str | None = None
    attempt: int | None = None


_decode_delivered: Final = msgspec.json.Decoder(_Delivered).decode


class Latencies(msgspec.Struct, frozen=True):
    """Per point of a chart, the sampled produce→delivered latencies (ms) of first deliveries."""

    points: list[list[int]]
    scanned: int  # index rows the sample covered
    cut: bool  # the sample's bytes reached the byte budget: later rows were not read


def _time_map(conn: sa.Connection, low: int, high: int, probes: int) -> list[tuple[int, int]]:
    """(row id, time) of at most `probes` rows spread evenly over ids [low, high], in id order,
    the times made non-decreasing (an event indexed late must not fold the map)."""
    if high < low:
        return []
    n = min(probes, high - low + 1)
    ids = sorted({low + (high - low) * i // max(n - 1, 1) for i in range(n)})
    rows = conn.execute(
        sa.select(events.c.id, events.c.time_ms).where(events.c.id.in_(ids)).order_by(events.c.id)
    ).all()
    out: list[tuple[int, int]] = []
    top = -1
    for row_id, at in rows:
        top = max(top, int(at))
        out.append((int(row_id), top))
    return out


def _first_at(found: list[tuple[int, int]], at_ms: int, end: int) -> int:
    """The id of the first probed row at or after `at_ms` (`end` if none)."""
    i = bisect.bisect_left([t for _, t in found], at_ms)
    return found[i][0] if i < len(found) else end


def delivery_latencies(
    index: TraceIndex,
    *,
    topic: str,
    consumer: str | None,
    starts: Sequence[int],
    step_ms: int,
    max_bytes: int,
    scan_rows: int = LATENCY_SCAN_ROWS,
) -> Latencies:
    """A sample of the produce→delivered latencies of `topic`'s messages (delivered to
    `consumer`, or to any of its consumers), per point `[start, start + step_ms)` of `starts`:
    each delivered hop the index holds (a first delivery from a queue of the topic: not a
    redelivery, not from a retry queue or inbox), its time less the time its message id carries
    (when the gateway accepted the message).

    Bounded whatever the index holds: the events table has no time index, so a map from time to
    row id is read first (two levels of at most TIME_MAP_PROBES primary-key look-ups), then each
    point reads at most `scan_rows / len(starts)` rows by id range (from the middle of its range
    where it holds more), filtered in the database on the hop and topic; decoding stops once the
    rows read reach `max_bytes`."""
    points: list[list[int]] = [[] for _ in starts]
    if not starts:
        return Latencies(points, 0, False)
    since, until = starts[0], starts[-1] + step_ms
    per_point = max(scan_rows // len(starts), 1)
    try:
        with index.engine.connect() as conn:
            # Two statements: SQLite answers min() or max() of the key from its b-tree's end, but
            # both in one select by scanning the table (70 ms at a million events).
            low = conn.execute(sa.select(sa.func.min(events.c.id))).scalar_one_or_none()
            high = conn.execute(sa.select(sa.func.max(events.c.id))).scalar_one_or_none()
            if low is None or high is None:
                return Latencies(points, 0, False)
            low, high = int(low), int(high)
            coarse = _time_map(conn, low, high, TIME_MAP_PROBES)
            i = bisect.bisect_left([t for _, t in coarse], since)
            first = coarse[i - 1][0] if i > 0 else low
            last = _first_at(coarse, until, high + 1)
            fine = _time_map(conn, first, min(last, high), TIME_MAP_PROBES)
            bounds = [_first_at(fine, at, last) for at in starts] + [last]
            windows = []
            for a, b in itertools.pairwise(bounds):
                if b - a > per_point:  # a sample: the middle of the point's rows
                    a = (a + b - per_point) // 2
                    b = a + per_point
                if b > a:
                    windows.append((a, b))
            if not windows:
                return Latencies(points, 0, False)
            c = events.c
            filters = [
                c.msg_id != "",
                c.event.contains('"hop":"delivered"', autoescape=True),
                c.event.contains(f'"topic":{json.dumps(topic)}', autoescape=True),
            ]
            if consumer is not None:
                filters.append(c.event.contains(f'"consumer":{json.dumps(consumer)}', autoescape=True))
            query = sa.union_all(
                *(sa.select(c.event).where(c.id >= a, c.id < b, *filters) for a, b in windows)
            )
            size = 0
            cut = False
            for (body,) in conn.execute(query):
                size += len(body)
                if size > max_bytes:
                    cut = True
                    break
                try:
                    hop = _decode_delivered(body)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if (
                    hop.hop != "delivered"
                    or hop.topic != topic
                    or (consumer is not None and hop.consumer != consumer)
                    or hop.source is not None
                    or (hop.attempt or 1) > 1
                    or not since <= hop.time_ms < until
                ):
                    continue
                try:  # an id the gateway made carries the time it accepted the message
                    accepted = message_id_time_ms(hop.msg_id) if len(hop.msg_id) == ID_CHARS else -1
                except ValueError:
                    accepted = -1
                if 0 <= accepted <= hop.time_ms:
                    points[(hop.time_ms - since) // step_ms].append(hop.time_ms - accepted)
    except SQLAlchemyError as exc:
        raise Unavailable(f"trace index database error: {exc}") from exc
    return Latencies(points, sum(b - a for a, b in windows), cut)
