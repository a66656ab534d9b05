"""Consume (SPEC G4-G6, G8): pull a batch from one locked queue, ack, release, extend."""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any, Final

import msgspec

from mqgate.core.acks import AckRefusal
from mqgate.core.budget import within_budget
from mqgate.core.layout import Layout
from mqgate.core.scheduling import is_expired
from mqgate.core.tokens import (
    TICKET_TOKEN_HASH_CHARS,
    AckToken,
    StreamTicket,
    decode_ticket,
    decode_token,
    encode_ticket,
    encode_token,
)
from mqgate.errors import BadRequest, Conflict, Forbidden, MqgateError, NotFound
from mqgate.model import MODE_CLUSTER, MODE_MESSAGE, MODE_PUSH, decode_stored
from mqgate.names import validate_name
from mqgate.offsets.interface import Lease
from mqgate.registry.records import ConsumerRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.observers import Observers
from mqgate.services.redelivery import (
    DLQ_REASON_ATTEMPTS,
    DLQ_REASON_EXPIRED,
    Redelivery,
    attempts,
    deliveries,
)
from mqgate.services.topology import Topology
from mqgate.store.scope import request_scope

FOUND: Final = "FOUND"
NO_NEW_MSG: Final = "NO_NEW_MSG"
PAUSED: Final = "PAUSED"
RATE_LIMITED: Final = "RATE_LIMITED"
# A consumer's (or broadcast client's) longest waiting pull re-checks at least this often,
# so an expired lock is noticed in time; one pull per reader, not every waiting one.
LOCK_RECHECK_S: Final = 1.0
# How long a released batch stays locked while it is handed to the scheduler.
RELEASE_HOLD_S: Final = 30.0
_MARK_DEADLINE: Final = b'"deadline":'
_payload: Final = itemgetter(1)


class PullResult(msgspec.Struct):
    status: str
    request_id: str | None = None
    queue: int = -1  # the store queue of `source` (one numbering everywhere, docs/PROTOCOL.md)
    source: str | None = None  # the store topic, when not the consumer's topic (retry, inbox)
    messages: list[tuple[int, bytes]] | None = None  # (offset, stored JSON object)
    reconsume_times: int = 0
    # When the gateway took the batch (epoch ms): the time its deadlines were checked against.
    pop_time_ms: int = 0
    ack: str | None = None  # outcome of the ack carried by the pull, if any
    retry_after_s: float = 0.0


