"""Message-level consumption (issue 30, `mode=message`): receive up to N visible messages from
any queue of the topic, each hidden for its visibility timeout; delete each, or change its
visibility, by its own receipt handle; one received `max_attempts` times goes to the dead-letter
topic. The rules are core/message_window.py; the offset stores keep them durable. What SQS's
ReceiveMessage / DeleteMessage / ChangeMessageVisibility are, and the native `/mq/receive`.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec

from mqgate.core.layout import Layout, Slot
from mqgate.core.message_window import DEFAULT_WINDOW, MessageOutcome, Received
from mqgate.core.tokens import AckToken, Receipt, decode_receipt, encode_receipt
from mqgate.errors import BadRequest, Forbidden
from mqgate.model import MESSAGE_LEVEL_MODES, StoredMessage, decode_stored
from mqgate.offsets.interface import Lease
from mqgate.registry.records import ConsumerRecord
from mqgate.services.consume import Consuming
from mqgate.services.context import Context, now_ms
from mqgate.services.observers import Observers
from mqgate.services.redelivery import DLQ_REASON_ATTEMPTS
from mqgate.services.topology import Topology
from mqgate.store.scope import request_scope

MAX_VISIBILITY_S: Final = 43_200.0  # 12 hours, as SQS
# A long poll re-checks this often at least: a message whose visibility ran out is no write,
# so nothing wakes the poll for it.
VISIBILITY_RECHECK_S: Final = 1.0


class Delivery(msgspec.Struct, frozen=True):
    """One received message, with what names this receive of it."""

    topic: str  # the consumer's topic
    source: str  # the store topic it was read from (the topic, or the consumer's inbox)
    queue: int  # a store queue of `source`
    offset: int
    raw: bytes  # the stored JSON object
    message: StoredMessage
    receipt: str  # its receipt handle: deletes it or changes its visibility, until received again
    receives: int  # how many times it was received, this time included
    first_ms: int  # when it was first received


# Where a consumer's messages out of receives go instead of its own dead-letter topic: a topic
# name, or None for the dead-letter topic (an edge such as SQS's redrive policy sets it).
DeadLetterRoute = Callable[[ConsumerRecord], Awaitable[str | None]]


class MessageConsuming:
    def __init__(self, ctx: Context, topology: Topology, consuming: Consuming, observers: Observers) -> None:
        self.ctx = ctx
        self.topology = topology
        self.consuming = consuming  # its tables, its closing flag, its dead-letter path
        self.observers = observers
        self._turn: dict[str, int] = {}  # where each consumer's next receive starts taking new ones
        self.dead_letter_route: DeadLetterRoute | None = None

    def _check(self, c: ConsumerRecord) -> None:
        if c.mode not in MESSAGE_LEVEL_MODES:
            raise BadRequest(
                f"consumer {c.name} is a {c.mode} consumer: receive and receipts are for mode=message",
                field="consumer",
            )

    async def receive(
        self,
        c: ConsumerRecord,
        *,
        max_count: int,
        wait_s: float,
        visibility_s: float | None = None,
        ordered: bool = False,
        request_id: str = "",
    ) -> list[Delivery]:
        """Up to `max_count` visible messages, waiting up to `wait_s` for one (`ordered`: each
        queue in order, one batch at a time; see `OffsetStore.receive`)."""
        self._check(c)
        if visibility_s is not None and not 0 <= visibility_s <= MAX_VISIBILITY_S:
            raise BadRequest(f"visibility must be 0 to {MAX_VISIBILITY_S:g} seconds", field="visibility")
        if c.paused:
            return []
        visibility_ms = int((c.lock_timeout_s if visibility_s is None else visibility_s) * 1000)
        deadline = time.monotonic() + wait_s
        with request_scope():  # receive, reads and receipts on one cluster (SPEC P8)
            while True:
                got = await self._receive_once(c, max_count, visibility_ms, ordered, request_id)
                if got:
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.consuming.closing:
                    return []
                waiting = self.ctx.metrics.child(self.ctx.metrics.waiting, c.name)
                waiting.inc()
                try:
                    await self.ctx.store.wait_for_data(c.topic, remaining, (c.name, ""), VISIBILITY_RECHECK_S)
                finally:
                    waiting.dec()
                if self.consuming.closing or self.ctx.registry.paused(c.name):
                    return []

    async def _receive_once(
        self, c: ConsumerRecord, max_count: int, visibility_ms: int, ordered: bool, request_id: str
    ) -> list[Delivery]:
        ctx = self.ctx
        layout = await self.topology.layout(c)
        await self.consuming.ensure_table(c, layout, "")
        bounds = await self.topology.bounds(layout)
        turn = self._turn.get(c.name, 0) % max(len(bounds), 1)
        self._turn[c.name] = turn + 1
        while True:
            got = await ctx.offsets.receive(
                c.name,
                "",
                bounds,
                now_ms=now_ms(),
                max_count=max_count,
                visibility_ms=visibility_ms,
                max_attempts=c.max_attempts,
                window=DEFAULT_WINDOW,
                first_queue=turn,
                ordered=ordered,
            )
            dead = [r for r in got if r.dead_letter]
            live = [r for r in got if not r.dead_letter]
            if dead:
                await self._dead_letter(c, layout, dead)
            if live or not dead:
                break  # what was handed out, or nothing at all; else try again for live ones
        stored = await self._read(layout, live)
        placed: list[tuple[Slot, Received, bytes]] = []
        for r in live:
            raw = stored.get((r.queue, r.offset))
            if raw is not None:  # else retention removed it meanwhile: nothing to give
                placed.append((layout.slot(r.queue), r, raw))
        if placed and self.observers.delivered:
            placed = self._delivered(c, placed, request_id)
        out: list[Delivery] = []
        for slot, r, raw_message in placed:
            receipt = Receipt(c.name, ctx.store.broker, r.queue, r.offset, r.receives, r.first_ms)
            out.append(
                Delivery(
                    c.topic, slot.topic, slot.queue, r.offset, raw_message, decode_stored(raw_message),
                    encode_receipt(receipt, ctx.secret), r.receives, r.first_ms,
                )
            )  # fmt: skip
        if out:
            ctx.metrics.child(ctx.metrics.consumed, c.name).inc(len(out))
            for pulled in self.observers.pulled:
                pulled(c, None, len(out))
        return out

    async def _read(self, layout: Layout, got: list[Received]) -> dict[tuple[int, int], bytes]:
        """The stored messages of `got` by (queue, offset): one read per run of offsets."""
        by_queue: dict[int, list[int]] = {}
        for r in got:
            by_queue.setdefault(r.queue, []).append(r.offset)
        out: dict[tuple[int, int], bytes] = {}
        for queue, offsets in by_queue.items():
            slot = layout.slot(queue)
            offsets.sort()
            start = 0
            for i in range(1, len(offsets) + 1):
                if i == len(offsets) or offsets[i] != offsets[i - 1] + 1:
                    first, count = offsets[start], i - start
                    for offset, raw in await self.ctx.store.read_raw(slot.topic, slot.queue, first, count):
                        if first <= offset < first + count:
                            out[(queue, offset)] = raw
                    start = i
        return out

    def _delivered(
        self, c: ConsumerRecord, placed: list[tuple[Slot, Received, bytes]], request_id: str
    ) -> list[tuple[Slot, Received, bytes]]:
        """Told to the observers (the delivered hops of a trace) by store queue and receive
        count, as a pull's batch is; each message as they hand it back (with its trace context)."""
        runs: dict[tuple[Slot, int], list[int]] = {}
        for i, (slot, r, _) in enumerate(placed):
            runs.setdefault((slot, r.receives), []).append(i)
        out = list(placed)
        for (slot, receives), indexes in runs.items():
            raw = [(placed[i][1].offset, placed[i][2]) for i in indexes]
            for delivered in self.observers.delivered:
                raw = delivered(c, slot, raw, request_id, "", "", receives)
            for i, (_, message) in zip(indexes, raw, strict=True):
                out[i] = (placed[i][0], placed[i][1], message)
        return out

    async def _dead_letter(self, c: ConsumerRecord, layout: Layout, dead: list[Received]) -> None:
        """Move messages out of receives to the dead-letter topic (or the route's), then
        delete them."""
        ctx = self.ctx
        redelivery = self.consuming.redelivery
        route = await self.dead_letter_route(c) if self.dead_letter_route is not None else None
        target_queues = 0
        if route is not None:
            t = ctx.registry.topic(route)
            target_queues = t.queues if t is not None else 0
            if target_queues == 0:
                route = None  # the chosen topic is gone: the consumer's own dead-letter topic
        for r in dead:
            slot = layout.slot(r.queue)
            msgs = await ctx.store.read(slot.topic, slot.queue, r.offset, 1)
            if msgs and msgs[0][0] == r.offset:
                lease = Lease(r.queue, r.offset, r.offset + 1, 0, r.receives)
                target = None
                if route is not None:
                    # By its first key, so messages of one key (an SQS FIFO group) stay together.
                    m = msgs[0][1]
                    key = m.keys[0] if m.keys else m.msg_id
                    target = (route, zlib.crc32(key.encode()) % target_queues)
                await redelivery.to_dead_letters(c, "", lease, msgs, DLQ_REASON_ATTEMPTS, r.receives, target)
            await ctx.offsets.delete_message(
                c.name, "", r.queue, r.offset, r.receives, r.first_ms, now_ms(), dead_letter=True
            )

    def receipt(self, c: ConsumerRecord, handle: str) -> Receipt:
        """The receipt a handle carries, if it is this consumer's and this gateway cluster's."""
        self._check(c)
        receipt = decode_receipt(handle, self.ctx.secret)
        if receipt.consumer != c.name:
            raise Forbidden("the receipt handle belongs to another consumer", field="receiptHandle")
        return receipt

    async def delete(self, c: ConsumerRecord, handle: str) -> MessageOutcome:
        """Delete the message a receipt names (`already_deleted` again; `stale_receipt`: it was
        received again since, and is not deleted)."""
        return await self._delete(c, self.receipt(c, handle))

    async def delete_many(self, c: ConsumerRecord, handles: list[str]) -> list[MessageOutcome]:
        """`delete` of each, every receipt checked before any is deleted; the deletes together,
        so they share the store's durable writes (one group commit, not one per message)."""
        receipts = [self.receipt(c, h) for h in handles]
        return list(await asyncio.gather(*(self._delete(c, r) for r in receipts)))

    async def _delete(self, c: ConsumerRecord, r: Receipt) -> MessageOutcome:
        outcome = await self.ctx.offsets.delete_message(
            c.name, "", r.queue, r.offset, r.receives, r.first_ms, now_ms()
        )
        self.ctx.metrics.child(self.ctx.metrics.acks, c.name, outcome if outcome != "deleted" else "ok").inc()
        if outcome == "deleted":
            for acked in self.observers.acked:
                acked(c, r.queue, 1)
            if self.observers.settled:  # the acked hop of a trace, as a pull's ack has
                token = AckToken(c.name, "", r.broker, r.queue, r.offset, r.offset + 1, 0)
                for settled in self.observers.settled:
                    await settled(c, token, "acked", True, None)
        return outcome

    async def change_visibility(self, c: ConsumerRecord, handle: str, seconds: float) -> MessageOutcome:
        """Hide the message for `seconds` from now (0: visible at once)."""
        if not 0 <= seconds <= MAX_VISIBILITY_S:
            raise BadRequest(f"visibility must be 0 to {MAX_VISIBILITY_S:g} seconds", field="visibility")
        r = self.receipt(c, handle)
        now = now_ms()
        outcome = await self.ctx.offsets.change_visibility(
            c.name, "", r.queue, r.offset, r.receives, r.first_ms, now, now + int(seconds * 1000)
        )
        if outcome == "changed" and seconds == 0:
            self.ctx.store.wake(c.topic, consumer=c.name, count=1)  # a waiting receive takes it
        return outcome
