"""What happens to a leased batch that is not handed out: redelivery with backoff through the
scheduler (SPEC S5, G8) or the consumer's dead-letter topic."""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec

from mqgate.core.acks import AckRefusal
from mqgate.core.layout import Layout, Slot
from mqgate.core.scheduling import redelivery_due
from mqgate.core.tokens import AckToken
from mqgate.errors import MqgateError
from mqgate.model import StoredMessage
from mqgate.names import dlq_topic
from mqgate.offsets.interface import Lease
from mqgate.registry.records import ConsumerRecord
from mqgate.scheduler.interface import Destination
from mqgate.services.context import Context, now_ms
from mqgate.services.observers import BatchHop, Observers
from mqgate.services.qos import RETRY_TARGET, held_payload

log = logging.getLogger(__name__)

DLQ_REASON_ATTEMPTS: Final = "max_attempts"
DLQ_REASON_EXPIRED: Final = "expired"
# Failed deliveries of a message so far, carried with it through its redeliveries.
DELIVERIES_PROPERTY: Final = "mq.deliveries"


def deliveries(m: StoredMessage) -> int:
    value = m.properties.get(DELIVERIES_PROPERTY, "0")
    return int(value) if value.isdigit() else 0


def attempts(msgs: list[tuple[int, StoredMessage]], delivered: int) -> int:
    """A batch's deliveries so far: `delivered` of it as a batch, after the most any of its
    messages had before (through the retry queue): its pulls' reconsumeTimes + 1."""
    return max((deliveries(m) for _, m in msgs), default=0) + delivered


