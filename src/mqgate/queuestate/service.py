"""Per-project queue state over time and the project health answer (SPEC P1).

Queue lengths and consumer backlogs are sampled every `queue_state_sample_s`; pulls, acks and
produces are counted on the request path (a dict update each). Intervals are rolled up and
written to the history (mqgate.queuestate) and the health rules (mqgate.queuestate.diagnosis)
read them back.

A probe reads what may have changed (issue 27: it read every topic's bounds and every cluster
consumer's offsets every 5 s, however idle the gateway): the topics this gateway produced to,
delivered due messages to or had acks on since the last probe, and their cluster consumers; every
other queue is confirmed unchanged (`QueueStateSampler.confirm`, O(1)). Followed by the
gateway's record of moves (`follow`: services/changes.py, which hears every move of the embedded
store and offsets, retention, resets and dead letters included), it also reads the topics and
consumers that moved without a hook here, and never needs more. A full probe of every topic and
consumer comes at the first probe after the registry changed, when that record says anything may
have moved, and, for a queue state not following one, every `FULL_PROBE_EVERY_S`. Where moves
go unheard (a Redis store other gateways write too, a project served by a cluster), every probe
is full, as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import msgspec

from mqgate.errors import MqgateError
from mqgate.model import MODE_BROADCAST, MessageInput, QueueBounds
from mqgate.names import INTERNAL_PREFIXES
from mqgate.queuestate.diagnosis import ProjectHealth, Thresholds, diagnose
from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.recorder import QueueStateRecorder
from mqgate.queuestate.rows import ConsumerInterval, ProduceInterval, QueueInterval
from mqgate.queuestate.sampler import NO_QUEUE, QueueStateSampler
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.services.changes import ChangeReader, Changes
from mqgate.services.context import Context, now_ms
from mqgate.services.gateway import Feature
from mqgate.services.observers import Observer

log = logging.getLogger(__name__)

FULL_PROBE_EVERY_S: Final = 60.0


class ProbeCounts(msgspec.Struct):
    rounds: int = 0
    full_rounds: int = 0
    topics_read: int = 0  # store bounds read
    tables_read: int = 0  # consumer offset tables read


class QueueState(Feature, Observer):
    """Counts on the data path through its observer hooks; samples and rolls up in the background."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.sampler = QueueStateSampler(
            interval_s=s.queue_state_interval_s, sample_every_s=s.queue_state_sample_s
        )
        self.history = QueueStateHistory(
            s.index_url("queue-state.sqlite"), retention_s=s.queue_state_retention_s
        )
        self.thresholds = Thresholds()
        self.recorder = QueueStateRecorder(
            self.sampler,
            self.history,
            probe=self._probe,
            on_error=lambda detail: ctx.health.fault("queue_state", "history", detail),
        )
        self.full_probe_every_ms = int(FULL_PROBE_EVERY_S * 1000)
        self.probes = ProbeCounts()
        self._dirty: set[str] = set()  # topics whose queues or backlogs may have moved
        self._last_full_ms: int | None = None
        self._probed_version = -1  # the registry version of the last full probe
        self._cluster_consumers: dict[str, list[ConsumerRecord]] = {}  # by topic, of that version
        self._changes: Changes | None = None
        self._moved: ChangeReader | None = None

    def follow(self, changes: Changes) -> None:
        """Read what moved from `changes` too (before the first probe)."""
        self._changes = changes
        self._moved = changes.reader()

    async def start(self) -> None:
        await self.recorder.start()

    async def stop(self) -> None:
        await self.recorder.stop()

    # --- the data path's hooks (services/observers.py) ----------------------------------

    def produced(self, topic: TopicRecord, count: int) -> None:
        self._dirty.add(topic.name)
        self.sampler.count_produce(topic.project, topic.name, True, None, now_ms(), count)

    def came_due(
        self,
        target: str,
        topic: str,
        by_queue: dict[int, list[tuple[int, bytes]]],
        firsts: dict[int, int],
        appended_ms: int,
    ) -> None:
        self._dirty.add(topic)

    def produce_failed(
        self, producer: ProducerRecord, topic: TopicRecord, messages: list[MessageInput], exc: MqgateError
    ) -> None:
        self.sampler.count_produce(topic.project, topic.name, False, exc.code, now_ms())

    def pulled(self, c: ConsumerRecord, queue: int | None, count: int) -> None:
        t = self.ctx.registry.topic(c.topic)
        if t is not None:
            served = NO_QUEUE if queue is None else queue
            self.sampler.count_pull(t.project, c.name, c.topic, served, count, now_ms())

    def acked(self, c: ConsumerRecord, queue: int, count: int) -> None:
        self._dirty.add(c.topic)
        t = self.ctx.registry.topic(c.topic)
        if t is not None:
            self.sampler.count_ack(t.project, c.name, c.topic, queue, count, now_ms())

    # --- sampling ---------------------------------------------------------------------------

    async def _probe(self, now: int) -> None:
        snap = self.ctx.registry.snapshot
        shared = self.ctx.settings.uses_redis  # other gateways' produces are heard by no hook here
        heard: set[str] = set()  # topics that moved, by the gateway's record
        if self._moved is not None and self._changes is not None:
            moved = self._moved.take()
            exact = self._changes.exact and not moved.everything
            heard = {t for t in moved.topics if not t.startswith(INTERNAL_PREFIXES)}
            for name in moved.consumers:
                c = snap.consumers.get(name)
                if c is not None:
                    heard.add(c.topic)
            due = not exact
        else:
            due = self._last_full_ms is None or now - self._last_full_ms >= self.full_probe_every_ms
        full = shared or due or self._last_full_ms is None or snap.version != self._probed_version
        self.probes.rounds += 1
        if full:
            self.probes.full_rounds += 1
            self._dirty = set()
            self._last_full_ms = now
            if snap.version != self._probed_version:
                self._probed_version = snap.version
                self._cluster_consumers = {}
                for c in snap.consumers.values():
                    if c.mode != MODE_BROADCAST:  # one table (cluster and message mode)
                        self._cluster_consumers.setdefault(c.topic, []).append(c)
            self.sampler.begin_full_round()
            names = [n for n in snap.topics if not n.startswith(INTERNAL_PREFIXES)]
        else:
            names, self._dirty = sorted(self._dirty | heard), set()
        for name in names:
            t = snap.topics.get(name)
            if t is None or t.name.startswith(INTERNAL_PREFIXES):
                continue
            self.probes.topics_read += 1
            found = await self.ctx.store.bounds(t.name)
            for b in found:
                self.sampler.observe_queue(t.project, t.name, b.queue, b.max - b.min, now)
            await self._probe_consumers(t, found, now)
        if not shared:
            self.sampler.confirm(now)  # what was not read did not move

    async def _probe_consumers(self, home: TopicRecord, bounds: list[QueueBounds], now: int) -> None:
        for c in self._cluster_consumers.get(home.name, ()):
            self.probes.tables_read += 1
            table = await self.ctx.offsets.table(c.name, "") or []
            grid = home.grid
            for b in bounds:
                index = grid.table_index(b.queue)
                committed = table[index].committed if index < len(table) else b.min
                backlog = max(b.max - max(committed, b.min), 0)
                self.sampler.observe_backlog(home.project, c.name, home.name, b.queue, backlog, now)
            await asyncio.sleep(0)  # thousands of consumers must not hold up requests

    # --- answers ----------------------------------------------------------------------------

    async def health(self, project: str) -> ProjectHealth:
        now = now_ms()
        interval_ms = int(self.ctx.settings.queue_state_interval_s * 1000)
        since = now - self.thresholds.lookback_ms(interval_ms)
        await self.recorder.flush()  # closed intervals this gateway still holds
        window = await asyncio.to_thread(self.history.window, project, since, now)
        paused = [c.name for c in self.ctx.registry.snapshot.consumers.values() if c.paused]
        return diagnose(window, now, self.thresholds, paused)

    async def queue_page(
        self,
        project: str,
        topic: str | None,
        queue: int | None,
        since_ms: int | None,
        until_ms: int | None,
        *,
        after: tuple[str, int, int] | None,
        limit: int,
    ) -> tuple[list[QueueInterval], bool]:
        """A page of a project's queue intervals (of a topic, a queue) starting in [since_ms,
        until_ms): at most `limit` after the one keyed `after` (topic, queue, start), and
        whether more follow (`QueueStateHistory.queue_page`)."""
        await self.recorder.flush()
        return await asyncio.to_thread(
            self.history.queue_page,
            project,
            topic=topic,
            queue=queue,
            since_ms=since_ms,
            until_ms=until_ms,
            after=after,
            limit=limit,
        )

    async def consumers(
        self, project: str, consumer: str | None, since_ms: int | None, until_ms: int | None
    ) -> list[ConsumerInterval]:
        return await asyncio.to_thread(
            self.history.consumer_history, project, consumer=consumer, since_ms=since_ms, until_ms=until_ms
        )

    async def produce(
        self, project: str, since_ms: int | None, until_ms: int | None
    ) -> list[ProduceInterval]:
        return await asyncio.to_thread(
            self.history.produce_history, project, since_ms=since_ms, until_ms=until_ms
        )
