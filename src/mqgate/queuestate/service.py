"""Per-project queue state over time and the project health answer (SPEC P1).

Queue lengths and consumer backlogs are sampled every `queue_state_sample_s` (one store read per
topic and one table read per cluster consumer); pulls, acks and produces are counted on the
request path (a dict update each). Intervals are rolled up and written to the history
(mqgate.queuestate) and the health rules (mqgate.queuestate.diagnosis) read them back.
"""

from __future__ import annotations

import asyncio
import logging

from mqgate.errors import MqgateError
from mqgate.model import MODE_CLUSTER, MessageInput, QueueBounds
from mqgate.names import INTERNAL_PREFIXES
from mqgate.queuestate.diagnosis import ProjectHealth, Thresholds, diagnose
from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.recorder import QueueStateRecorder
from mqgate.queuestate.rows import ConsumerInterval, ProduceInterval, QueueInterval
from mqgate.queuestate.sampler import NO_QUEUE, QueueStateSampler
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.gateway import Feature
from mqgate.services.observers import Observer

log = logging.getLogger(__name__)


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

    async def start(self) -> None:
        await self.recorder.start()

    async def stop(self) -> None:
        await self.recorder.stop()

    # --- the data path's hooks (services/observers.py) ----------------------------------

    def produced(self, topic: TopicRecord, count: int) -> None:
        self.sampler.count_produce(topic.project, topic.name, True, None, now_ms(), count)

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
        t = self.ctx.registry.topic(c.topic)
        if t is not None:
            self.sampler.count_ack(t.project, c.name, c.topic, queue, count, now_ms())

    # --- sampling ---------------------------------------------------------------------------

    async def _probe(self, now: int) -> None:
        snap = self.ctx.registry.snapshot
        bounds: dict[str, list[QueueBounds]] = {}
        for t in list(snap.topics.values()):
            if t.name.startswith(INTERNAL_PREFIXES):
                continue
            found = bounds[t.name] = await self.ctx.store.bounds(t.name)
            for b in found:
                self.sampler.observe_queue(t.project, t.name, b.queue, b.max - b.min, now)
        for c in list(snap.consumers.values()):
            home = snap.topics.get(c.topic)
            if c.mode != MODE_CLUSTER or home is None or home.name not in bounds:
                continue
            table = await self.ctx.offsets.table(c.name, "") or []
            grid = home.grid
            for b in bounds[home.name]:
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

    async def queues(
        self, project: str, topic: str | None, queue: int | None, since_ms: int | None, until_ms: int | None
    ) -> list[QueueInterval]:
        await self.recorder.flush()
        return await asyncio.to_thread(
            self.history.queue_history,
            project,
            topic=topic,
            queue=queue,
            since_ms=since_ms,
            until_ms=until_ms,
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
