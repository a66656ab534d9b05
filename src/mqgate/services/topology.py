"""Topics, producers and consumers: registration, look-ups, and the store topics behind them.

Store topics are made at registration and when a gateway starts or sees a registry change,
never by a read: a consumer's side topics (retry, inbox, dead letters) exist from its
registration on, so any read path only ever reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, TypeVar

import msgspec

from mqgate.core.layout import Layout, QueueGrid, grid_for, grown, inbox_topic, retry_topic
from mqgate.errors import (
    TOPIC_DAMAGED,
    AlreadyExists,
    BadRequest,
    Conflict,
    NotFound,
    StorageError,
    Unavailable,
)
from mqgate.model import MESSAGE_LEVEL_MODES, MODE_BROADCAST, MODE_CLUSTER, MODE_PUSH, QueueBounds
from mqgate.names import (
    INTERNAL_PREFIXES,
    REDRIVE_PREFIX,
    dlq_topic,
    refuse_reserved,
    validate_name,
    validate_topic_name,
)
from mqgate.registry.cache import Removed
from mqgate.registry.records import (
    DEFAULT_PROJECT,
    ConsumerRecord,
    ProducerRecord,
    Snapshot,
    TopicRecord,
    hash_token,
    new_token,
)
from mqgate.services.context import Context, now_ms
from mqgate.services.qos import TOPIC_TARGET, split_target, target_topic
from mqgate.store.interface import TopicConfig

log = logging.getLogger(__name__)
# The token hash of a producer or consumer whose token was revoked: no token hashes to it.
REVOKED: Final = "revoked"
R = TypeVar("R", ProducerRecord, ConsumerRecord)
# The grid of a one-queue store topic (an inbox or a retry queue).
SINGLE_QUEUE: Final = grid_for(((1, 1),))


class Topology:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # The store topics this gateway made or checked, as configured then.
        self._store_topics: dict[str, TopicConfig] = {}

    # --- look-ups (read only) -----------------------------------------------------------

    async def topic(self, name: str) -> TopicRecord:
        registry = self.ctx.registry
        rec = registry.topic(name)
        if rec is None and await registry.refresh_on_miss():
            rec = registry.topic(name)
        if rec is None:
            raise NotFound(f"topic {name} does not exist", field="topic")
        return rec

    async def producer(self, name: str) -> ProducerRecord:
        return await self._registered("producer", name, self.ctx.registry.producer)

    async def consumer(self, name: str) -> ConsumerRecord:
        return await self._registered("consumer", name, self.ctx.registry.consumer)

    async def _registered(self, kind: str, name: str, find: Callable[[str], R | None]) -> R:
        """A registered producer or consumer; a name registered through another gateway a
        moment ago is found by a look at the registry."""
        validate_name(name, kind)
        rec = find(name)
        if rec is None and await self.ctx.registry.refresh_on_miss():
            rec = find(name)
        if rec is None:
            raise NotFound(f"{kind} {name} is not registered", field=kind)
        return rec

    async def layout(self, c: ConsumerRecord) -> Layout:
        """The queues `c` reads: its topic's lanes, its retry queue and its inbox."""
        t = await self.topic(c.topic)
        return Layout(c.name, c.topic, t.grid)

    async def bounds(self, layout: Layout) -> list[QueueBounds]:
        """min/max of every queue of the layout, in table order, with its priority lane."""
        return layout.queue_bounds(await self.ctx.store.bounds_many(layout.store_topics))

    async def start_offsets(self, c: ConsumerRecord, layout: Layout, existing: int = 0) -> list[int]:
        """Where a new table starts: the consumer's start rule on its topic's queues, the
        beginning of its retry queue and inbox. A table of `existing` entries that grows
        (its topic grew) reads the new queues from their beginning: they are new, so
        everything in them came after the consumer."""
        bounds = await self.bounds(layout)
        starts = []
        for i, b in enumerate(bounds):
            slot = layout.slot(i)
            if slot.topic != c.topic or c.start == "earliest" or 0 < existing <= i:
                starts.append(b.min)
            elif c.start == "latest":
                starts.append(b.max)
            else:
                starts.append(await self.ctx.store.offset_for_time(slot.topic, slot.queue, int(c.start)))
        return starts

    async def target(self, target: str) -> tuple[str, QueueGrid, int]:
        """(store topic, its queue grid, max priority) of a delivery target (SPEC S1)."""
        kind, name = split_target(target)
        if kind == TOPIC_TARGET:
            t = await self.topic(name)
            return t.name, t.grid, t.max_priority
        await self.consumer(name)
        return target_topic(target), SINGLE_QUEUE, 0

    def wake_reader_of(self, consumer: str) -> None:
        """A consumer's retry queue or inbox got messages: its pulls wait on its topic."""
        rec = self.ctx.registry.consumer(consumer)
        if rec is not None:
            self.ctx.store.wake(rec.topic, consumer=consumer, count=1)

    # --- the store topics behind the registry ------------------------------------------

    async def sync(self, snapshot: Snapshot) -> None:
        """Make the store topics of every registered topic and consumer exist (at start-up and
        after each registry change, so a registration through another gateway is served). A
        store that does not answer (a project's failed cluster) does not keep the others' topics
        from being made: the first such error is raised after all were tried."""
        failed: Unavailable | None = None
        for topic in snapshot.topics.values():
            try:
                await self._ensure_store_topic(topic)
            except Unavailable as exc:
                failed = failed or exc
            except StorageError as exc:
                if exc.code != TOPIC_DAMAGED:
                    raise
                # Left unserved (its calls answer topic_damaged; /healthz and `mqgate check` say
                # why): one damaged topic must not keep the others from being served.
        for c in snapshot.consumers.values():
            t = snapshot.topics.get(c.topic)
            if t is not None:
                try:
                    await self._ensure_side_topics(c, t)
                except Unavailable as exc:
                    failed = failed or exc
        if failed is not None:
            raise failed

    async def _ensure_store_topic(self, topic: TopicRecord) -> None:
        """The store topic exists, with every queue of every lane (it may have grown through
        another gateway) and the retention in the registry."""
        config = TopicConfig(topic.name, topic.store_queues, topic.retention_ms, topic.retention_bytes)
        if self._store_topics.get(topic.name) != config or not self.ctx.store.has_topic(topic.name):
            await self.ctx.store.create_topic(config)
            self._store_topics[topic.name] = config

    async def _ensure_side_topics(self, c: ConsumerRecord, t: TopicRecord) -> None:
        for side in (retry_topic(c.name), inbox_topic(c.name)):
            if not self.ctx.store.has_topic(side):
                await self.ctx.store.create_topic(TopicConfig(side, 1, t.retention_ms, t.retention_bytes))

    # --- registration -------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int,
        retention_bytes: int | None,
        max_priority: int = 0,
        *,
        project: str = DEFAULT_PROJECT,
        internal: bool = False,
        reserved: bool = False,
    ) -> TopicRecord:
        """A topic of `project` (SPEC P1); `internal` for the gateway's own topics, whose
        project is taken as given; `reserved` for an edge that owns a reserved name."""
        validate_topic_name(name, "name")
        if not reserved:
            refuse_reserved(name, "name")
        if not internal:
            validate_name(project, "project")
            if self.ctx.registry.project(project) is None:
                await self.ctx.registry.refresh_on_miss()
            if self.ctx.registry.project(project) is None:
                raise NotFound(f"project {project} does not exist", field="project")
        rec = TopicRecord(
            name, queues, retention_ms, retention_bytes, now_ms(), max_priority, project=project
        )
        if self.ctx.registry.topic(name) is not None:
            raise AlreadyExists(f"topic {name} already exists", field="name")
        # The store topic first, the registry row last: a failure in between leaves a store
        # topic no name points to (a retry reuses it), never a registered topic without queues.
        await self.ctx.store.create_topic(
            TopicConfig(name, queues * (max_priority + 1), retention_ms, retention_bytes)
        )
        await self.ctx.registry.change("add_topic", rec)
        return rec

    async def change_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        max_priority: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> TopicRecord:
        """Grow a topic (more queues per lane, more priority lanes) or change its retention,
        live. New queues start empty; messages already stored keep their queue numbers and
        every consumer reads the new queues from their beginning. Order keys map to queues by
        the new count from now on (as in Kafka, a key's later messages may go to another
        queue than its earlier ones)."""
        t = await self.topic(name)
        lanes = (t.max_priority if max_priority is None else max_priority) + 1
        try:
            shapes = grown(t.shapes, t.queues if queues is None else queues, lanes)
        except ValueError as exc:
            field = "queues" if queues is not None and queues < t.queues else "maxPriority"
            raise BadRequest(f"topic {name} cannot shrink: {exc}", field=field) from exc
        changes: dict[str, object] = {}
        if shapes != t.shapes:
            changes.update(
                queues=shapes[-1][0],
                max_priority=shapes[-1][1] - 1,
                grown_from=",".join(f"{q}x{lanes_}" for q, lanes_ in shapes[:-1]),
            )
        if retention_ms is not None:
            changes["retention_ms"] = retention_ms
        if retention_bytes is not None:
            changes["retention_bytes"] = retention_bytes or None
        if not changes:
            return t
        # The store first: a registry row never names queues the store does not have.
        await self._ensure_store_topic(msgspec.structs.replace(t, **changes))
        await self.ctx.registry.change("update_topic", name, **changes)
        return await self.topic(name)

    # --- deletion ---------------------------------------------------------------------

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and every message in it. Refused while a producer or consumer is
        registered on it (delete those first), and for a consumer's own topics (they go with
        the consumer). Scheduled messages for it are dropped when due, and counted."""
        if name.startswith(INTERNAL_PREFIXES):
            raise BadRequest(f"topic {name} belongs to a consumer: delete the consumer", field="name")
        rec = await self.topic(name)
        snap = self.ctx.registry.snapshot
        users = [f"producer {p.name}" for p in snap.producers.values() if p.topic == name]
        users += [f"producer {p.name}" for p in snap.producers.values() if name in p.allowed()]
        users += [f"consumer {c.name}" for c in snap.consumers.values() if c.topic == name]
        if users:
            shown = ", ".join(sorted(set(users))[:10]) + (" …" if len(set(users)) > 10 else "")
            raise Conflict(
                f"topic {name} is in use by {shown}: delete them first", field="name", code="in_use"
            )
        # The registry first: from here on no produce or pull finds the topic. A store that
        # cannot delete it (down, or refusing) gets the row back: a store topic under no name
        # would be taken over, messages and all, by the next topic made under that name.
        await self.ctx.registry.change("remove", "topic", name)
        try:
            await self._drop_store_topic(name)
        except BaseException:
            await self._register_again(rec)
            raise

    async def _register_again(self, rec: TopicRecord | ConsumerRecord) -> None:
        """What a delete removed from the registry before a store or offsets step failed is
        registered again, as it was: the delete can be retried, and nothing is left in the
        store under no name for the next one of that name to take over. Made again meanwhile
        under its name: that one stays."""
        kind = "topic" if isinstance(rec, TopicRecord) else "consumer"
        try:
            await self.ctx.registry.change(f"add_{kind}", rec)
        except AlreadyExists:
            pass
        except Exception:
            log.exception("%s %s: its delete failed; its registry row was not put back", kind, rec.name)
            self.ctx.health.fault("registry", f"{kind}_not_restored", rec.name)

    async def delete_producer(self, name: str) -> None:
        """Forget a producer: its token is refused from now on. Its messages stay."""
        await self.producer(name)
        await self.ctx.registry.change("remove", "producer", name)

    async def delete_consumer(self, name: str, keep_dead_letters: bool = False) -> None:
        """Forget a consumer: its offsets (every client's table, what was redriven), its
        retry queue and inbox, and, unless kept, its dead-letter topic. Its topic's messages
        stay for other consumers; a consumer registered later under the same name starts
        afresh by its start rule."""
        rec = await self.consumer(name)
        dlq = None if keep_dead_letters else self.ctx.registry.topic(dlq_topic(name))
        # The registry first, as a topic's delete. Should a step after it fail (the store
        # down), the consumer comes back paused (no pull is served from what is left of it)
        # and the delete can be retried: each step is idempotent. Its offsets go last, so
        # that resuming it instead continues where it was.
        await self.ctx.registry.change("remove", "consumer", name)
        try:
            await self._drop_store_topic(retry_topic(name))
            await self._drop_store_topic(inbox_topic(name))
            if dlq is not None:
                await self.ctx.registry.change("remove", "topic", dlq.name)
                try:
                    await self._drop_store_topic(dlq.name)
                except BaseException:
                    await self._register_again(dlq)
                    raise
            await self.ctx.offsets.drop_group(name)
            await self.ctx.offsets.drop_group(REDRIVE_PREFIX + name)
        except BaseException:
            await self._register_again(msgspec.structs.replace(rec, paused=True))
            raise

    async def _drop_store_topic(self, name: str) -> None:
        self._store_topics.pop(name, None)
        await self.ctx.store.delete_topic(name)

    def forget(self, removed: Removed) -> None:
        """Deleted through another gateway: drop what this one keeps of them."""
        for name in removed.topics:
            self._store_topics.pop(name, None)
            self.ctx.store.forget_topic(name)
        for name in removed.consumers:
            for side in (retry_topic(name), inbox_topic(name)):
                self._store_topics.pop(side, None)
                self.ctx.store.forget_topic(side)

    async def register_producer(
        self, name: str, topic: str, destinations: list[str] | None = None, *, reserved: bool = False
    ) -> tuple[ProducerRecord, str]:
        validate_name(name, "name")
        if not reserved:
            refuse_reserved(name, "name")
        await self.topic(topic)
        for d in destinations or []:
            if not d.startswith("inbox:"):
                await self.topic(d)
        token = new_token("mqp")
        rec = ProducerRecord(name, topic, hash_token(token), now_ms(), ",".join(destinations or []))
        await self.ctx.registry.change("add_producer", rec)
        return rec, token

    async def register_consumer(
        self,
        name: str,
        topic: str,
        mode: str,
        start: str,
        lock_timeout_s: float,
        max_attempts: int,
        *,
        reserved: bool = False,
        push: str = "",
    ) -> tuple[ConsumerRecord, str]:
        validate_name(name, "name")
        if not reserved:
            refuse_reserved(name, "name")
        if mode not in (MODE_CLUSTER, MODE_BROADCAST, *MESSAGE_LEVEL_MODES):
            raise BadRequest("mode must be 'cluster', 'broadcast', 'message' or 'push'", field="mode")
        if (mode == MODE_PUSH) != bool(push):
            raise BadRequest("a push consumer, and only one, has push settings", field="mode")
        if start not in ("earliest", "latest") and not start.isdigit():
            raise BadRequest("start must be 'earliest', 'latest' or epoch milliseconds", field="start")
        t = await self.topic(topic)
        await self._ensure_store_topic(t)
        token = new_token("mqc")
        rec = ConsumerRecord(
            name,
            topic,
            mode,
            start,
            lock_timeout_s,
            max_attempts,
            False,
            0.0,
            0,
            hash_token(token),
            now_ms(),
            push,
        )
        if self.ctx.registry.topic(dlq_topic(name)) is None:
            await self.create_topic(
                dlq_topic(name), 1, t.retention_ms, t.retention_bytes, project=t.project, internal=True
            )
        await self._ensure_side_topics(rec, t)
        await self.ctx.registry.change("add_consumer", rec)
        if mode in (MODE_CLUSTER, *MESSAGE_LEVEL_MODES):  # one table, made now: its start is now
            try:
                layout = await self.layout(rec)
                await self.ctx.offsets.ensure_table(name, "", await self.start_offsets(rec, layout), now_ms())
            except BaseException:
                # Its token was never given out: the registration is undone, and made again
                # when retried (not refused as existing).
                await self._unregister(rec)
                raise
        return rec, token

    async def _unregister(self, rec: ConsumerRecord) -> None:
        try:
            await self.ctx.registry.change("remove", "consumer", rec.name)
        except Exception:
            log.exception("consumer %s: its registration failed and was not undone", rec.name)
            self.ctx.health.fault("registry", "consumer_not_undone", rec.name)

    async def update_consumer(self, name: str, **changes: object) -> ConsumerRecord:
        await self.consumer(name)
        await self.ctx.registry.change("update_consumer", name, **changes)
        return await self.consumer(name)

    async def new_token(self, kind: str, name: str) -> tuple[ProducerRecord | ConsumerRecord, str]:
        """Issue a new token to producer or consumer `name`: the old one is refused from now on
        (on other gateways from their next registry refresh)."""
        token = new_token("mqp" if kind == "producer" else "mqc")
        return await self._set_token_hash(kind, name, hash_token(token)), token

    async def revoke_token(self, kind: str, name: str) -> ProducerRecord | ConsumerRecord:
        """Leave `name` without a valid token until a new one is issued."""
        return await self._set_token_hash(kind, name, REVOKED)

    async def _set_token_hash(self, kind: str, name: str, token_hash: str) -> ProducerRecord | ConsumerRecord:
        if kind == "producer":
            await self.producer(name)
            await self.ctx.registry.change("update_producer", name, token_hash=token_hash)
            return await self.producer(name)
        await self.consumer(name)
        await self.ctx.registry.change("update_consumer", name, token_hash=token_hash)
        return await self.consumer(name)
