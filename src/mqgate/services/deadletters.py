"""A consumer's dead-letter topic as an operator sees it: its state and redrive back to that
consumer alone, through its inbox (docs/PROTOCOL.md, "Dead letters").

What was redriven is recorded in the offset store, under the group `%REDRIVE%<consumer>`
(consumer names cannot contain `%`, so it never meets a real consumer):

- its cluster table has one queue whose committed offset is the redrive *position*: every
  dead letter below it was redriven;
- a dead letter at or past the position that was redriven on its own (by offset, message id
  or a filter that skipped records before it) is a broadcast "client" `o<offset>` of that
  group: creating it is the record.

The table's lock serialises redrives of one DLQ across gateways: a redrive leases it, copies,
records, and commits the new position (counting the copies in the table's dead-letter count).
A copy is recorded after it is written, so a gateway that dies between the two may copy that
record again on the next redrive (at least once); two redrives never both copy it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

import msgspec

from mqgate.core.layout import inbox_topic
from mqgate.core.tokens import AckToken
from mqgate.errors import BadRequest, Conflict, NotFound
from mqgate.model import QueueBounds, StoredMessage
from mqgate.names import REDRIVE_PREFIX, dlq_topic
from mqgate.offsets.interface import Lease
from mqgate.registry.records import ConsumerRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.produce import Producing
from mqgate.services.redelivery import DELIVERIES_PROPERTY
from mqgate.services.topology import Topology

log = logging.getLogger(__name__)

CLAIM_PREFIX: Final = "o"
DLQ_PROPERTY_PREFIX: Final = "dlq."
# A redrive holds the DLQ's redrive lock at most this long (a gateway that dies frees it then).
REDRIVE_LOCK_MS: Final = 60_000
_NEVER_DEAD: Final = 2**31 - 1  # the redrive table's batches never run out of attempts


@dataclass(slots=True, frozen=True)
class Selection:
    """What to redrive: one record (`offset` or `message_id`), or each record from the
    position on that passes every filter given (`everything`: no filter), scanning at most
    `scan` records."""

    offset: int | None = None
    message_id: str | None = None
    reason: str | None = None
    key: str | None = None
    since_ms: int | None = None  # dead-lettered at or after
    until_ms: int | None = None  # dead-lettered before
    everything: bool = False
    scan: int = 1000

    def check(self) -> None:
        filters = (self.reason, self.key, self.since_ms, self.until_ms)
        one = self.offset is not None or self.message_id is not None
        if self.offset is not None and self.message_id is not None:
            raise BadRequest("give offset or messageId, not both", field="offset")
        if one and (self.everything or any(f is not None for f in filters)):
            raise BadRequest("offset and messageId name one message: no filter or all with them", field="all")
        if self.everything and any(f is not None for f in filters):
            raise BadRequest("all redrives everything: leave it out to filter", field="all")
        if not one and not self.everything and all(f is None for f in filters):
            raise BadRequest(
                "choose what to redrive: offset, messageId, a filter (reason, key, since, until) or all=true",
                field="all",
            )

    def matches(self, m: StoredMessage) -> bool:
        if self.message_id is not None:
            return m.msg_id == self.message_id
        if self.reason is not None and m.properties.get("dlq.reason") != self.reason:
            return False
        if self.key is not None and self.key not in m.keys:
            return False
        if self.since_ms is not None and m.timestamp_ms < self.since_ms:
            return False
        return self.until_ms is None or m.timestamp_ms < self.until_ms


@dataclass(slots=True, frozen=True)
class RedrivenCopy:
    dlq_offset: int
    message_id: str
    topic: str
    queue: int  # store queue (docs/PROTOCOL.md: one numbering)
    offset: int


@dataclass(slots=True)
class RedriveResult:
    consumer: str
    dead_letters: str
    position: int  # every dead letter below it is redriven
    scanned: int
    next: int  # the offset after the last one scanned
    scan_limit: int
    already_redriven: int = 0
    redriven: list[RedrivenCopy] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class DeadLetterState:
    consumer: str
    dead_letters: str
    min: int
    max: int
    position: int
    redriven: int  # copies made by every redrive so far


def redriven_message(m: StoredMessage, ts: int) -> StoredMessage:
    """The copy that goes back: keys, tags, properties and priority kept; the `dlq.*`
    properties and the delivery count dropped; no deadline (it expired once already)."""
    dropped = (DLQ_PROPERTY_PREFIX, DELIVERIES_PROPERTY)
    properties = {k: v for k, v in m.properties.items() if not k.startswith(dropped)}
    return msgspec.structs.replace(
        m, timestamp_ms=ts, properties=properties, deliver_at_ms=None, deadline_ms=None
    )


class DeadLetters:
    def __init__(self, ctx: Context, topology: Topology, producing: Producing) -> None:
        self.ctx = ctx
        self.topology = topology
        self.producing = producing

    async def _bounds(self, c: ConsumerRecord) -> QueueBounds:
        (b,) = await self.ctx.store.bounds(dlq_topic(c.name))
        return b

    async def _position(self, group: str, b: QueueBounds) -> tuple[int, int]:
        """(position, copies so far) of the DLQ's redrive table, made if absent."""
        offsets = self.ctx.offsets
        await offsets.ensure_table(group, "", [b.min], now_ms())
        table = await offsets.table(group, "") or []
        return max(table[0].committed, b.min), table[0].dead_lettered

    async def state(self, name: str) -> DeadLetterState:
        c = await self.topology.consumer(name)
        b = await self._bounds(c)
        position, redriven = await self._position(REDRIVE_PREFIX + c.name, b)
        return DeadLetterState(c.name, dlq_topic(c.name), b.min, b.max, position, redriven)

    async def redrive(self, name: str, sel: Selection) -> RedriveResult:
        sel.check()
        c = await self.topology.consumer(name)
        ctx = self.ctx
        group = REDRIVE_PREFIX + c.name
        b = await self._bounds(c)
        if sel.offset is not None and not b.min <= sel.offset < b.max:
            held = f"offsets {b.min} to {b.max - 1}" if b.max > b.min else "no dead letters"
            raise NotFound(f"{dlq_topic(c.name)} holds {held}", field="offset")
        position, _ = await self._position(group, b)
        lease = await ctx.offsets.lease(
            group,
            "",
            [QueueBounds(0, b.min, b.max, 0)],
            now_ms=now_ms(),
            max_count=1,
            lock_timeout_ms=REDRIVE_LOCK_MS,
            max_attempts=_NEVER_DEAD,
            owner="redrive",
        )
        result = RedriveResult(c.name, dlq_topic(c.name), position, 0, position, sel.scan)
        if lease is None:
            if position < b.max:
                raise Conflict(f"another redrive of {dlq_topic(c.name)} is running", code="redrive_busy")
            if sel.offset is not None:
                raise _already(sel.offset)
            if sel.message_id is not None:
                raise _not_found(sel, position, 0)
            return result
        token = AckToken(group, "", ctx.store.broker, 0, lease.offset, lease.offset, lease.lock_ts)
        try:
            return await self._redrive_locked(c, sel, lease, token, result)
        except BaseException:
            await ctx.offsets.release(token, now_ms())
            raise

    async def _redrive_locked(
        self, c: ConsumerRecord, sel: Selection, lease: Lease, token: AckToken, result: RedriveResult
    ) -> RedriveResult:
        ctx = self.ctx
        dlq = dlq_topic(c.name)
        position = result.position = lease.offset
        claims = {int(cl[len(CLAIM_PREFIX) :]) for cl in await ctx.offsets.clients(token.consumer) if cl}
        if sel.offset is not None:
            if sel.offset < position or sel.offset in claims:
                raise _already(sel.offset)
            records = await ctx.store.read(dlq, 0, sel.offset, 1)
            chosen = records
        else:
            records = await ctx.store.read(dlq, 0, position, sel.scan)
            chosen = [(o, m) for o, m in records if sel.matches(m)]
            if sel.message_id is not None:
                chosen = chosen[:1]
                if not chosen:
                    raise _not_found(sel, position, len(records))
                if chosen[0][0] in claims:
                    raise _already(chosen[0][0])
            result.already_redriven = sum(1 for o, _ in chosen if o in claims)
            chosen = [(o, m) for o, m in chosen if o not in claims]
        if records:
            result.scanned = len(records)
            result.next = records[-1][0] + 1
        result.redriven = await self._copy(c, chosen)
        done = claims | {copy.dlq_offset for copy in result.redriven}
        new_position = position
        while new_position in done:
            new_position += 1
        for o in sorted(done - claims):
            if o >= new_position:
                await ctx.offsets.ensure_table(token.consumer, f"{CLAIM_PREFIX}{o}", [o], now_ms())
        moved = msgspec.structs.replace(token, next_offset=new_position)
        await ctx.offsets.record_dead_letters(moved, len(result.redriven), now_ms())
        result.position = new_position
        if result.redriven:
            ctx.metrics.child(ctx.metrics.redriven, c.name).inc(len(result.redriven))
            log.info("consumer %s: %d dead letters redriven", c.name, len(result.redriven))
        return result

    async def _copy(self, c: ConsumerRecord, chosen: list[tuple[int, StoredMessage]]) -> list[RedrivenCopy]:
        """Append each chosen dead letter to the consumer's inbox (`%INBOX%<consumer>`): only
        the consumer it died for gets it again (the topic's other consumers had it once)."""
        if not chosen:
            return []
        ts = now_ms()
        inbox = inbox_topic(c.name)
        copies = [redriven_message(m, ts) for _, m in chosen]
        first = await self.ctx.store.append(inbox, 0, copies)
        self.topology.wake_reader_of(c.name)
        placed = [(first + i, m) for i, m in enumerate(copies)]
        for redriven in self.producing.observers.redriven:
            await redriven(c, placed)
        return [RedrivenCopy(o, m.msg_id, inbox, 0, first + i) for i, (o, m) in enumerate(chosen)]


def _not_found(sel: Selection, position: int, scanned: int) -> NotFound:
    return NotFound(
        f"message {sel.message_id} is not among the {scanned} dead letters scanned from the redrive "
        f"position {position} (at most {sel.scan}: raise max to scan further; every dead letter "
        "below the position was redriven)",
        field="messageId",
    )


def _already(offset: int) -> Conflict:
    return Conflict(f"dead letter {offset} was redriven already", field="offset", code="already_redriven")
