"""A consumer's dead-letter topic as an operator sees it: its state and redrive back to that
consumer alone, through its inbox (docs/PROTOCOL.md, "Dead letters").

What was redriven is recorded in the offset store, under the group `%REDRIVE%<consumer>`
(consumer names cannot contain `%`, so it never meets a real consumer):

- its cluster table has one queue whose committed offset is the redrive *position*: every
  dead letter below it was redriven;
- a dead letter at or past the position that was redriven on its own (by offset, message id
  or a filter that skipped records before it) is a broadcast "client" `o<offset>` of that
  group: creating it is the record;
- copies (which record nothing as redriven) are counted in the dead-letter count of the
  group's client `copies`, so every gateway shows how many were made.

The table's lock serialises redrives of one DLQ across gateways: a redrive leases it, copies,
records, and commits the new position (counting the copies in the table's dead-letter count).
A copy is recorded after it is written, so a gateway that dies between the two may copy that
record again on the next redrive (at least once); two redrives never both copy it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Final

import msgspec

from mqgate.core.layout import inbox_topic
from mqgate.core.tokens import AckToken
from mqgate.errors import BadRequest, Conflict, MqgateError, NotFound
from mqgate.model import QueueBounds, StoredMessage
from mqgate.names import REDRIVE_PREFIX, dlq_topic
from mqgate.registry.records import ConsumerRecord
from mqgate.services.context import Context, now_ms
from mqgate.services.produce import Producing
from mqgate.services.redelivery import DELIVERIES_PROPERTY
from mqgate.services.topology import Topology

log = logging.getLogger(__name__)

CLAIM_PREFIX: Final = "o"
COPIES_CLIENT: Final = "copies"  # its table's dead-letter count: copies made so far
COUNT_LOCK_MS: Final = 5_000  # counting copies holds that table's lock at most this long
DLQ_PROPERTY_PREFIX: Final = "dlq."
# A redrive holds the DLQ's redrive lock at most this long (a gateway that dies frees it then).
REDRIVE_LOCK_MS: Final = 60_000
_NEVER_DEAD: Final = 2**31 - 1  # the redrive table's batches never run out of attempts
MAX_RATE_PER_S: Final = 100_000.0
# A paced redrive copies for at most this long, well inside REDRIVE_LOCK_MS (the lock is not
# extended): the rest waits for the next redrive, which its answer counts (`left`).
PACED_MAX_S: Final = 30.0
PACE_STEPS_PER_S: Final = 10  # a paced redrive appends this many small batches a second


class Selection(msgspec.Struct, frozen=True):
    """What to redrive: one record (`offset` or `message_id`), or each record from the
    position on that passes every filter given (`everything`: no filter), scanning at most
    `scan` records.

    `start`: scan from this offset instead of the position (moving skips what lies below the
    position, redriven already; copying takes it again). `copy`: the dead letters stay waiting
    (nothing is recorded as redriven), as a test replay of them; `skip_redriven`: a copy
    leaves out what was redriven (below the position or redriven on its own), as a move does
    and as the console's list shows them. `rate_per_s`: copies appended
    at most this many a second; a redrive then takes at most what fits in PACED_MAX_S, and
    says how many it left for the next."""

    offset: int | None = None
    message_id: str | None = None
    reason: str | None = None
    key: str | None = None
    since_ms: int | None = None  # dead-lettered at or after
    until_ms: int | None = None  # dead-lettered before
    source: str | None = None  # the store topic it was read from (dlq.source, else dlq.topic)
    queue: int | None = None  # the store queue of that topic it was read from (dlq.queue)
    offsets: frozenset[int] | None = None  # these dead letters (of those scanned)
    everything: bool = False
    scan: int = 1000
    start: int | None = None
    copy: bool = False
    skip_redriven: bool = False
    rate_per_s: float | None = None

    def check(self) -> None:
        filters = (self.reason, self.key, self.since_ms, self.until_ms, self.source, self.queue, self.offsets)
        one = self.offset is not None or self.message_id is not None
        if self.offset is not None and self.message_id is not None:
            raise BadRequest("give offset or messageId, not both", field="offset")
        if one and (self.everything or any(f is not None for f in filters)):
            raise BadRequest("offset and messageId name one message: no filter or all with them", field="all")
        if self.everything and any(f is not None for f in filters):
            raise BadRequest("all redrives everything: leave it out to filter", field="all")
        if not one and not self.everything and all(f is None for f in filters):
            raise BadRequest(
                "choose what to redrive: offset, messageId, a filter (reason, key, since, until, source, "
                "queue, offsets) or all=true",
                field="all",
            )
        if self.offsets is not None and not self.offsets:
            raise BadRequest("choose the dead letters to redrive", field="offsets")
        if self.rate_per_s is not None and not 0 < self.rate_per_s <= MAX_RATE_PER_S:
            raise BadRequest(f"the rate is more than 0 and at most {MAX_RATE_PER_S:g} a second", field="rate")

    def matches(self, m: StoredMessage, offset: int | None = None) -> bool:
        if self.message_id is not None:
            return m.msg_id == self.message_id
        if self.offsets is not None and offset not in self.offsets:
            return False
        if self.reason is not None and m.properties.get("dlq.reason") != self.reason:
            return False
        if self.key is not None and self.key not in m.keys:
            return False
        if self.source is not None and source_of(m) != self.source:
            return False
        if self.queue is not None and m.properties.get("dlq.queue") != str(self.queue):
            return False
        if self.since_ms is not None and m.timestamp_ms < self.since_ms:
            return False
        return self.until_ms is None or m.timestamp_ms < self.until_ms

    def scan_from(self, position: int, first: int) -> int:
        if self.offsets is not None and self.start is None:
            return max(min(self.offsets), first)
        return position if self.start is None else max(self.start, first)

    @property
    def most(self) -> int | None:
        """How many copies one redrive makes at most (None: all it chose)."""
        if self.rate_per_s is None:
            return None
        return max(1, int(self.rate_per_s * PACED_MAX_S))


def source_of(m: StoredMessage) -> str:
    """The store topic a dead letter was read from: the consumer's retry queue or inbox
    (`dlq.source`), else its topic."""
    return m.properties.get("dlq.source") or m.properties.get("dlq.topic", "")


class RedriveControl(msgspec.Struct):
    """A paced redrive watched and stopped from outside (a task in the background): `stop`,
    once set, ends it at its next step, as its time limit does (what it copied is recorded, the
    rest counted in `left`); `copied` counts the copies as they are made."""

    stop: asyncio.Event = msgspec.field(default_factory=asyncio.Event)
    copied: int = 0


class RedrivenCopy(msgspec.Struct, frozen=True):
    dlq_offset: int
    message_id: str
    topic: str
    queue: int  # store queue (docs/PROTOCOL.md: one numbering)
    offset: int


class RedriveResult(msgspec.Struct):
    consumer: str
    dead_letters: str
    position: int  # every dead letter below it is redriven
    scanned: int
    next: int  # the offset after the last one scanned
    scan_limit: int
    already_redriven: int = 0
    redriven: list[RedrivenCopy] = msgspec.field(default_factory=list)
    copied: bool = False  # copies only: the dead letters stay waiting
    left: int = 0  # chosen but not copied: over what a paced redrive takes at once


class RedrivePreview(msgspec.Struct, frozen=True):
    """What a redrive with the same selection would copy now (no lock taken, nothing moves)."""

    consumer: str
    position: int
    scanned: int
    next: int  # where the next redrive goes on: past the scan, or the first one this leaves
    first: int  # the offset the scan began at
    end: int  # the offset after the last one scanned (`first` when none was)
    matched: int  # chosen, not redriven yet (or copying: all chosen)
    already_redriven: int
    will_copy: int  # of `matched`, what one redrive takes (a paced one: at most `Selection.most`)


class DeadLetterState(msgspec.Struct, frozen=True):
    consumer: str
    dead_letters: str
    min: int
    max: int
    position: int
    redriven: int  # copies made by every move (recorded as redriven) so far
    copied: int = 0  # copies made by every copy (nothing recorded as redriven) so far
    # Dead letters at or past the position redriven on their own (a page leaves them out).
    claimed: frozenset[int] = frozenset()


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
        group = REDRIVE_PREFIX + c.name
        position, redriven = await self._position(group, b)
        claimed = frozenset(await self._claims(group))
        copies = await self.ctx.offsets.table(group, COPIES_CLIENT)
        copied = copies[0].dead_lettered if copies else 0
        return DeadLetterState(c.name, dlq_topic(c.name), b.min, b.max, position, redriven, copied, claimed)

    async def preview(self, name: str, sel: Selection) -> RedrivePreview:
        sel.check()
        c = await self.topology.consumer(name)
        b = await self._bounds(c)
        group = REDRIVE_PREFIX + c.name
        position, _ = await self._position(group, b)
        claims = await self._claims(group)
        if sel.offset is not None:
            first = sel.offset
            records = (
                await self.ctx.store.read(dlq_topic(c.name), 0, sel.offset, 1)
                if b.min <= sel.offset < b.max
                else []
            )
        else:
            first = sel.scan_from(position, b.min)
            records = await self.ctx.store.read(dlq_topic(c.name), 0, first, sel.scan)
        chosen, already = _choose(sel, records, position, claims)
        most = sel.most
        end = records[-1][0] + 1 if records else first
        nxt = end if records else position
        if most is not None and len(chosen) > most:
            nxt = chosen[most][0]  # the next redrive starts at the first it leaves
        will = len(chosen) if most is None else min(len(chosen), most)
        return RedrivePreview(c.name, position, len(records), nxt, first, end, len(chosen), already, will)

    async def _claims(self, group: str) -> set[int]:
        return {
            int(cl[len(CLAIM_PREFIX) :])
            for cl in await self.ctx.offsets.clients(group)
            if cl.startswith(CLAIM_PREFIX) and cl[len(CLAIM_PREFIX) :].isdigit()
        }

    async def _count_copies(self, group: str, n: int) -> None:
        """Add `n` to the copies counted so far (the dead-letter count of the group's client
        `copies`: shared by every gateway, counted under its lock, which a count holds for a
        moment). A count that cannot take the lock in time is logged and left out."""
        offsets = self.ctx.offsets
        await offsets.ensure_table(group, COPIES_CLIENT, [0], now_ms())
        deadline = time.monotonic() + COUNT_LOCK_MS / 1000
        while True:
            lease = await offsets.lease(
                group,
                COPIES_CLIENT,
                [QueueBounds(0, 0, 1, 0)],  # one record it never commits: always there to lease
                now_ms=now_ms(),
                max_count=1,
                lock_timeout_ms=COUNT_LOCK_MS,
                max_attempts=_NEVER_DEAD,
                owner="copies",
            )
            if lease is not None:
                break
            if time.monotonic() > deadline:
                log.warning("%s: %d copies not counted (its count stayed locked)", group, n)
                return
            await asyncio.sleep(0.01)  # another gateway counts its copies this moment
        token = AckToken(group, COPIES_CLIENT, self.ctx.store.broker, 0, lease.offset, lease.offset,
                         lease.lock_ts)  # fmt: skip
        try:
            await offsets.add_dead_letters(token, n, now_ms())
        finally:
            await offsets.release(token, now_ms())

    async def redrive(
        self, name: str, sel: Selection, control: RedriveControl | None = None
    ) -> RedriveResult:
        """Copy back what `sel` chooses (a move records it as redriven), watched and stopped
        through `control` if given."""
        sel.check()
        c = await self.topology.consumer(name)
        ctx = self.ctx
        group = REDRIVE_PREFIX + c.name
        b = await self._bounds(c)
        if sel.offset is not None and not b.min <= sel.offset < b.max:
            held = f"offsets {b.min} to {b.max - 1}" if b.max > b.min else "no dead letters"
            raise NotFound(f"{dlq_topic(c.name)} holds {held}", field="offset")
        position, _ = await self._position(group, b)
        result = RedriveResult(c.name, dlq_topic(c.name), position, 0, position, sel.scan)
        if sel.copy:  # records nothing, so it needs no lock (nor waits for another redrive)
            return await self._redrive_chosen(c, sel, b, result, await self._claims(group), None, control)
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
            result.position = result.next = lease.offset
            return await self._redrive_chosen(c, sel, b, result, await self._claims(group), token, control)
        except BaseException:
            await ctx.offsets.release(token, now_ms())
            raise

    async def _redrive_chosen(
        self,
        c: ConsumerRecord,
        sel: Selection,
        b: QueueBounds,
        result: RedriveResult,
        claims: set[int],
        token: AckToken | None,
        control: RedriveControl | None = None,
    ) -> RedriveResult:
        """Copy what `sel` chooses; with the lock's `token` (a move), record it as redriven."""
        ctx = self.ctx
        dlq = dlq_topic(c.name)
        position = result.position
        if sel.offset is not None:
            if not sel.copy and (sel.offset < position or sel.offset in claims):
                raise _already(sel.offset)
            records = await ctx.store.read(dlq, 0, sel.offset, 1)
            chosen = records
        else:
            records = await ctx.store.read(dlq, 0, sel.scan_from(position, b.min), sel.scan)
            if sel.message_id is not None:
                found = [(o, m) for o, m in records if sel.matches(m, o)][:1]
                if not found:
                    raise _not_found(sel, position, len(records))
                if not sel.copy and (found[0][0] in claims or found[0][0] < position):
                    raise _already(found[0][0])
            chosen, result.already_redriven = _choose(sel, records, position, claims)
        most = sel.most
        if records:
            result.scanned = len(records)
            result.next = records[-1][0] + 1
        take = chosen if most is None else chosen[:most]
        result.copied = sel.copy
        result.redriven, failure = await self._copy(c, take, sel.rate_per_s, control)
        rest = chosen[len(result.redriven) :]
        if rest:  # past the pace's share, cut by its time or by a failed append: the next goes on
            result.left = len(rest)
            result.next = rest[0][0]
        if result.redriven:
            ctx.metrics.child(ctx.metrics.redriven, c.name).inc(len(result.redriven))
            log.info("consumer %s: %d dead letters %s", c.name, len(result.redriven),
                     "copied back" if sel.copy else "redriven")  # fmt: skip
        if token is None:
            if result.redriven:
                await self._count_copies(REDRIVE_PREFIX + c.name, len(result.redriven))
            if failure is not None:
                raise failure
            return result
        done = claims | {copy.dlq_offset for copy in result.redriven}
        new_position = position
        while new_position in done:
            new_position += 1
        for o in sorted(done - claims):
            if o >= new_position:
                await ctx.offsets.ensure_table(token.consumer, f"{CLAIM_PREFIX}{o}", [o], now_ms())
        moved = msgspec.structs.replace(token, next_offset=new_position)
        refusal = await ctx.offsets.record_dead_letters(moved, len(result.redriven), now_ms())
        if failure is not None:  # what was copied is recorded: the next redrive does not repeat it
            raise failure
        if refusal is not None:
            raise Conflict(f"the redrive's lock was lost ({refusal}): its copies may be made again",
                           code="redrive_busy")  # fmt: skip
        result.position = new_position
        return result

    async def _copy(
        self,
        c: ConsumerRecord,
        chosen: list[tuple[int, StoredMessage]],
        rate_per_s: float | None = None,
        control: RedriveControl | None = None,
    ) -> tuple[list[RedrivenCopy], MqgateError | None]:
        """Append each chosen dead letter to the consumer's inbox (`%INBOX%<consumer>`): only
        the consumer it died for gets it again (the topic's other consumers had it once).
        Paced: in steps of a tenth of a second's worth, each waiting for its moment, and for
        PACED_MAX_S at most (slow appends must not outlast the redrive's lock), or until its
        control stops it. An append that fails ends it: the copies made so far are returned with the
        error, to be recorded."""
        if not chosen:
            return [], None
        step = len(chosen) if rate_per_s is None else max(1, math.ceil(rate_per_s / PACE_STEPS_PER_S))
        started = time.monotonic()
        stop = control.stop if control is not None else None
        made: list[RedrivenCopy] = []
        for i in range(0, len(chosen), step):
            if rate_per_s is not None and i:
                if time.monotonic() - started >= PACED_MAX_S or (stop is not None and stop.is_set()):
                    break
                if await _stopped(stop, started + i / rate_per_s - time.monotonic()):
                    break
            try:
                made += await self._append(c, chosen[i : i + step])
                if control is not None:
                    control.copied += min(step, len(chosen) - i)
            except MqgateError as exc:
                if not made:
                    raise
                return made, exc
        return made, None

    async def _append(self, c: ConsumerRecord, chosen: list[tuple[int, StoredMessage]]) -> list[RedrivenCopy]:
        ts = now_ms()
        inbox = inbox_topic(c.name)
        copies = [redriven_message(m, ts) for _, m in chosen]
        first = await self.ctx.store.append(inbox, 0, copies)
        self.topology.wake_reader_of(c.name)
        placed = [(first + i, m) for i, m in enumerate(copies)]
        for redriven in self.producing.observers.redriven:
            await redriven(c, placed)
        return [RedrivenCopy(o, m.msg_id, inbox, 0, first + i) for i, (o, m) in enumerate(chosen)]


