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

from mqgate.core.acks import AckRefusal
from mqgate.core.ids import new_message_ids
from mqgate.core.queue_choice import lock_is_held
from mqgate.core.ratelimit import TokenBucket
from mqgate.core.tokens import AckToken, decode_token, encode_token
from mqgate.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from mqgate.gateway.metrics import Metrics
from mqgate.model import MODE_BROADCAST, MODE_CLUSTER, NewMessage, Receipt, StoredMessage
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
    ) -> None:
        self.settings = settings
        self.store = store
        self.offsets = offsets
        self.registry = registry
        self.secret = secret
        self.metrics = metrics
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        await self.offsets.open()
        await self.registry.start()
        for topic in self.registry.snapshot.topics.values():
            await self._ensure_store_topic(topic)
        loop = asyncio.get_running_loop()
        self._tasks = [
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
        await self.offsets.close()
        await self.store.close()

    async def _every(self, seconds: float, job: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
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
            await self.store.create_topic(
                TopicConfig(topic.name, topic.queues, topic.retention_ms, topic.retention_bytes)
            )

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
        self, name: str, queues: int, retention_ms: int, retention_bytes: int | None
    ) -> TopicRecord:
        validate_topic_name(name, "name")
        rec = TopicRecord(name, queues, retention_ms, retention_bytes, now_ms())
        await self.registry.change("add_topic", rec)
        await self._ensure_store_topic(rec)
        return rec

    async def register_producer(self, name: str, topic: str) -> tuple[ProducerRecord, str]:
        validate_name(name, "name")
        await self._topic(topic)
        token = new_token("mqp")
        rec = ProducerRecord(name, topic, hash_token(token), now_ms())
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
        if mode == MODE_CLUSTER:
            await self.offsets.ensure_table(name, "", await self._start_offsets(rec), now_ms())
        return rec, token

    async def _start_offsets(self, c: ConsumerRecord) -> list[int]:
        bounds = await self.store.bounds(c.topic)
        if c.start == "earliest":
            return [b.min for b in bounds]
        if c.start == "latest":
            return [b.max for b in bounds]
        ts = int(c.start)
        return [await self.store.offset_for_time(c.topic, b.queue, ts) for b in bounds]

    # --- authentication -----------------------------------------------------------------

    def producer_for(self, name: str, bearer: str | None) -> ProducerRecord:
        validate_name(name, "producer")
        rec = self.registry.producer(name)
        if rec is None:
            raise NotFound(f"producer {name} is not registered", field="producer")
        _check_bearer(bearer, rec.token_hash, f"producer {name}")
        return rec

    def consumer_for(self, name: str, bearer: str | None) -> ConsumerRecord:
        validate_name(name, "consumer")
        rec = self.consumer(name)
        _check_bearer(bearer, rec.token_hash, f"consumer {name}")
        return rec

    def token_for(self, request_id: str, bearer: str | None) -> tuple[ConsumerRecord, AckToken]:
        token = decode_token(request_id, self.secret)
        return self.consumer_for(token.consumer, bearer), token

    # --- produce ------------------------------------------------------------------------

    def _queue_for(self, topic: TopicRecord, msg: NewMessage) -> int:
        if msg.order_key is not None:
            return zlib.crc32(msg.order_key.encode()) % topic.queues
        counter = self._round_robin.get(topic.name)
        if counter is None:
            counter = self._round_robin[topic.name] = itertools.count()
        return next(counter) % topic.queues

    async def produce(self, producer: ProducerRecord, messages: list[NewMessage]) -> list[Receipt]:
        topic = await self._topic(producer.topic)
        ts = now_ms()
        by_queue: dict[int, list[StoredMessage]] = {}
        placed: list[tuple[int, int]] = []  # (queue, index within that queue's batch)
        for m, msg_id in zip(messages, new_message_ids(ts, len(messages)), strict=True):
            q = self._queue_for(topic, m)
            batch = by_queue.setdefault(q, [])
            placed.append((q, len(batch)))
            batch.append(StoredMessage(msg_id, ts, producer.name, m.body, m.keys, m.tags, m.properties))
        firsts = await self.store.append_many(topic.name, by_queue)
        self.metrics.child(self.metrics.produced, topic.name).inc(len(messages))
        broker = self.store.broker
        return [Receipt(by_queue[q][i].msg_id, broker, q, firsts[q] + i) for q, i in placed]

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
        bucket = self._bucket(c)
        if bucket is not None:
            granted = bucket.take(max_count, time.monotonic())
            if granted == 0:
                return PullResult(RATE_LIMITED, ack=ack_outcome, retry_after_s=bucket.retry_after_s())
        deadline = time.monotonic() + wait_s
        await self._topic(c.topic)
        while True:
            lease = await self._lease(c, table_client, granted, owner)
            if lease is not None and lease.dead_letter:
                await self._dead_letter(c, table_client, lease)
                continue
            if lease is not None:
                msgs = await self.store.read_raw(
                    c.topic, lease.queue, lease.offset, lease.next_offset - lease.offset
                )
                if msgs:
                    if bucket is not None:
                        bucket.tokens += granted - len(msgs)
                    token = AckToken(
                        c.name,
                        table_client,
                        self.store.broker,
                        lease.queue,
                        lease.offset,
                        msgs[-1][0] + 1,
                        lease.lock_ts,
                    )
                    self.metrics.child(self.metrics.consumed, c.name).inc(len(msgs))
                    return PullResult(
                        FOUND,
                        request_id=encode_token(token, self.secret),
                        queue=lease.queue,
                        messages=msgs,
                        reconsume_times=lease.attempts - 1,
                        ack=ack_outcome,
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if bucket is not None:
                    bucket.tokens += granted
                return PullResult(NO_NEW_MSG, ack=ack_outcome)
            await self.store.wait_for_data(c.topic, min(remaining, LOCK_RECHECK_S))

    def _table_client(self, c: ConsumerRecord, client_id: str | None) -> str:
        if c.mode == MODE_CLUSTER:
            return ""
        if client_id is None:
            raise BadRequest(
                f"clientId is required: consumer {c.name} is a broadcast consumer", field="clientId"
            )
        return validate_name(client_id, "clientId")

    def _bucket(self, c: ConsumerRecord) -> TokenBucket | None:
        if c.rate_limit_per_s <= 0:
            self._buckets.pop(c.name, None)
            return None
        bucket = self._buckets.get(c.name)
        if bucket is None or bucket.rate_per_s != c.rate_limit_per_s:
            bucket = self._buckets[c.name] = TokenBucket.full(c.rate_limit_per_s, time.monotonic())
        return bucket

    async def _lease(self, c: ConsumerRecord, client: str, max_count: int, owner: str) -> Lease | None:
        bounds = await self.store.bounds(c.topic)
        args: dict[str, Any] = {
            "now_ms": now_ms(),
            "max_count": max_count,
            "lock_timeout_ms": int(c.lock_timeout_s * 1000),
            "max_attempts": c.max_attempts,
            "owner": owner,
        }
        try:
            return await self.offsets.lease(c.name, client, bounds, **args)
        except NotFound:
            await self.offsets.ensure_table(c.name, client, await self._start_offsets(c), now_ms())
            return await self.offsets.lease(c.name, client, bounds, **args)

    async def _dead_letter(self, c: ConsumerRecord, client: str, lease: Lease) -> None:
        msgs = await self.store.read(c.topic, lease.queue, lease.offset, lease.next_offset - lease.offset)
        dlq = await self._topic(dlq_topic(c.name))
        ts = now_ms()
        moved = [
            StoredMessage(
                m.msg_id,
                ts,
                m.producer,
                m.body,
                m.keys,
                m.tags,
                {
                    **m.properties,
                    "dlq.reason": DLQ_REASON_ATTEMPTS,
                    "dlq.topic": c.topic,
                    "dlq.queue": str(lease.queue),
                    "dlq.offset": str(o),
                    "dlq.attempts": str(lease.attempts),
                    "dlq.clientId": client,
                },
            )
            for o, m in msgs
        ]
        if moved:
            await self.store.append(dlq.name, 0, moved)
        next_offset = msgs[-1][0] + 1 if msgs else lease.next_offset
        token = AckToken(
            c.name, client, self.store.broker, lease.queue, lease.offset, next_offset, lease.lock_ts
        )
        if await self.offsets.record_dead_letters(token, len(moved), ts) is None:
            self.metrics.child(self.metrics.dead_lettered, c.name).inc(len(moved))
            log.warning(
                "consumer %s: %d messages dead-lettered from queue %d",
                c.name,
                len(moved),
                lease.queue,
            )

    async def ack(self, c: ConsumerRecord, token: AckToken) -> None:
        refusal = await self.offsets.ack(token, now_ms())
        self.metrics.child(self.metrics.acks, c.name, refusal or "ok").inc()
        _raise_refusal(refusal, "ack")
        self.store.wake(c.topic)

    async def release(self, c: ConsumerRecord, token: AckToken) -> None:
        _raise_refusal(await self.offsets.release(token, now_ms()), "release")
        self.store.wake(c.topic)

    async def extend(self, c: ConsumerRecord, token: AckToken, seconds: float) -> None:
        _raise_refusal(await self.offsets.extend(token, now_ms(), seconds), "extend")

    # --- operations ---------------------------------------------------------------------

    def consumer(self, name: str) -> ConsumerRecord:
        rec = self.registry.consumer(name)
        if rec is None:
            raise NotFound(f"consumer {name} is not registered", field="consumer")
        return rec

    async def progress(self, name: str) -> dict[str, Any]:
        c = self.consumer(name)
        await self._topic(c.topic)
        bounds = await self.store.bounds(c.topic)
        now = now_ms()
        clients = await self.offsets.clients(name)
        queues = []
        total_lag = 0
        total_dead = 0
        for client in clients:
            table = await self.offsets.table(name, client) or []
            for b, e in zip(bounds, table, strict=False):
                lag = max(b.max - max(e.committed, b.min), 0)
                total_lag += lag
                total_dead += e.dead_lettered
                locked = lock_is_held(e.lock_ts, e.lock_deadline_ms, now)
                queues.append(
                    {
                        "clientId": client or None,
                        "broker": self.store.broker,
                        "queue": b.queue,
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
        c = self.consumer(name)
        bounds = await self.store.bounds(c.topic)
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
            if not await self.offsets.table(name, ""):
                await self.offsets.ensure_table(name, "", await self._start_offsets(c), now_ms())
        for client in clients:
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
                    target = await self.store.offset_for_time(c.topic, b.queue, timestamp_ms)
                await self.offsets.reset(name, client, b.queue, target)
        self.store.wake(c.topic)
        return await self.progress(name)

    async def update_consumer(self, name: str, **changes: Any) -> ConsumerRecord:
        self.consumer(name)
        await self.registry.change("update_consumer", name, **changes)
        return self.consumer(name)

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


def _check_bearer(bearer: str | None, token_hash: str, who: str) -> None:
    if not bearer:
        raise Unauthorized(f"Authorization: Bearer <token> of {who} is required", field="Authorization")
    if not token_matches(bearer, token_hash):
        raise Forbidden(f"the token is not {who}'s", field="Authorization")


def _raise_refusal(refusal: AckRefusal | None, what: str) -> None:
    if refusal is not None:
        raise Conflict(f"{what} refused: {refusal.replace('_', ' ')}", field="requestId", code=refusal)
