"""What the gateway does, independent of HTTP: produce, pull, ack, and operations."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from mqgate.core.acks import AckRefusal
from mqgate.core.ids import new_message_ids
from mqgate.core.layout import INBOX_PREFIX, Layout, inbox_topic, retry_topic, store_queue_for, view_queue
from mqgate.core.queue_choice import lock_is_held
from mqgate.core.scheduling import is_expired, redelivery_due
from mqgate.core.tokens import AckToken, decode_token, encode_token
from mqgate.errors import BadRequest, Conflict, Forbidden, MqgateError, NotFound, Unauthorized
from mqgate.gateway.metrics import Metrics
from mqgate.gateway.qos import (
    RETRY_TARGET,
    TOPIC_TARGET,
    DeliveryLoop,
    Placement,
    held_payload,
    placements,
    split_target,
    target_topic,
)
from mqgate.model import MODE_BROADCAST, MODE_CLUSTER, NewMessage, QueueBounds, Receipt, StoredMessage
from mqgate.names import dlq_topic, validate_name, validate_topic_name
from mqgate.offsets.interface import Lease, OffsetStore
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import (
    ConsumerRecord,
    ProducerRecord,
    TopicRecord,
    hash_token,
    new_token,
    token_matches,
)
from mqgate.scheduler.interface import Destination, Due, Scheduler
from mqgate.settings import Settings
from mqgate.store.interface import MessageStore, TopicConfig

log = logging.getLogger(__name__)

FOUND: Final = "FOUND"
NO_NEW_MSG: Final = "NO_NEW_MSG"
PAUSED: Final = "PAUSED"
RATE_LIMITED: Final = "RATE_LIMITED"
# A waiting pull re-checks at least this often, so it notices an expired lock in time.
LOCK_RECHECK_S: Final = 1.0
DLQ_REASON_ATTEMPTS: Final = "max_attempts"
DLQ_REASON_EXPIRED: Final = "expired"
# Failed deliveries of a message so far, carried with it through its redeliveries.
DELIVERIES_PROPERTY: Final = "mq.deliveries"
RELEASE_HOLD_S: Final = 30.0
STORED: Final = "stored"
SCHEDULED: Final = "scheduled"
_MARK_DEADLINE: Final = b'"deadline":'
_decode_stored = msgspec.json.Decoder(StoredMessage).decode


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class PullResult:
    status: str
    request_id: str | None = None
    queue: int = -1
    messages: list[tuple[int, bytes]] | None = None  # (offset, stored JSON object)
    reconsume_times: int = 0
    ack: str | None = None
    retry_after_s: float = 0.0


class Gateway:
    def __init__(
        self,
        settings: Settings,
        store: MessageStore,
        offsets: OffsetStore,
        registry: RegistryCache,
        secret: bytes,
        metrics: Metrics,
        scheduler: Scheduler,
    ) -> None:
        self.settings = settings
        self.store = store
        self.offsets = offsets
        self.registry = registry
        self.secret = secret
        self.metrics = metrics
        self.scheduler = scheduler
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._table_sizes: dict[tuple[str, str], int] = {}  # tables known to be this long

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        await self.offsets.open()
        # Recovery of held messages completes before intake and delivery start (SPEC S6).
        await self.scheduler.open()
        await self.registry.start()
        for topic in self.registry.snapshot.topics.values():
            await self._ensure_store_topic(topic)
        loop = asyncio.get_running_loop()
        delivery = DeliveryLoop(self.scheduler, self._deliver_due, self._expired_before_delivery)
        self._tasks = [
            loop.create_task(delivery.run(), name="delivery"),
            loop.create_task(self._every(self.settings.retention_check_s, self._retention)),
            loop.create_task(
                self._every(min(self.settings.broadcast_client_ttl_s / 10, 60.0), self._expire_clients)
            ),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.registry.stop()
        await self.scheduler.close()
        await self.offsets.close()
        await self.store.close()

    async def _every(self, seconds: float, job: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except MqgateError as exc:  # e.g. Redis briefly down: try again next round
                log.warning("background job %s: %s", getattr(job, "__name__", job), exc.message)
            except Exception:
                log.exception("background job %s failed", getattr(job, "__name__", job))

    async def _retention(self) -> None:
        await self.store.enforce_retention(now_ms())

    async def _expire_clients(self) -> None:
        cutoff = now_ms() - int(self.settings.broadcast_client_ttl_s * 1000)
        for c in list(self.registry.snapshot.consumers.values()):
            if c.mode == MODE_BROADCAST:
                await self.offsets.expire_clients(c.name, cutoff)

    async def _ensure_store_topic(self, topic: TopicRecord) -> None:
        if not self.store.has_topic(topic.name):
            queues = topic.queues * (topic.max_priority + 1)  # one set of queues per priority lane
            await self.store.create_topic(
                TopicConfig(topic.name, queues, topic.retention_ms, topic.retention_bytes)
            )

    async def _layout(self, c: ConsumerRecord) -> Layout:
        """The queues `c` reads (its topic's lanes, its retry queue, its inbox), made to exist."""
        t = await self._topic(c.topic)
        for side in (retry_topic(c.name), inbox_topic(c.name)):
            if not self.store.has_topic(side):
                await self.store.create_topic(TopicConfig(side, 1, t.retention_ms, t.retention_bytes))
        return Layout(c.name, c.topic, t.queues, t.max_priority + 1)

    async def _topic(self, name: str) -> TopicRecord:
        rec = self.registry.topic(name)
        if rec is None:
            await self.registry.refresh()
            rec = self.registry.topic(name)
        if rec is None:
            raise NotFound(f"topic {name} does not exist", field="topic")
        await self._ensure_store_topic(rec)
        return rec

    # --- registration -------------------------------------------------------------------

    async def create_topic(
        self, name: str, queues: int, retention_ms: int, retention_bytes: int | None, max_priority: int = 0
    ) -> TopicRecord:
        validate_topic_name(name, "name")
        rec = TopicRecord(name, queues, retention_ms, retention_bytes, now_ms(), max_priority)
        await self.registry.change("add_topic", rec)
        await self._ensure_store_topic(rec)
        return rec

    async def register_producer(
        self, name: str, topic: str, destinations: list[str] | None = None
    ) -> tuple[ProducerRecord, str]:
        validate_name(name, "name")
        await self._topic(topic)
        for d in destinations or []:
            if not d.startswith("inbox:"):
                await self._topic(d)
        token = new_token("mqp")
        rec = ProducerRecord(name, topic, hash_token(token), now_ms(), ",".join(destinations or []))
        await self.registry.change("add_producer", rec)
        return rec, token

    async def register_consumer(
        self, name: str, topic: str, mode: str, start: str, lock_timeout_s: float, max_attempts: int
    ) -> tuple[ConsumerRecord, str]:
        validate_name(name, "name")
        if mode not in (MODE_CLUSTER, MODE_BROADCAST):
            raise BadRequest("mode must be 'cluster' or 'broadcast'", field="mode")
        if start not in ("earliest", "latest") and not start.isdigit():
            raise BadRequest("start must be 'earliest', 'latest' or epoch milliseconds", field="start")
        t = await self._topic(topic)
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
        )
        dlq = dlq_topic(name)
        if self.registry.topic(dlq) is None:
            await self.create_topic(dlq, 1, t.retention_ms, t.retention_bytes)
        await self.registry.change("add_consumer", rec)
        layout = await self._layout(rec)
        if mode == MODE_CLUSTER:
            await self.offsets.ensure_table(name, "", await self._start_offsets(rec, layout), now_ms())
        return rec, token

    async def _start_offsets(self, c: ConsumerRecord, layout: Layout) -> list[int]:
        """Where a new table starts: the consumer's start rule on its topic's queues, the
        beginning of its retry queue and inbox."""
        bounds = await self._bounds(layout)
        starts = []
        for i, b in enumerate(bounds):
            slot = layout.slot(i)
            if slot.topic != c.topic or c.start == "earliest":
                starts.append(b.min)
            elif c.start == "latest":
                starts.append(b.max)
            else:
                starts.append(await self.store.offset_for_time(slot.topic, slot.queue, int(c.start)))
        return starts

    async def _bounds(self, layout: Layout) -> list[QueueBounds]:
        """min/max of every queue of the layout, in table order, with its priority lane."""
        topic, retry, inbox = await asyncio.gather(
            self.store.bounds(layout.topic),
            self.store.bounds(retry_topic(layout.consumer)),
            self.store.bounds(inbox_topic(layout.consumer)),
        )
        q = layout.queues
        ordered = [*topic[:q], retry[0], inbox[0], *topic[q : q * layout.lanes]]
        return [QueueBounds(i, b.min, b.max, layout.slot(i).lane) for i, b in enumerate(ordered)]

    # --- authentication -----------------------------------------------------------------

    async def producer_for(self, name: str, bearer: str | None, *, admin: bool = False) -> ProducerRecord:
        """The producer `name`, if `bearer` is its token (or the caller holds the admin token)."""
        validate_name(name, "producer")
        rec = self.registry.producer(name)
        if rec is None and await self.registry.refresh_on_miss():
            rec = self.registry.producer(name)
        if rec is None:
            raise NotFound(f"producer {name} is not registered", field="producer")
        if not admin:
            _check_bearer(bearer, rec.token_hash, f"producer {name}")
        return rec

    async def consumer_for(self, name: str, bearer: str | None) -> ConsumerRecord:
        validate_name(name, "consumer")
        rec = await self.consumer(name)
        _check_bearer(bearer, rec.token_hash, f"consumer {name}")
        return rec

    async def token_for(self, request_id: str, bearer: str | None) -> tuple[ConsumerRecord, AckToken]:
        token = decode_token(request_id, self.secret)
        return await self.consumer_for(token.consumer, bearer), token

    # --- produce ------------------------------------------------------------------------

    def _queue_for(self, topic: str, queues: int, order_key: str | None) -> int:
        if order_key is not None:
            return zlib.crc32(order_key.encode()) % queues
        counter = self._round_robin.get(topic)
        if counter is None:
            counter = self._round_robin[topic] = itertools.count()
        return next(counter) % queues

    async def produce(self, producer: ProducerRecord, messages: list[NewMessage]) -> list[Receipt]:
        topic = await self._topic(producer.topic)
        ts = now_ms()
        ids = new_message_ids(ts, len(messages))
        if not all(m.plain for m in messages):
            return await self._produce_with_qos(producer, messages, ids, ts)
        by_queue: dict[int, list[StoredMessage]] = {}
        placed: list[tuple[int, int]] = []  # (queue, index within that queue's batch)
        for m, msg_id in zip(messages, ids, strict=True):
            q = self._queue_for(topic.name, topic.queues, m.order_key)
            batch = by_queue.setdefault(q, [])
            placed.append((q, len(batch)))
            batch.append(StoredMessage(msg_id, ts, producer.name, m.body, m.keys, m.tags, m.properties))
        firsts = await self.store.append_many(topic.name, by_queue)
        self.metrics.child(self.metrics.produced, topic.name).inc(len(messages))
        broker = self.store.broker
        return [Receipt(by_queue[q][i].msg_id, broker, STORED, q, firsts[q] + i) for q, i in placed]

    async def _target(self, target: str) -> tuple[str, int, int]:
        """(store topic, queues per lane, max priority) of a delivery target."""
        kind, name = split_target(target)
        if kind == TOPIC_TARGET:
            t = await self._topic(name)
            return t.name, t.queues, t.max_priority
        await self._layout(await self.consumer(name))
        return target_topic(target), 1, 0

    async def _produce_with_qos(
        self, producer: ProducerRecord, messages: list[NewMessage], ids: list[str], ts: int
    ) -> list[Receipt]:
        """Destinations due now are stored at once, later ones held by the scheduler (SPEC S1-S3).
        Everything is validated before anything is written."""
        # (store topic, placement, message, store queue or -1 when held, queues per lane)
        plan: list[tuple[str, Placement, StoredMessage, int, int]] = []
        holds: list[tuple[bytes, list[Destination]]] = []
        for i, (m, msg_id) in enumerate(zip(messages, ids, strict=True)):
            stored = StoredMessage(msg_id, ts, producer.name, m.body, m.keys, m.tags, m.properties)
            later: list[Destination] = []
            for pl in placements(producer, m, ts):
                topic, queues, max_priority = await self._target(pl.target)
                if pl.priority > max_priority:
                    raise BadRequest(
                        f"priority {pl.priority} is above the max priority ({max_priority}) of "
                        f"{pl.label or topic}; create the topic with a higher maxPriority",
                        field=f"messages[{i}].priority" if len(messages) > 1 else "priority",
                    )
                if pl.start_ms > ts:
                    later.append(pl.destination())
                    plan.append((topic, pl, stored, -1, queues))
                    continue
                q = store_queue_for(pl.priority, self._queue_for(topic, queues, m.order_key), queues)
                qos = msgspec.structs.replace(
                    stored,
                    priority=pl.priority or None,
                    deliver_at_ms=pl.start_ms if pl.start_ms != ts else None,
                    deadline_ms=pl.deadline_ms or None,
                )
                plan.append((topic, pl, qos, q, queues))
            if later:
                holds.append((held_payload(stored, m.order_key), later))
        if holds:
            await self.scheduler.hold(holds)
        by_topic: dict[str, dict[int, list[StoredMessage]]] = {}
        slots: list[int] = []
        for topic, _, msg, q, _ in plan:
            if q >= 0:
                batch = by_topic.setdefault(topic, {}).setdefault(q, [])
                slots.append(len(batch))
                batch.append(msg)
            else:
                slots.append(-1)
        firsts = {topic: await self.store.append_many(topic, qs) for topic, qs in by_topic.items()}
        for topic, qs in by_topic.items():
            self.metrics.child(self.metrics.produced, topic).inc(sum(len(b) for b in qs.values()))
            if topic.startswith(INBOX_PREFIX):
                self._wake_reader_of(topic[len(INBOX_PREFIX) :])
        broker = self.store.broker
        receipts = []
        for (topic, pl, msg, q, queues), slot in zip(plan, slots, strict=True):
            if q < 0:
                receipt = Receipt(msg.msg_id, broker, SCHEDULED, None, None, pl.label, pl.start_ms)
            else:
                queue, offset = view_queue(q, queues), firsts[topic][q] + slot
                receipt = Receipt(msg.msg_id, broker, STORED, queue, offset, pl.label, msg.deliver_at_ms)
            receipts.append(msgspec.structs.replace(receipt, deadline=pl.deadline_ms or None))
        return receipts

    # --- scheduled delivery -------------------------------------------------------------

    async def _deliver_due(self, by_target: dict[str, list[tuple[StoredMessage, str | None, int]]]) -> None:
        for target, items in by_target.items():
            try:
                topic, queues, max_priority = await self._target(target)
            except NotFound:
                log.warning("dropping %d scheduled messages: %s no longer exists", len(items), target)
                continue
            by_queue: dict[int, list[StoredMessage]] = {}
            for msg, order_key, priority in items:
                lane = min(priority, max_priority)
                by_queue.setdefault(
                    store_queue_for(lane, self._queue_for(topic, queues, order_key), queues), []
                ).append(msg)
            await self.store.append_many(topic, by_queue)
            self.metrics.child(self.metrics.produced, topic).inc(len(items))
            kind, name = split_target(target)
            if kind != TOPIC_TARGET:
                self._wake_reader_of(name)

    def _expired_before_delivery(self, due: Due) -> None:
        self.metrics.child(self.metrics.expired_held, due.destination.target).inc()

    def _wake_reader_of(self, consumer: str) -> None:
        """A consumer's retry queue or inbox got messages: its pulls wait on its topic."""
        rec = self.registry.consumer(consumer)
        if rec is not None:
            self.store.wake(rec.topic)

    # --- consume ------------------------------------------------------------------------

    async def pull(
        self,
        c: ConsumerRecord,
        *,
        client_id: str | None,
        max_count: int,
        wait_s: float,
        request_id: str | None,
        owner: str,
    ) -> PullResult:
        ack_outcome: str | None = None
        if request_id:
            token = decode_token(request_id, self.secret)
            if token.consumer != c.name:
                raise Forbidden("requestId belongs to another consumer", field="requestId")
            refusal = await self.offsets.ack(token, now_ms())
            ack_outcome = refusal or "ok"
            if refusal is None:
                self.store.wake(c.topic)
            self.metrics.child(self.metrics.acks, c.name, ack_outcome).inc()
        if c.paused:
            return PullResult(PAUSED, ack=ack_outcome)
        table_client = self._table_client(c, client_id)
        granted = max_count
        limited = c.rate_limit_per_s > 0
        if limited:
            granted, retry_after_s = await self.offsets.take_tokens(
                c.name, c.rate_limit_per_s, max_count, now_ms()
            )
            if granted == 0:
                return PullResult(RATE_LIMITED, ack=ack_outcome, retry_after_s=retry_after_s)
        deadline = time.monotonic() + wait_s
        layout = await self._layout(c)
        while True:
            lease = await self._lease(c, layout, table_client, granted, owner)
            if lease is not None:
                found = await self._serve(c, layout, table_client, lease)
                if found is not None:
                    offset_end, msgs, reconsumed = found
                    if limited and granted > len(msgs):
                        await self.offsets.return_tokens(c.name, c.rate_limit_per_s, granted - len(msgs))
                    token = AckToken(
                        c.name,
                        table_client,
                        self.store.broker,
                        lease.queue,
                        lease.offset,
                        offset_end,
                        lease.lock_ts,
                    )
                    self.metrics.child(self.metrics.consumed, c.name).inc(len(msgs))
                    return PullResult(
                        FOUND,
                        request_id=encode_token(token, self.secret),
                        queue=lease.queue,
                        messages=msgs,
                        reconsume_times=reconsumed,
                        ack=ack_outcome,
                    )
                continue  # the lease was settled without delivering (dead letters, redelivery)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if limited:
                    await self.offsets.return_tokens(c.name, c.rate_limit_per_s, granted)
                return PullResult(NO_NEW_MSG, ack=ack_outcome)
            waiting = self.metrics.child(self.metrics.waiting, c.name)
            waiting.inc()
            try:
                await self.store.wait_for_data(c.topic, min(remaining, LOCK_RECHECK_S))
            finally:
                waiting.dec()

    async def _serve(
        self, c: ConsumerRecord, layout: Layout, client: str, lease: Lease
    ) -> tuple[int, list[tuple[int, bytes]], int] | None:
        """What a lease delivers: (end offset, messages, reconsume count), or None when the
        batch went elsewhere instead (dead letters; redelivery with backoff, SPEC S5; all expired)."""
        slot = layout.slot(lease.queue)
        if lease.dead_letter:
            msgs = await self.store.read(
                slot.topic, slot.queue, lease.offset, lease.next_offset - lease.offset
            )
            await self._settle_elsewhere(c, client, lease, msgs, msgs, DLQ_REASON_ATTEMPTS)
            return None
        if lease.attempts > 1 and c.mode == MODE_CLUSTER:
            # Delivered before and not acked (lock expired or released): back off, through the
            # scheduler, instead of handing the same batch out again at once.
            msgs = await self.store.read(
                slot.topic, slot.queue, lease.offset, lease.next_offset - lease.offset
            )
            await self._redeliver_later(c, client, lease, msgs, lease.attempts - 1)
            return None
        raw = await self.store.read_raw(
            slot.topic, slot.queue, lease.offset, lease.next_offset - lease.offset
        )
        if not raw:
            return None
        end = raw[-1][0] + 1
        reconsumed = lease.attempts - 1
        now = now_ms()
        live = raw
        if any(_MARK_DEADLINE in r for _, r in raw) or slot.topic != c.topic:
            decoded = [(o, _decode_stored(r)) for o, r in raw]
            expired = [(o, m) for o, m in decoded if is_expired(m.deadline_ms or 0, now)]
            if expired:
                gone = {o for o, _ in expired}
                live = [(o, r) for o, r in raw if o not in gone]
                self.metrics.child(self.metrics.expired, c.name).inc(len(expired))
                if not live:
                    await self._settle_elsewhere(c, client, lease, decoded, expired, DLQ_REASON_EXPIRED, end)
                    return None
                await self._to_dead_letters(c, client, lease, expired, DLQ_REASON_EXPIRED)
            reconsumed += max((_deliveries(m) for _, m in decoded), default=0)
        return end, live, reconsumed

    async def _redeliver_later(
        self,
        c: ConsumerRecord,
        client: str,
        lease: Lease,
        msgs: list[tuple[int, StoredMessage]],
        failed_now: int,
    ) -> None:
        """Hold each message for the consumer's retry queue after its backoff (SPEC S5), or
        dead-letter it when its deadline or max attempts come first; then commit the batch."""
        now = now_ms()
        holds: list[tuple[bytes, list[Destination]]] = []
        given_up: list[tuple[int, StoredMessage]] = []
        for o, m in msgs:
            failures = _deliveries(m) + failed_now
            due = redelivery_due(now, failures, m.deadline_ms or 0, c.max_attempts)
            if due is None:
                given_up.append((o, m))
                continue
            again = msgspec.structs.replace(
                m, properties={**m.properties, DELIVERIES_PROPERTY: str(failures)}
            )
            target = Destination(RETRY_TARGET + c.name, due, m.deadline_ms or 0, m.priority or 0)
            holds.append((held_payload(again, None), [target]))
        if holds:
            await self.scheduler.hold(holds)
        reason = DLQ_REASON_ATTEMPTS
        if given_up and all(m.deadline_ms for _, m in given_up):
            reason = DLQ_REASON_EXPIRED
        await self._settle_elsewhere(c, client, lease, msgs, given_up, reason)

    async def _settle_elsewhere(
        self,
        c: ConsumerRecord,
        client: str,
        lease: Lease,
        msgs: list[tuple[int, StoredMessage]],
        dead: list[tuple[int, StoredMessage]],
        reason: str,
        end: int | None = None,
    ) -> None:
        """Commit a leased batch that was not delivered, after moving `dead` to the dead-letter
        topic (the rest was held for redelivery)."""
        if dead:
            await self._to_dead_letters(c, client, lease, dead, reason)
        next_offset = end if end is not None else (msgs[-1][0] + 1 if msgs else lease.next_offset)
        token = AckToken(
            c.name, client, self.store.broker, lease.queue, lease.offset, next_offset, lease.lock_ts
        )
        await self.offsets.record_dead_letters(token, len(dead), now_ms())
        self.store.wake(c.topic)

    async def _to_dead_letters(
        self, c: ConsumerRecord, client: str, lease: Lease, msgs: list[tuple[int, StoredMessage]], reason: str
    ) -> None:
        dlq = await self._topic(dlq_topic(c.name))
        ts = now_ms()
        moved = [
            msgspec.structs.replace(
                m,
                timestamp_ms=ts,
                deadline_ms=None,  # dead letters are kept for inspection, not expired again
                properties={
                    **m.properties,
                    "dlq.reason": reason,
                    "dlq.topic": c.topic,
                    "dlq.queue": str(lease.queue),
                    "dlq.offset": str(o),
                    "dlq.attempts": str(_deliveries(m) + lease.attempts),
                    "dlq.clientId": client,
                    **({"dlq.deadline": str(m.deadline_ms)} if m.deadline_ms else {}),
                },
            )
            for o, m in msgs
        ]
        await self.store.append(dlq.name, 0, moved)
        self.metrics.child(self.metrics.dead_lettered, c.name).inc(len(moved))
        log.warning("consumer %s: %d messages dead-lettered (%s)", c.name, len(moved), reason)

    def _table_client(self, c: ConsumerRecord, client_id: str | None) -> str:
        if c.mode == MODE_CLUSTER:
            return ""
        if client_id is None:
            raise BadRequest(
                f"clientId is required: consumer {c.name} is a broadcast consumer", field="clientId"
            )
        return validate_name(client_id, "clientId")

    async def _ensure_table(self, c: ConsumerRecord, layout: Layout, client: str) -> None:
        key = (c.name, client)
        if self._table_sizes.get(key, 0) < layout.size:
            await self.offsets.ensure_table(c.name, client, await self._start_offsets(c, layout), now_ms())
            self._table_sizes[key] = layout.size

    async def _lease(
        self, c: ConsumerRecord, layout: Layout, client: str, max_count: int, owner: str
    ) -> Lease | None:
        await self._ensure_table(c, layout, client)
        bounds = await self._bounds(layout)
        args: dict[str, Any] = {
            "now_ms": now_ms(),
            "max_count": max_count,
            "lock_timeout_ms": int(c.lock_timeout_s * 1000),
            "max_attempts": c.max_attempts,
            "owner": owner,
        }
        try:
            return await self.offsets.lease(c.name, client, bounds, **args)
        except NotFound:  # removed meanwhile (an expired broadcast client): start again
            self._table_sizes.pop((c.name, client), None)
            await self._ensure_table(c, layout, client)
            return await self.offsets.lease(c.name, client, bounds, **args)

    async def ack(self, c: ConsumerRecord, token: AckToken) -> None:
        refusal = await self.offsets.ack(token, now_ms())
        self.metrics.child(self.metrics.acks, c.name, refusal or "ok").inc()
        _raise_refusal(refusal, "ack")
        self.store.wake(c.topic)

    async def release(self, c: ConsumerRecord, token: AckToken) -> None:
        if c.mode != MODE_CLUSTER:  # broadcast: delivered again at once to the same client
            _raise_refusal(await self.offsets.release(token, now_ms()), "release")
            self.store.wake(c.topic)
            return
        # Hold the lock while the batch is handed to the scheduler, so no one else takes it.
        _raise_refusal(await self.offsets.extend(token, now_ms(), RELEASE_HOLD_S), "release")
        layout = await self._layout(c)
        slot = layout.slot(token.queue)
        msgs = await self.store.read(slot.topic, slot.queue, token.offset, token.next_offset - token.offset)
        lease = Lease(token.queue, token.offset, token.next_offset, token.lock_ts, 1)
        await self._redeliver_later(c, token.client_id, lease, msgs, 1)

    async def extend(self, c: ConsumerRecord, token: AckToken, seconds: float) -> None:
        _raise_refusal(await self.offsets.extend(token, now_ms(), seconds), "extend")

    # --- reading by offset (log readers such as a Spark job) -------------------------------

    async def log_bounds(self, topic: str) -> list[QueueBounds]:
        """min/max of each of the topic's store queues (every priority lane, in store order)."""
        await self._topic(topic)
        return await self.store.bounds(topic)

    async def read_log(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> tuple[int, list[tuple[int, bytes]]]:
        """Up to `max_count` stored records of one queue from `offset` on, without locks or
        commits: (first offset read, records). Retention may have removed older records."""
        bounds = await self.log_bounds(topic)
        if not 0 <= queue < len(bounds):
            raise BadRequest(f"queue must be between 0 and {len(bounds) - 1}", field="queue")
        start = max(offset, bounds[queue].min)
        raw = await self.store.read_raw(topic, queue, start, max_count)
        return (raw[0][0] if raw else start), raw

    async def commit_offsets(self, c: ConsumerRecord, offsets: dict[int, int]) -> dict[int, int]:
        """Raise the committed offsets of `c`'s topic queues (store numbering) to those given,
        never lowering one: the progress of a reader that tracks its own position."""
        if c.mode != MODE_CLUSTER:
            raise BadRequest(f"consumer {c.name} is in {c.mode} mode; commit needs cluster", field="consumer")
        layout = await self._layout(c)
        await self._ensure_table(c, layout, "")
        bounds = await self._bounds(layout)
        topic_queues = layout.queues * layout.lanes
        moves: dict[int, int] = {}
        for q, offset in offsets.items():
            where = f"offsets.{q}"
            if not 0 <= q < topic_queues:
                raise BadRequest(f"topic {c.topic} has queues 0 to {topic_queues - 1}", field=where)
            index = view_queue(q, layout.queues)
            if not 0 <= offset <= bounds[index].max:
                raise BadRequest(
                    f"offset must be between 0 and the queue's end {bounds[index].max}", field=where
                )
            moves[index] = offset
        committed = await self.offsets.advance(c.name, "", moves, now_ms())
        return {q: committed[view_queue(q, layout.queues)] for q in offsets}

    # --- operations ---------------------------------------------------------------------

    async def consumer(self, name: str) -> ConsumerRecord:
        rec = self.registry.consumer(name)
        if rec is None and await self.registry.refresh_on_miss():
            rec = self.registry.consumer(name)
        if rec is None:
            raise NotFound(f"consumer {name} is not registered", field="consumer")
        return rec

    async def progress(self, name: str) -> dict[str, Any]:
        c = await self.consumer(name)
        layout = await self._layout(c)
        bounds = await self._bounds(layout)
        now = now_ms()
        clients = await self.offsets.clients(name)
        queues = []
        total_lag = 0
        total_dead = 0
        for client in clients:
            table = await self.offsets.table(name, client) or []
            for b, e in zip(bounds, table, strict=False):
                slot = layout.slot(b.queue)
                lag = max(b.max - max(e.committed, b.min), 0)
                total_lag += lag
                total_dead += e.dead_lettered
                locked = lock_is_held(e.lock_ts, e.lock_deadline_ms, now)
                queues.append(
                    {
                        "clientId": client or None,
                        "broker": self.store.broker,
                        "queue": b.queue,
                        "source": slot.topic,
                        "lane": slot.lane,
                        "min": b.min,
                        "max": b.max,
                        "committed": e.committed,
                        "lag": lag,
                        "locked": locked,
                        "lockAgeMs": now - e.lock_ts if locked else None,
                        "lockOwner": e.lock_owner if locked else None,
                        "lastAccessMs": e.last_access_ms or None,
                        "attempts": e.attempts,
                        "deadLettered": e.dead_lettered,
                    }
                )
        self.metrics.child(self.metrics.lag, name).set(total_lag)
        return {
            "consumer": name,
            "topic": c.topic,
            "mode": c.mode,
            "paused": c.paused,
            "rateLimit": c.rate_limit_per_s,
            "alertBacklog": c.alert_backlog,
            "lag": total_lag,
            "deadLettered": total_dead,
            "queues": queues,
        }

    async def reset(
        self,
        name: str,
        to: str,
        *,
        offset: int | None,
        timestamp_ms: int | None,
        queue: int | None,
        client_id: str | None,
    ) -> dict[str, Any]:
        c = await self.consumer(name)
        layout = await self._layout(c)
        bounds = await self._bounds(layout)
        if queue is not None and not 0 <= queue < len(bounds):
            raise BadRequest(f"queue must be between 0 and {len(bounds) - 1}", field="queue")
        if to not in ("earliest", "latest", "offset", "timestamp"):
            raise BadRequest("to must be earliest, latest, offset or timestamp", field="to")
        if to == "offset" and offset is None:
            raise BadRequest("offset is required with to=offset", field="offset")
        if to == "timestamp" and timestamp_ms is None:
            raise BadRequest("timestamp is required with to=timestamp", field="timestamp")
        clients = [client_id] if client_id is not None else await self.offsets.clients(name)
        if c.mode == MODE_CLUSTER:
            clients = [""]
        for client in clients:
            if c.mode == MODE_CLUSTER or await self.offsets.table(name, client) is not None:
                await self._ensure_table(c, layout, client)
            if await self.offsets.table(name, client) is None:
                raise NotFound(f"consumer {name} has no clientId {client}", field="clientId")
            for b in bounds:
                if queue is not None and b.queue != queue:
                    continue
                if to == "earliest":
                    target = b.min
                elif to == "latest":
                    target = b.max
                elif to == "offset":
                    assert offset is not None
                    target = min(max(offset, b.min), b.max)
                else:
                    assert timestamp_ms is not None
                    slot = layout.slot(b.queue)
                    target = await self.store.offset_for_time(slot.topic, slot.queue, timestamp_ms)
                await self.offsets.reset(name, client, b.queue, target)
        self.store.wake(c.topic)
        return await self.progress(name)

    async def update_consumer(self, name: str, **changes: Any) -> ConsumerRecord:
        await self.consumer(name)
        await self.registry.change("update_consumer", name, **changes)
        return await self.consumer(name)

    async def alerts(self) -> list[dict[str, Any]]:
        out = []
        for c in list(self.registry.snapshot.consumers.values()):
            if c.alert_backlog > 0:
                lag = (await self.progress(c.name))["lag"]
                if lag > c.alert_backlog:
                    out.append(
                        {
                            "consumer": c.name,
                            "topic": c.topic,
                            "lag": lag,
                            "threshold": c.alert_backlog,
                        }
                    )
        return out

    async def refresh_lag_metrics(self) -> None:
        for c in list(self.registry.snapshot.consumers.values()):
            await self.progress(c.name)


def _deliveries(m: StoredMessage) -> int:
    value = m.properties.get(DELIVERIES_PROPERTY, "0")
    return int(value) if value.isdigit() else 0


def _check_bearer(bearer: str | None, token_hash: str, who: str) -> None:
    if not bearer:
        raise Unauthorized(f"Authorization: Bearer <token> of {who} is required", field="Authorization")
    if not token_matches(bearer, token_hash):
        raise Forbidden(f"the token is not {who}'s", field="Authorization")


def _raise_refusal(refusal: AckRefusal | None, what: str) -> None:
    if refusal is not None:
        raise Conflict(f"{what} refused: {refusal.replace('_', ' ')}", field="requestId", code=refusal)