async def _stopped(stop: asyncio.Event | None, wait_s: float) -> bool:
    """Wait `wait_s` (a pace's moment), or less if `stop` is set meanwhile; whether it was."""
    if stop is None:
        await asyncio.sleep(max(0.0, wait_s))
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, wait_s))
    return stop.is_set()


def _choose(
    sel: Selection, records: list[tuple[int, StoredMessage]], position: int, claims: set[int]
) -> tuple[list[tuple[int, StoredMessage]], int]:
    """The records the selection takes, and how many it matched that were redriven already
    (below the position or claimed); copying takes those too, unless it skips them."""
    chosen = [(o, m) for o, m in records if sel.matches(m, o)]
    if sel.message_id is not None:
        chosen = chosen[:1]
    if sel.copy and not sel.skip_redriven:
        return chosen, 0
    kept = [(o, m) for o, m in chosen if o >= position and o not in claims]
    return kept, len(chosen) - len(kept)


def _not_found(sel: Selection, position: int, scanned: int) -> NotFound:
    return NotFound(
        f"message {sel.message_id} is not among the {scanned} dead letters scanned from the redrive "
        f"position {position} (at most {sel.scan}: raise max to scan further; every dead letter "
        "below the position was redriven)",
        field="messageId",
    )


def _already(offset: int) -> Conflict:
    return Conflict(f"dead letter {offset} was redriven already", field="offset", code="already_redriven")