class Consuming:
    def __init__(self, ctx: Context, topology: Topology, observers: Observers) -> None:
        self.ctx = ctx
        self.topology = topology
        self.observers = observers
        self.redelivery = Redelivery(ctx, observers)
        self._table_sizes: dict[tuple[str, str], int] = {}  # tables known to be this long
        self._budget = ctx.settings.max_answer_bytes
        # Set on shutdown: waiting pulls answer NO_NEW_MSG at once and new ones do not wait.
        self.closing = False

    def stop_waiting(self) -> None:
        """Shutdown begins: answer every waiting pull now (the process is about to go)."""
        self.closing = True
        self.ctx.store.wake_all()

    def token(self, request_id: str) -> AckToken:
        """The ack token a requestId carries, if this gateway cluster signed it."""
        return decode_token(request_id, self.ctx.secret)

    def ticket(self, text: str) -> StreamTicket:
        """The stream ticket `text` carries, if this gateway cluster signed it."""
        return decode_ticket(text, self.ctx.secret)

    def issue_ticket(self, c: ConsumerRecord, client_id: str | None, expires_in_s: float) -> tuple[str, int]:
        """A stream ticket for `c`'s stream (and its client's): the ticket and when it expires."""
        expires_ms = int(time.time() * 1000 + expires_in_s * 1000)
        ticket = StreamTicket(c.name, client_id or "", c.token_hash[:TICKET_TOKEN_HASH_CHARS], expires_ms)
        return encode_ticket(ticket, self.ctx.secret), expires_ms

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
        with request_scope():  # lease, read and token on one cluster (SPEC P8)
            return await self._pull(
                c, client_id=client_id, max_count=max_count, wait_s=wait_s, request_id=request_id, owner=owner
            )

    async def _pull(
        self,
        c: ConsumerRecord,
        *,
        client_id: str | None,
        max_count: int,
        wait_s: float,
        request_id: str | None,
        owner: str,
    ) -> PullResult:
        ctx = self.ctx
        if c.mode == MODE_MESSAGE:
            raise BadRequest(
                f"consumer {c.name} receives message by message: use POST /mq/receive", field="consumer"
            )
        if c.mode == MODE_PUSH:
            raise BadRequest(
                f"consumer {c.name} is a push consumer: the gateway delivers to it", field="consumer"
            )
        ack_outcome: str | None = None
        limited = c.rate_limit_per_s > 0
        ack: AckToken | None = None  # acked with the first lease, in one step where the store can
        if request_id:
            token = self.token(request_id)
            if token.consumer != c.name:
                raise Forbidden("requestId belongs to another consumer", field="requestId")
            if c.paused or limited:
                ack_outcome = await self._commit(c, token) or "ok"
            else:
                ack = token
        if c.paused:
            return PullResult(PAUSED, ack=ack_outcome)
        table_client = self._table_client(c, client_id)
        granted = max_count
        if limited:
            granted, retry_after_s = await ctx.offsets.take_tokens(
                c.name, c.rate_limit_per_s, max_count, now_ms()
            )
            if granted == 0:
                return PullResult(RATE_LIMITED, ack=ack_outcome, retry_after_s=retry_after_s)
        deadline = time.monotonic() + wait_s
        layout = await self.topology.layout(c)
        while True:
            if ack is None:
                lease = await self._lease(c, layout, table_client, granted, owner)
            else:
                refusal, lease = await self._ack_and_lease(c, ack, layout, table_client, granted, owner)
                ack_outcome = refusal or "ok"
                ack = None
            if lease is not None:
                found = await self._serve(c, layout, table_client, lease)
                if found is not None:
                    offset_end, msgs, reconsumed, popped_ms = found
                    if limited and granted > len(msgs):
                        await ctx.offsets.return_tokens(c.name, c.rate_limit_per_s, granted - len(msgs))
                    token = AckToken(
                        c.name,
                        table_client,
                        ctx.store.broker,
                        lease.queue,
                        lease.offset,
                        offset_end,
                        lease.lock_ts,
                    )
                    ctx.metrics.child(ctx.metrics.consumed, c.name).inc(len(msgs))
                    slot = layout.slot(lease.queue)
                    observers = self.observers
                    for pulled in observers.pulled:
                        pulled(c, slot.queue if slot.topic == c.topic else None, len(msgs))
                    request = encode_token(token, ctx.secret)
                    for delivered in observers.delivered:
                        msgs = delivered(c, slot, msgs, request, table_client, owner, reconsumed + 1)
                    return PullResult(
                        FOUND,
                        request_id=request,
                        queue=slot.queue,
                        source=slot.topic if slot.topic != c.topic else None,
                        messages=msgs,
                        reconsume_times=reconsumed,
                        pop_time_ms=popped_ms,
                        ack=ack_outcome,
                    )
                continue  # the lease was settled without delivering (dead letters, redelivery)
            remaining = deadline - time.monotonic()
            for pulled in self.observers.pulled:
                pulled(c, None, 0)
            if remaining > 0 and not self.closing:
                waiting = ctx.metrics.child(ctx.metrics.waiting, c.name)
                waiting.inc()
                try:
                    await ctx.store.wait_for_data(c.topic, remaining, (c.name, table_client), LOCK_RECHECK_S)
                finally:
                    waiting.dec()
                paused = ctx.registry.paused(c.name)  # since the poll began: nothing more
                if not self.closing and not paused:
                    continue
            else:
                paused = False
            if limited:
                await ctx.offsets.return_tokens(c.name, c.rate_limit_per_s, granted)
            return PullResult(PAUSED if paused else NO_NEW_MSG, ack=ack_outcome)

    async def _serve(
        self, c: ConsumerRecord, layout: Layout, client: str, lease: Lease
    ) -> tuple[int, list[tuple[int, bytes]], int, int] | None:
        """What a lease delivers: (end offset, messages, reconsume count, the time its deadlines
        were checked against), or None when the
        batch went elsewhere instead (dead letters; redelivery with backoff, SPEC S5; all expired)."""
        store = self.ctx.store
        slot = layout.slot(lease.queue)
        count = lease.next_offset - lease.offset
        if lease.dead_letter:
            msgs = await store.read(slot.topic, slot.queue, lease.offset, count)
            await self.redelivery.settle_elsewhere(
                c, client, lease, msgs, msgs, DLQ_REASON_ATTEMPTS, delivered=lease.attempts
            )
            return None
        if lease.attempts > 1 and c.mode == MODE_CLUSTER:
            # Delivered before and not acked (lock expired or released): back off, through the
            # scheduler, instead of handing the same batch out again at once.
            msgs = await store.read(slot.topic, slot.queue, lease.offset, count)
            self.redelivery.trace(c, slot, msgs, "lock_expired", attempts(msgs, lease.attempts - 1))
            await self.redelivery.later(c, client, lease, msgs, lease.attempts - 1)
            return None
        records = lease.records  # read with the lease (the store process's), or now
        if records is None:
            records = await store.read_raw(slot.topic, slot.queue, lease.offset, count)
        raw = fitting(records, self._budget)
        if not raw:
            return None
        end = raw[-1][0] + 1  # the ack commits what was answered; the rest comes next
        reconsumed = lease.attempts - 1
        now = now_ms()
        live = raw
        # One search of all the records (a key cannot span two: each is a JSON object) instead
        # of one per record; a body's quotes are escaped, so only a field matches (or a
        # property of that name: then the records are decoded, as they would be anyway).
        if slot.topic != c.topic or _MARK_DEADLINE in b"".join(map(_payload, raw)):
            decoded = [(o, decode_stored(r)) for o, r in raw]
            expired = [(o, m) for o, m in decoded if is_expired(m.deadline_ms or 0, now)]
            if expired:
                gone = {o for o, _ in expired}
                live = [(o, r) for o, r in raw if o not in gone]
                self.ctx.metrics.child(self.ctx.metrics.expired, c.name).inc(len(expired))
                if not live:
                    await self.redelivery.settle_elsewhere(
                        c,
                        client,
                        lease,
                        decoded,
                        expired,
                        DLQ_REASON_EXPIRED,
                        end,
                        delivered=lease.attempts - 1,
                    )
                    return None
                await self.redelivery.dead_letter_part(
                    c, client, lease, expired, DLQ_REASON_EXPIRED, lease.attempts - 1
                )
            reconsumed += max((deliveries(m) for _, m in decoded), default=0)
        return end, live, reconsumed, now

    def _table_client(self, c: ConsumerRecord, client_id: str | None) -> str:
        if c.mode == MODE_CLUSTER:
            return ""
        if client_id is None:
            raise BadRequest(
                f"clientId is required: consumer {c.name} is a broadcast consumer", field="clientId"
            )
        return validate_name(client_id, "clientId")

    def forget(self, consumer: str) -> None:
        """The consumer was deleted: its tables are gone, and one of the same name starts anew."""
        for key in [k for k in self._table_sizes if k[0] == consumer]:
            del self._table_sizes[key]

    async def ensure_table(self, c: ConsumerRecord, layout: Layout, client: str) -> None:
        """The consumer's (or broadcast client's) offset table covers every queue of `layout`."""
        key = (c.name, client)
        if self._table_sizes.get(key, 0) < layout.size:
            table = await self.ctx.offsets.table(c.name, client)
            starts = await self.topology.start_offsets(c, layout, len(table) if table else 0)
            await self.ctx.offsets.ensure_table(c.name, client, starts, now_ms())
            self._table_sizes[key] = layout.size

    def _lease_args(self, c: ConsumerRecord, max_count: int, owner: str) -> dict[str, Any]:
        return {
            "now_ms": now_ms(),
            "max_count": max_count,
            "lock_timeout_ms": int(c.lock_timeout_s * 1000),
            "max_attempts": c.max_attempts,
            "owner": owner,
        }

    async def _ack_and_lease(
        self, c: ConsumerRecord, token: AckToken, layout: Layout, client: str, max_count: int, owner: str
    ) -> tuple[AckRefusal | None, Lease | None]:
        """A pull's ack of its previous batch and its lease, in one round trip where the offset
        store can. The ack is answered and counted whatever happened to the lease after it."""
        await self.ensure_table(c, layout, client)
        offsets = self.ctx.offsets
        bounds = None if offsets.reads_bounds else await self.topology.bounds(layout)
        args = self._lease_args(c, max_count, owner)
        got = await offsets.ack_and_lease(token, c.name, client, bounds, read_from=layout, **args)
        lease = got.lease
        # A lease that took the acked queue again (the same table, on the same cluster) leaves
        # nothing for a waiting pull to wake to.
        relocked = (
            lease is not None
            and lease.queue == token.queue
            and token.client_id == client
            and token.broker == self.ctx.store.broker
        )
        try:
            await self._acked(c, token, got.refusal, freed=not relocked)
        except MqgateError as exc:
            if lease is None:
                raise
            # A feature's record of the ack failed (a trace written to a failing cluster): the
            # batch leased with it is delivered all the same, not left locked to its timeout.
            self.ctx.health.fault("consume", "ack_observer", f"consumer {c.name}: {exc.message}")
        if got.lease_error is None:
            return got.refusal, lease
        if isinstance(got.lease_error, NotFound):  # its table went, or is not on this cluster yet
            self._table_sizes.pop((c.name, client), None)
            return got.refusal, await self._lease(c, layout, client, max_count, owner)
        raise got.lease_error

    async def _lease(
        self, c: ConsumerRecord, layout: Layout, client: str, max_count: int, owner: str
    ) -> Lease | None:
        await self.ensure_table(c, layout, client)
        offsets = self.ctx.offsets
        # Taken right before each lease: whether the backend reads them can change with a turn
        # of the loop (a failover switch). The time after them: a slow store's bounds must not
        # shorten the new lock.
        bounds = None if offsets.reads_bounds else await self.topology.bounds(layout)
        args = self._lease_args(c, max_count, owner)
        try:
            return await offsets.lease(c.name, client, bounds, read_from=layout, **args)
        except NotFound:  # removed meanwhile (an expired broadcast client): start again
            self._table_sizes.pop((c.name, client), None)
            await self.ensure_table(c, layout, client)
            bounds = None if offsets.reads_bounds else await self.topology.bounds(layout)
            return await offsets.lease(c.name, client, bounds, read_from=layout, **args)

    async def ack(self, c: ConsumerRecord, token: AckToken) -> None:
        raise_refusal(await self._commit(c, token), "ack")

    async def _commit(self, c: ConsumerRecord, token: AckToken) -> AckRefusal | None:
        """Ack a batch (SPEC G5), counted by outcome; the queue's waiting pulls are woken."""
        refusal = await self.ctx.offsets.ack(token, now_ms())
        await self._acked(c, token, refusal)
        return refusal

    async def _acked(
        self, c: ConsumerRecord, token: AckToken, refusal: AckRefusal | None, *, freed: bool = True
    ) -> None:
        """What follows an ack: its count by outcome, the wake of a waiting pull (unless the
        queue it unlocked is locked again, `freed` False), the observers."""
        self.ctx.metrics.child(self.ctx.metrics.acks, c.name, refusal or "ok").inc()
        if refusal is None:
            if freed:
                self.ctx.store.wake(c.topic, consumer=c.name, count=1)  # its queue is free again
            for acked in self.observers.acked:
                acked(c, token.queue, token.next_offset - token.offset)
        for settled in self.observers.settled:
            await settled(c, token, "acked", refusal is None, refusal)

    async def release(self, c: ConsumerRecord, token: AckToken) -> None:
        offsets = self.ctx.offsets
        if c.mode != MODE_CLUSTER:  # broadcast: delivered again at once to the same client
            raise_refusal(await offsets.release(token, now_ms()), "release")
            self.ctx.store.wake(c.topic, consumer=c.name, count=1)
            for settled in self.observers.settled:
                await settled(c, token, "released", False, None)
            return
        # Hold the lock while the batch is handed to the scheduler, so no one else takes it.
        raise_refusal(await offsets.extend(token, now_ms(), RELEASE_HOLD_S), "release")
        slot = (await self.topology.layout(c)).slot(token.queue)
        count = token.next_offset - token.offset
        msgs = await self.ctx.store.read(slot.topic, slot.queue, token.offset, count)
        lease = Lease(token.queue, token.offset, token.next_offset, token.lock_ts, 1)
        if self.observers.batch_hop:
            request_id = encode_token(token, self.ctx.secret)
            for batch_hop in self.observers.batch_hop:
                # A batch from a topic queue is on its first lease (a second goes to the retry
                # queue); its messages may have had deliveries before, through the retry queue.
                batch_hop(c, slot, msgs, "released", attempts(msgs, 1), request_id=request_id)
        await self.redelivery.later(c, token.client_id, lease, msgs, 1)

    async def extend(self, c: ConsumerRecord, token: AckToken, seconds: float) -> None:
        raise_refusal(await self.ctx.offsets.extend(token, now_ms(), seconds), "extend")


def raise_refusal(refusal: AckRefusal | None, what: str) -> None:
    if refusal is not None:
        raise Conflict(f"{what} refused: {refusal.replace('_', ' ')}", field="requestId", code=refusal)


def fitting(records: list[tuple[int, bytes]], budget: int) -> list[tuple[int, bytes]]:
    """The first records whose bytes stay within an answer's budget (`max_answer_bytes`), at
    least one: a pull of many large messages answers what fits and the next pull goes on."""
    if sum(map(len, map(_payload, records))) <= budget:  # all of them, the usual case, counted in C
        return records
    return within_budget(records, budget, lambda r: len(r[1]))[0]
