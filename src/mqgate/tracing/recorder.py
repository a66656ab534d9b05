"""The trace writer: events go to their project's trace topic through the message store.

Each event is the body of one stored message (`StoredMessage`, so a Spark reader of the topic
sees one event per row, in `body`), keyed by the traced message's id and tagged with its hop.

Calls are coalesced like a group commit: whatever arrives while an append is in flight goes
out in the next one, one `append_encoded` per trace topic. `record` returns once the store
holds its events as durably as data (and raises if it could not); `record_nowait` buffers,
is flushed within `flush_interval_ms`, and when the bounded buffer is full drops the events
and counts them. Nothing is dropped without being counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import msgspec

from mqgate.errors import MqgateError, Unavailable
from mqgate.store.interface import Companions, Encoded, MessageStore, TopicConfig
from mqgate.tracing.batch import TraceBatch
from mqgate.tracing.events import TraceEvent, project_of_trace_topic, trace_topic
from mqgate.tracing.rounds import TRACE_PRODUCER, RoundGroup, encode_for_store

__all__ = ["TRACE_PRODUCER", "RecorderCounters", "TraceRecorder", "encode_for_store"]

log = logging.getLogger(__name__)

DEFAULT_RETENTION_MS: Final = 7 * 24 * 3600 * 1000


class RecorderCounters(msgspec.Struct):
    recorded: int = 0  # events the store holds
    dropped: int = 0  # events given up: buffer full, closed, or failed while closing
    append_failures: int = 0  # store appends that failed (their events were retried or raised)
    appends: int = 0  # store appends made (one per trace topic per flush)
    pending: int = 0  # record_nowait events buffered or in flight


class _Item:
    """Encoded events of one call for one topic; `future` is None for record_nowait."""

    __slots__ = ("events", "future", "topic", "weight")

    def __init__(
        self,
        topic: str,
        events: list[tuple[int, Encoded]],
        future: asyncio.Future[None] | None,
        weight: int | None = None,
    ):
        self.topic = topic
        self.events = events  # (queue, (timestamp, payload))
        self.future = future
        self.weight = len(events) if weight is None else weight  # events held (a batch holds many)


class TraceRecorder:
    def __init__(
        self,
        store: MessageStore,
        *,
        flush_interval_ms: int = 50,
        max_pending_events: int = 100_000,
        max_batch_events: int = 10_000,
        queues: int = 1,
        retention_ms: int = DEFAULT_RETENTION_MS,
        retention_bytes: int | None = None,
        on_new_topic: Callable[[str], Awaitable[None]] | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        if flush_interval_ms <= 0 or max_pending_events <= 0 or max_batch_events <= 0 or queues <= 0:
            raise ValueError("flush_interval_ms, max_pending_events, max_batch_events, queues must be > 0")
        self.store = store
        self.flush_interval_s = flush_interval_ms / 1000
        self.max_pending_events = max_pending_events
        self.max_batch_events = max_batch_events
        self.queues = queues
        self.retention_ms = retention_ms
        self.retention_bytes = retention_bytes
        self.on_new_topic = on_new_topic
        self.clock_ms = clock_ms
        self.counters = RecorderCounters()
        self._items: list[_Item] = []
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._known_topics: set[str] = set()
        # The projects of `_known_topics`: a traced produce asks once per request.
        self.known_projects: set[str] = set()
        self._closing = False
        self._rounds: dict[tuple[str, int], RoundGroup] = {}  # open companion groups
        self._project_rounds: dict[str, RoundGroup] = {}  # the same, by project (`join`)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="trace-recorder")

    async def close(self) -> None:
        """Flush what is buffered, then stop; events that still cannot be stored are counted
        as dropped."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake.set()
        if self._flusher is not None:
            await self._flusher
            self._flusher = None
        for item in self._items:  # only if the flusher died
            self._give_up(item, Unavailable("the trace recorder is closed"))
        self._items.clear()

    # --- calls --------------------------------------------------------------------------------

    async def record(self, events: Sequence[TraceEvent | TraceBatch]) -> None:
        """Store `events` and return once they are durable; raises the store's error if the
        append failed (the caller decides whether its request fails with it)."""
        if not events:
            return
        if self._closing:
            raise Unavailable("the trace recorder is closed")
        self.start()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for topic, (encoded, weight) in self._encode(events).items():
            future: asyncio.Future[None] = loop.create_future()
            self._items.append(_Item(topic, encoded, future, weight))
            futures.append(future)
        self._wake.set()
        await asyncio.gather(*futures)

    def record_nowait(self, events: Sequence[TraceEvent | TraceBatch]) -> int:
        """Buffer `events` for the next flush (within `flush_interval_ms`); return how many
        were taken. Those past `max_pending_events` (or after close) are dropped and counted
        (a batch counts as the events it holds)."""
        if not events:
            return 0
        room = 0 if self._closing else max(0, self.max_pending_events - self.counters.pending)
        taken: list[TraceEvent | TraceBatch] = []
        for event in events:
            weight = _weight(event)
            if weight > room:
                self.counters.dropped += weight
                continue
            taken.append(event)
            room -= weight
        if not taken:
            return 0
        self.start()
        for topic, (encoded, weight) in self._encode(taken).items():
            self._items.append(_Item(topic, encoded, None, weight))
            self.counters.pending += weight
        if self._timer is None and not self._wake.is_set():
            self._timer = asyncio.get_running_loop().call_later(self.flush_interval_s, self._on_timer)
        return len(taken)

    def companions(self, batches: Sequence[TraceBatch]) -> Companions:
        """`batches` as companion records of their trace topics, for a caller that writes them
        itself (`MessageStore.append_many_with`): each joins the open `RoundGroup` of its topic
        and queue, which the store seals when it writes the round and which then counts their
        events, or buffers them for a retry if the store refused them (`RoundGroup.written`).
        Their topics must be known (`ensure_topic`)."""
        if len(batches) == 1:
            return self.join(batches[0])
        out: Companions = {}
        for batch in batches:
            group = self._group((trace_topic(batch.project), self._queue_of(batch.first_msg_id)))
            group.add(batch)
            out.setdefault(group.topic, {})[group.queue] = [group]
        return out

    def join(self, batch: TraceBatch) -> Companions:
        """`companions` of one batch, on the hot path of a traced produce: the open group of its
        project, and the companions naming it (the same object for every call the group takes,
        which the store's writer recognises)."""
        group = self.open_group(batch.project, batch.first_msg_id)
        group.add(batch)
        return group.records

    def open_group(self, project: str, msg_id: str) -> RoundGroup:
        """The open round group of `project`'s trace topic, for a produce's records (its
        `records` are the companions naming it; a traced single-message produce joins a run in
        it: tracing.rounds.QueueTracer). `msg_id` picks the trace topic's queue when it has
        several."""
        group = self._project_rounds.get(project)
        if group is None or group.is_sealed or self.queues != 1:
            group = self._group((trace_topic(project), self._queue_of(msg_id)))
            self._project_rounds[project] = group
        return group

    def _group(self, where: tuple[str, int]) -> RoundGroup:
        group = self._rounds.get(where)
        if group is None or group.is_sealed:
            group = self._rounds[where] = RoundGroup(self.clock_ms, *where, self._round_written)
        return group

    def _round_written(self, batches: list[TraceBatch], error: MqgateError | None) -> None:
        """A round group's batches went with their produces' messages (counted), or the store
        refused them: buffered and retried like any trace event, never failing a produce."""
        events = sum(b.event_count for b in batches)
        if error is None:
            self.counters.recorded += events
            return
        self.counters.append_failures += 1
        log.warning(
            "trace records of a round not stored with their produces (%s): %d events buffered for a retry",
            error.message,
            events,
        )
        self.record_nowait(batches)

    def knows(self, topic: str) -> bool:
        return topic in self._known_topics

    async def flush(self) -> None:
        """Return once everything buffered before this call was attempted (tests, shutdown)."""
        self.start()
        marker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._items.append(_Item("", [], marker))
        self._wake.set()
        await marker

    # --- inside -------------------------------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        self._wake.set()

    def _encode(
        self, events: Sequence[TraceEvent | TraceBatch]
    ) -> dict[str, tuple[list[tuple[int, Encoded]], int]]:
        """Per trace topic: the encoded records by queue and how many events they hold."""
        now = self.clock_ms()
        by_topic: dict[str, tuple[list[tuple[int, Encoded]], int]] = {}
        for event in events:
            msg_id = event.first_msg_id if isinstance(event, TraceBatch) else event.msg_id
            weight = _weight(event)
            queue = self._queue_of(msg_id)
            topic = trace_topic(event.project)
            encoded, held = by_topic.get(topic, ([], 0))
            encoded.append((queue, (now, encode_for_store(event, now))))
            by_topic[topic] = (encoded, held + weight)
        return by_topic

    def _queue_of(self, msg_id: str) -> int:
        return 0 if self.queues == 1 else zlib.crc32(msg_id.encode()) % self.queues

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self._items:
                items, self._items = self._items, []
                retry = await self._write(items)
                if retry:
                    # The store failed: the buffered events wait one interval and go again,
                    # ahead of newer ones, unless the recorder is closing.
                    if self._closing:
                        for item in retry:
                            self._give_up(item, Unavailable("the trace store failed while closing"))
                    else:
                        self._items[:0] = retry
                        await asyncio.sleep(self.flush_interval_s)
            if self._closing and not self._items:
                return

    async def _write(self, items: list[_Item]) -> list[_Item]:
        """Append every item, one store append per topic and chunk; return the record_nowait
        items of failed appends (to retry). record() callers get the error at once."""
        by_topic: dict[str, list[_Item]] = {}
        for item in items:
            if item.topic:
                by_topic.setdefault(item.topic, []).append(item)
        results = await asyncio.gather(*(self._write_topic(t, its) for t, its in by_topic.items()))
        for item in items:  # flush markers: everything before them was attempted
            if not item.topic and item.future is not None and not item.future.done():
                item.future.set_result(None)
        return [item for retry in results for item in retry]

    async def _write_topic(self, topic: str, items: list[_Item]) -> list[_Item]:
        retry: list[_Item] = []
        for chunk in _chunks(items, self.max_batch_events):
            batches: dict[int, list[Encoded]] = {}
            count = 0
            for item in chunk:
                for queue, encoded in item.events:
                    batches.setdefault(queue, []).append(encoded)
                count += item.weight
            try:
                await self.ensure_topic(topic)
                self.counters.appends += 1
                await self.store.append_encoded(topic, batches)
            except Exception as exc:
                self.counters.append_failures += 1
                log.warning("trace append to %s failed (%d events): %r", topic, count, exc)
                for item in chunk:
                    if item.future is None:
                        retry.append(item)
                    elif not item.future.done():
                        item.future.set_exception(exc)
                continue
            self.counters.recorded += count
            for item in chunk:
                if item.future is None:
                    self.counters.pending -= item.weight
                elif not item.future.done():
                    item.future.set_result(None)
        return retry

    async def ensure_topic(self, topic: str) -> None:
        """Create the trace topic if this recorder has not seen it (raises the store's error)."""
        if topic in self._known_topics:
            return
        if not self.store.has_topic(topic):
            await self.store.create_topic(
                TopicConfig(topic, self.queues, self.retention_ms, self.retention_bytes)
            )
        if self.on_new_topic is not None:
            await self.on_new_topic(topic)
        self._known_topics.add(topic)
        project = project_of_trace_topic(topic)
        if project is not None:
            self.known_projects.add(project)

    def _give_up(self, item: _Item, exc: Exception) -> None:
        if item.future is None:
            self.counters.pending -= item.weight
            self.counters.dropped += item.weight
            log.warning("trace recorder dropped %d events for %s: %r", item.weight, item.topic, exc)
        elif not item.future.done():
            item.future.set_exception(exc)


def _weight(event: TraceEvent | TraceBatch) -> int:
    return event.event_count if isinstance(event, TraceBatch) else 1


def _chunks(items: list[_Item], max_events: int) -> list[list[_Item]]:
    """Items grouped so that each group holds at most `max_events` events (a single larger
    item stays whole: one call's events go in one append)."""
    chunks: list[list[_Item]] = []
    current: list[_Item] = []
    size = 0
    for item in items:
        if current and size + item.weight > max_events:
            chunks.append(current)
            current, size = [], 0
        current.append(item)
        size += item.weight
    if current:
        chunks.append(current)
    return chunks
