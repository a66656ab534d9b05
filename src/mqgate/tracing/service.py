"""The gateway's tracing (SPEC P2-P6): which messages the policies select, one event per hop
into the project's trace topic, the index behind the path queries.

The hot path pays one truthiness check while no policy exists, and a few dict look-ups per
message while some do. A produce or ack that got 200 has its hops durable in the trace topic
(`record` waits for them, sharing the store's group commit); hops the gateway takes on its own
(scheduling, redelivery, expiry) are buffered and flushed within `FLUSH_INTERVAL_MS`, with any
drop counted (`mqgate_trace_events_dropped_total`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from mqgate.core.layout import Slot
from mqgate.core.trace_context import TRACEPARENT
from mqgate.errors import MqgateError
from mqgate.model import StoredMessage
from mqgate.registry.cache import Removed
from mqgate.registry.records import ConsumerRecord, PolicyRecord, Snapshot, TopicRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.gateway import Feature
from mqgate.services.observers import Observers
from mqgate.services.topology import Topology
from mqgate.tracing.batch import TraceBatch, batch_shape
from mqgate.tracing.events import (
    TRACE_TOPIC_PREFIX,
    Hop,
    Resource,
    TraceEvent,
    keep_fields,
    trace_topic,
)
from mqgate.tracing.index import TraceIndex
from mqgate.tracing.index_writer import ProcessWriter
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.metrics import TracingMetrics
from mqgate.tracing.observer import TraceObserver
from mqgate.tracing.policy import (
    CONTENT_REF,
    MEMO_SIZE,
    MatchedTrace,
    PolicySet,
    TracePolicy,
    kept_fields,
)
from mqgate.tracing.produce_batches import Origin, queue_batch, request_batch
from mqgate.tracing.query import TraceAnswer, TraceQuery
from mqgate.tracing.recorder import TraceRecorder
from mqgate.tracing.rounds import QueueTracer

log = logging.getLogger(__name__)


FLUSH_INTERVAL_MS: Final = 50
INDEX_CONDITION: Final = "trace_index"  # its faults and degraded condition in /healthz
DISCOVER_EVERY_S: Final = 60.0


def policy_of(rec: PolicyRecord) -> TracePolicy:
    return TracePolicy.create(
        rec.id,
        rec.mode,
        rec.level,
        project=rec.project,
        topic=rec.topic,
        queue=rec.queue,
        service=rec.service,
    )


class Tracing(Feature):
    """The feature: its observer is attached to the data path while a policy exists."""

    def __init__(self, ctx: Context, topology: Topology, observers: Observers) -> None:
        self.ctx = ctx
        self.observers = observers
        settings = ctx.settings
        self.resource = Resource(
            f"{socket.gethostname()}:{settings.port}", socket.gethostname(), "mqgate", settings.port
        )
        self.policies = PolicySet(())
        # (project, topic, queue, producer) -> its tracer, None when not traced (`queue_tracer`)
        self._tracers: dict[tuple[str, str, int, str], QueueTracer | None] = {}
        self.index = TraceIndex(settings.index_url("trace-index.sqlite"))
        self.indexer = TraceIndexer(
            ctx.store,
            self.index,
            discover=self._trace_topics,
            # New trace topics come through registry_changed; the look at every registered
            # topic is only the safety net.
            discover_every_s=DISCOVER_EVERY_S,
            max_age_ms=int(settings.trace_retention_s * 1000),
            max_events=settings.trace_max_events,
            on_failure=self._index_failed,
            on_recovery=lambda: ctx.health.restore(INDEX_CONDITION),
        )
        self.recorder = TraceRecorder(
            ctx.store,
            flush_interval_ms=FLUSH_INTERVAL_MS,
            retention_ms=int(settings.trace_retention_s * 1000),
            on_new_topic=self.indexer.on_new_topic,
        )
        self.query = TraceQuery(self.index, self.indexer)
        self.metrics = TracingMetrics(self.recorder, self.indexer)
        self.observer = TraceObserver(self, topology)

    async def start(self) -> None:
        self.policies_changed(self.ctx.registry.snapshot.policies.values())
        self.ctx.metrics.registry.register(self.metrics)
        await asyncio.to_thread(self.index.create_schema)
        self.recorder.start()
        for topic in await self._trace_topics():
            self.indexer.add_topic(topic)
        if self.ctx.settings.trace_index_process:
            self.indexer.writer = ProcessWriter(self.index.url)
        self.indexer.start()

    async def stop(self) -> None:
        with contextlib.suppress(KeyError):
            self.ctx.metrics.registry.unregister(self.metrics)
        await self.recorder.close()
        await self.indexer.close()
        if self.indexer.writer is not None:
            await self.indexer.writer.close()
        await asyncio.to_thread(self.index.dispose)

    def _index_failed(self, detail: str) -> None:
        self.ctx.health.fault(INDEX_CONDITION, "round_failed", detail)
        self.ctx.health.degrade(INDEX_CONDITION, f"trace indexing fails, retried with backoff: {detail}")

    async def _trace_topics(self) -> list[str]:
        """Every project's trace topic (registered with the project, see Projects)."""
        return [t for t in self.ctx.registry.snapshot.topics if t.startswith(TRACE_TOPIC_PREFIX)]

    def policies_changed(self, records: Iterable[PolicyRecord]) -> None:
        found = []
        for rec in records:
            try:
                found.append(policy_of(rec))
            except Exception:  # stored by a newer gateway with a mode this one does not know
                log.warning("trace policy %s cannot be read; ignored", rec.id)
        self.policies = PolicySet(found)
        self._tracers = {}
        if self.policies:
            self.observers.attach(self.observer)
        else:
            self.observers.detach(self.observer)

    async def registry_changed(self, changed: Snapshot, removed: Removed) -> None:
        if changed.policies or removed.policies:
            self.policies_changed(self.ctx.registry.snapshot.policies.values())
        for name in changed.topics:
            if name.startswith(TRACE_TOPIC_PREFIX):
                self.indexer.add_topic(name)  # known ones: nothing
        for name in removed.topics:
            if name.startswith(TRACE_TOPIC_PREFIX):
                self.indexer.remove_topic(name)

    # --- matching -------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(self.policies)

    def match(
        self, topic: TopicRecord | None, queue: int | None, services: Sequence[str]
    ) -> MatchedTrace | None:
        if topic is None or not self.policies.policies:
            return None
        return self.policies.match(topic.project, topic.name, queue, services)

    def queue_tracers(
        self, topic: TopicRecord, queues: Iterable[int], producer: str
    ) -> dict[int, QueueTracer]:
        """`queue_tracer` of each of `queues`, the traced ones: looked up in one call."""
        memo = self._tracers
        out: dict[int, QueueTracer] = {}
        for q in queues:
            key = (topic.project, topic.name, q, producer)
            found = memo[key] if key in memo else self.queue_tracer(topic, q, producer)
            if found is not None:
                out[q] = found
        return out

    def queue_tracer(self, topic: TopicRecord, queue: int, producer: str) -> QueueTracer | None:
        """The trace of `producer`'s produces to `queue` of `topic` (None: not traced), one
        object per producer and queue until the policies change: a plain produce's hot path
        looks it up instead of matching, and a single-message produce joins its run through it."""
        key = (topic.project, topic.name, queue, producer)
        tracers = self._tracers
        try:
            return tracers[key]
        except KeyError:
            pass
        matched = self.policies.match(topic.project, topic.name, queue, (producer,))
        if len(tracers) >= MEMO_SIZE:
            tracers.clear()
        found = tracers[key] = (
            None
            if matched is None
            else QueueTracer(
                topic.project,
                topic.name,
                queue,
                producer,
                matched,
                self.resource,
                self.ctx.settings.trace_body_max_bytes,
                self.recorder.open_group,
            )
        )
        return found

    def topic_of(self, name: str) -> TopicRecord | None:
        return self.ctx.registry.topic(name)

    # --- events ---------------------------------------------------------------------------

    def event(self, matched: MatchedTrace, topic: TopicRecord, hop: Hop, **fields: Any) -> TraceEvent:
        kept = kept_fields(matched.modes, matched.level)
        if CONTENT_REF in kept:
            # The hop that knows where the message is stored points at it instead of a copy.
            fields["content_ref"] = fields.get("queue") is not None and fields.get("offset") is not None
        ev = TraceEvent(
            msg_id=fields.pop("msg_id"),
            hop=hop,
            time_ms=fields.pop("time_ms", None) or now_ms(),
            project=topic.project,
            topic=topic.name,
            resource=self.resource,
            level=matched.level.label,  # type: ignore[arg-type]
            **fields,
        )
        return keep_fields(ev, kept, self.ctx.settings.trace_body_max_bytes)

    def message_events(
        self,
        hop: Hop,
        topic: TopicRecord | None,
        queue: int | None,
        messages: Iterable[tuple[int | None, StoredMessage]],
        services: Sequence[str],
        **fields: Any,
    ) -> list[TraceEvent]:
        """The `hop` events of the traced ones among `messages` (offset, message) of a queue."""
        if not self.policies or topic is None or topic.name.startswith(TRACE_TOPIC_PREFIX):
            return []  # a trace topic's own reads are not traced (they would trace themselves)
        return self.hops_of((hop,), topic, queue, [(offset, m, fields) for offset, m in messages], services)

    def hops_of(
        self,
        hops: Sequence[Hop],
        topic: TopicRecord,
        queue: int | None,
        messages: Iterable[tuple[int | None, StoredMessage, dict[str, Any]]],
        services: Sequence[str],
        first_ms: int | None = None,
    ) -> list[TraceEvent]:
        """Events of several hops of each traced message, matched once per message; `fields`
        per message. Of several hops, the first happened at `first_ms` and has no offset yet
        (a produce's accepted hop precedes its stored one)."""
        out: list[TraceEvent] = []
        if topic.name.startswith(TRACE_TOPIC_PREFIX):
            return out
        for offset, m, given in messages:
            fields = dict(given)
            at = fields.pop("time_ms", None)
            matched = self.policies.match(
                project=topic.project, topic=topic.name, queue=queue, services=(m.producer, *services)
            )
            if matched is None:
                continue
            for i, hop in enumerate(hops):
                out.append(
                    self.event(
                        matched,
                        topic,
                        hop,
                        msg_id=m.msg_id,
                        keys=m.keys,
                        queue=queue,
                        offset=offset if i or len(hops) == 1 else None,
                        time_ms=first_ms if i == 0 and first_ms else at,
                        producer=m.producer,
                        body=m.body,
                        traceparent=m.properties.get(TRACEPARENT),
                        **fields,
                    )
                )
        return out

    def produce_batch(
        self,
        topic: TopicRecord,
        queue: int,
        batch: Sequence[StoredMessage],
        first_offset: int,
        accepted_ms: int,
        traceparent: str | None = None,
        matched: MatchedTrace | None = None,
    ) -> TraceBatch | None:
        """The accepted and stored hops of a produce's messages in one queue as one record
        (tracing.produce_batches.queue_batch), or None when no policy traces them. One producer
        sent them all, so one match covers the batch; `matched`: the queue's trace when the
        caller matched it already."""
        if not batch or topic.name.startswith(TRACE_TOPIC_PREFIX):
            return None
        if matched is None:
            services = (batch[0].producer,)
            matched = self.policies.match(
                project=topic.project, topic=topic.name, queue=queue, services=services
            )
            if matched is None:
                return None
        return queue_batch(
            self.origin(topic, accepted_ms),
            batch_shape(matched.modes, matched.level),
            queue,
            batch,
            first_offset,
            traceparent,
        )

    def request_batch(
        self,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        firsts: dict[int, int],
        accepted_ms: int,
        traceparents: Mapping[int, str | None],
        matches: Mapping[int, MatchedTrace],
    ) -> TraceBatch | None:
        """The produce hops of a request over several queues as one record (`parts`: each
        queue's run of ids), or None when its queues differ in what they keep or in trace
        context, or their ids are not runs (then one record per queue)."""
        if topic.name.startswith(TRACE_TOPIC_PREFIX):
            return None
        first_queue, first = next(iter(matches.items()))
        if first_queue not in traceparents:
            return None
        context = traceparents[first_queue]
        queues = []
        for q, m in matches.items():  # one loop, no generator a check (a batch's 8 queues)
            if m.level != first.level or m.modes != first.modes:
                return None
            if q not in traceparents or traceparents[q] != context:
                return None
            queues.append((q, by_queue[q], firsts[q]))
        return request_batch(
            self.origin(topic, accepted_ms), batch_shape(first.modes, first.level), queues, context
        )

    def origin(self, topic: TopicRecord, accepted_ms: int) -> Origin:
        return Origin(
            topic.project,
            topic.name,
            self.resource,
            accepted_ms,
            now_ms(),
            self.ctx.settings.trace_body_max_bytes,
        )

    def ready(self, topic: TopicRecord) -> bool:
        """`ready_for` without a wait, for the common case: the trace topic is known."""
        return topic.project in self.recorder.known_projects

    async def ready_for(self, topic: TopicRecord) -> bool:
        """Whether a produce to `topic` can write its trace records with its messages (the
        project's trace topic exists); False sends them the separate way (`record`)."""
        where = trace_topic(topic.project)
        if self.recorder.knows(where):
            return True
        try:
            await self.recorder.ensure_topic(where)
        except MqgateError as exc:
            log.warning("trace topic %s not ready (%s): traced the separate way", where, exc.message)
            return False
        return True

    def batch_events(
        self,
        hop: Hop,
        c: ConsumerRecord,
        slot: Slot,
        msgs: Iterable[tuple[int, StoredMessage]],
        **fields: Any,
    ) -> list[TraceEvent]:
        """The `hop` events of a consumer's batch from one queue (its topic's, its retry queue
        or its inbox: those are traced under its topic, without a queue)."""
        if slot.topic != c.topic:
            fields["source"] = slot.topic
        queue = slot.queue if slot.topic == c.topic else None
        return self.message_events(
            hop, self.topic_of(c.topic), queue, msgs, (c.name,), consumer=c.name, **fields
        )

    async def record(self, events: Sequence[TraceEvent | TraceBatch]) -> None:
        """Durable before the caller answers (produce, ack). Tracing never fails the data path:
        events the store refuses now are buffered and retried (counted in the metrics), so the
        caller's message, already stored, is answered as stored."""
        if not events:
            return
        try:
            await self.recorder.record(events)
        except MqgateError as exc:
            log.warning("trace events not stored (%s): buffered for a retry", exc.message)
            self.recorder.record_nowait(events)

    def record_later(self, events: list[TraceEvent]) -> None:
        if events:
            self.recorder.record_nowait(events)

    async def find(self, *, msg_id: str | None, request_id: str | None, key: str | None) -> TraceAnswer:
        # Events this gateway stored a moment ago are indexed before the look.
        self.indexer.poke()
        return await self.query.find(msg_id=msg_id, request_id=request_id, key=key)