class Redelivery:
    def __init__(self, ctx: Context, observers: Observers) -> None:
        self.ctx = ctx
        self.observers = observers

    def trace(
        self,
        c: ConsumerRecord,
        slot: Slot,
        msgs: list[tuple[int, StoredMessage]],
        hop: BatchHop,
        attempt: int,
        **fields: Any,
    ) -> None:
        """What the gateway did with a consumer's batch on its own, told to the observers."""
        for batch_hop in self.observers.batch_hop:
            batch_hop(c, slot, msgs, hop, attempt, **fields)

    async def later(
        self,
        c: ConsumerRecord,
        client: str,
        lease: Lease,
        msgs: list[tuple[int, StoredMessage]],
        failed_now: int,
    ) -> None:
        """Hold each message for the consumer's retry queue after its backoff (SPEC S5), or
        dead-letter it when its deadline or max attempts come first; then commit the batch.

        The hold and the commit are two writes, and the hold may be written although it
        answered an error (a replica wait that timed out): the batch is then leased again once
        its lock runs out and comes here again. Each message is held under a key of its batch's
        round of deliveries, so that it is held once, and the keys are forgotten once the
        commit is in."""
        now = now_ms()
        holds: list[tuple[bytes, list[Destination]]] = []
        keys: list[str] = []
        first_ts = self._first_lock_ts(lease)
        given_up: list[tuple[int, StoredMessage]] = []
        for o, m in msgs:
            failures = deliveries(m) + failed_now
            due = redelivery_due(now, failures, m.deadline_ms or 0, c.max_attempts)
            if due is None:
                given_up.append((o, m))
                continue
            again = msgspec.structs.replace(
                m, properties={**m.properties, DELIVERIES_PROPERTY: str(failures)}
            )
            target = Destination(RETRY_TARGET + c.name, due, m.deadline_ms or 0, m.priority or 0)
            holds.append((held_payload(again, None), [target]))
            keys.append(f"{self.ctx.store.broker}:{c.name}:{client}:{lease.queue}:{first_ts}:{o}")
        if not first_ts:
            keys = []  # no name for the round: held as before, once per try
        if holds:
            await self.ctx.scheduler.hold(holds, keys or None)
            if self.observers.batch_hop:
                kept = {o for o, _ in given_up}
                retried = [(o, m) for o, m in msgs if o not in kept]
                slot = self._slot(c, lease.queue)
                self.trace(c, slot, retried, "redelivered", attempts(retried, failed_now) + 1)
        reason = DLQ_REASON_ATTEMPTS
        if given_up and all(m.deadline_ms for _, m in given_up):
            reason = DLQ_REASON_EXPIRED
        refusal = await self.settle_elsewhere(c, client, lease, msgs, given_up, reason, delivered=failed_now)
        if keys and refusal is None:
            # Committed (and, with a replica wait, on the replicas): the batch is not leased
            # again, so its holds are not tried again. A refused commit keeps them: whoever
            # holds the lock now commits the batch, holding it under the same keys first.
            try:
                await self.ctx.scheduler.forget(keys)
            except MqgateError as exc:  # the batch is settled: the keys just go in a day
                log.warning("consumer %s: %d hold keys kept: %s", c.name, len(keys), exc.message)

    @staticmethod
    def _first_lock_ts(lease: Lease) -> int:
        """The lock ts of the first delivery of the lease's batch (0: unknown): a first
        delivery's is its own (a batch released by its consumer)."""
        if lease.first_lock_ts:
            return lease.first_lock_ts
        return lease.lock_ts if lease.attempts == 1 else 0

    async def settle_elsewhere(
        self,
        c: ConsumerRecord,
        client: str,
        lease: Lease,
        msgs: list[tuple[int, StoredMessage]],
        dead: list[tuple[int, StoredMessage]],
        reason: str,
        end: int | None = None,
        *,
        delivered: int,
    ) -> AckRefusal | None:
        """Commit a leased batch that was not delivered, after moving `dead` to the dead-letter
        topic (the rest was held for redelivery). `delivered`: deliveries of the batch that its
        messages' delivery count does not include yet. Returns why the commit was refused
        (the lock ran out meanwhile), or None."""
        if dead:
            await self.to_dead_letters(c, client, lease, dead, reason, delivered)
        next_offset = end if end is not None else (msgs[-1][0] + 1 if msgs else lease.next_offset)
        token = self._lease_token(c, client, lease, next_offset)
        refusal = await self.ctx.offsets.record_dead_letters(token, len(dead), now_ms())
        self.ctx.store.wake(c.topic, consumer=c.name, count=1)
        return refusal

    async def dead_letter_part(
        self,
        c: ConsumerRecord,
        client: str,
        lease: Lease,
        msgs: list[tuple[int, StoredMessage]],
        reason: str,
        delivered: int,
    ) -> None:
        """Dead-letter some messages of a batch that is delivered otherwise, and count them
        now: the consumer's ack of the rest commits the batch without them."""
        await self.to_dead_letters(c, client, lease, msgs, reason, delivered)
        token = self._lease_token(c, client, lease, lease.next_offset)
        await self.ctx.offsets.add_dead_letters(token, len(msgs), now_ms())

    def _lease_token(self, c: ConsumerRecord, client: str, lease: Lease, next_offset: int) -> AckToken:
        """The gateway's own settlement of a lease it holds, as an ack token would name it."""
        return AckToken(
            c.name, client, self.ctx.store.broker, lease.queue, lease.offset, next_offset, lease.lock_ts
        )

    def _slot(self, c: ConsumerRecord, index: int) -> Slot:
        """The store queue behind a table index (dead letters name it in the one numbering)."""
        t = self.ctx.registry.topic(c.topic)
        if t is None:
            return Slot(c.topic, index, 0)
        return Layout(c.name, c.topic, t.grid).slot(index)

    async def to_dead_letters(
        self,
        c: ConsumerRecord,
        client: str,
        lease: Lease,
        msgs: list[tuple[int, StoredMessage]],
        reason: str,
        delivered: int,
        target: tuple[str, int] | None = None,
    ) -> None:
        """Move `msgs` to the consumer's dead-letter topic, or to `target` (a topic and one of
        its store queues: a dead-letter queue the consumer's owner chose, as SQS's redrive
        policy does), marked with where they came from and why."""
        ts = now_ms()
        slot = self._slot(c, lease.queue)
        source = {"dlq.source": slot.topic} if slot.topic != c.topic else {}
        moved = [
            msgspec.structs.replace(
                m,
                timestamp_ms=ts,
                deadline_ms=None,  # dead letters are kept for inspection, not expired again
                properties={
                    # A dead letter dead-lettered again (by a consumer of a DLQ) keeps no stale dlq.*.
                    **{k: v for k, v in m.properties.items() if not k.startswith("dlq.")},
                    "dlq.reason": reason,
                    "dlq.topic": c.topic,
                    "dlq.queue": str(slot.queue),
                    **source,
                    "dlq.offset": str(o),
                    "dlq.attempts": str(deliveries(m) + delivered),
                    "dlq.clientId": client,
                    **({"dlq.deadline": str(m.deadline_ms)} if m.deadline_ms else {}),
                },
            )
            for o, m in msgs
        ]
        into = dlq_topic(c.name) if target is None else target[0]
        await self.ctx.store.append(into, 0 if target is None else target[1], moved)
        if target is not None:
            self.ctx.store.wake(into)  # its receivers wait on it like on any topic
        if self.observers.batch_hop:
            attempt = attempts(msgs, delivered)
            if reason == DLQ_REASON_EXPIRED:
                self.trace(c, slot, msgs, "expired", attempt, status="error", error_type=reason)
            self.trace(
                c,
                slot,
                msgs,
                "dead_lettered",
                attempt,
                status="error",
                error_type=reason,
                error_node=c.name,
                detail=f"moved to {into}: {reason}",
            )
        self.ctx.metrics.child(self.ctx.metrics.dead_lettered, c.name).inc(len(moved))
        log.warning("consumer %s: %d messages dead-lettered (%s)", c.name, len(moved), reason)
