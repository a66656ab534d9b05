"""Streaming consumption (issue 31, docs/STREAM.md): `GET /mq/stream` answers Server-Sent Events
(`text/event-stream`) or, with an Upgrade, a WebSocket; each event is one pulled batch (the pull's
FOUND answer as its data, its requestId as the event's id), so a cluster or broadcast consumer
reads without a loop of requests. The events are the same on both; api/routes_stream.py frames
them for each.

Flow control: at most `max` messages are out in batches not yet settled; a batch settles when it
is acked (`POST /mq/ack` with its requestId, on any gateway, or over the WebSocket), released, or
its lock times out (then the pull path delivers it again, to this stream or another).
Reconnecting with `Last-Event-ID` acks that batch first: the client says it had everything up to
it. So nothing is lost and nothing comes again that was acked: at least once, as pulls are.

Between batches an idle stream sends a heartbeat every `heartbeat` seconds (proxies keep it open,
clients notice a dead link); a gateway shutting down ends each stream with an `end` event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import msgspec

from mqgate.core.tokens import AckToken
from mqgate.errors import BadRequest, MqgateError, TooManyRequests
from mqgate.registry.records import ConsumerRecord
from mqgate.services.consume import FOUND, NO_NEW_MSG, RATE_LIMITED, PullResult
from mqgate.services.gateway import Gateway

SETTLED_CHECK_S: Final = 0.2  # how often a full stream looks whether its batches settled
BUSY_PAUSE_S: Final = 0.2  # after a pull that found every queue taken


# The data of a batch's event (the API's FOUND answer, api/routes_data.py).
BodyOf = Callable[[PullResult], bytes]

# The kinds of event: a batch, the stream's opening, a heartbeat while nothing comes, one while
# the stream waits for acks (`max` out), and its end.
MESSAGES: Final = "messages"
OPEN: Final = "open"
HEARTBEAT: Final = "heartbeat"
WAITING: Final = "waiting"
END: Final = "end"


class Event(msgspec.Struct, frozen=True):
    kind: str
    data: bytes = b""  # JSON: a batch's FOUND answer, the end's reason
    event_id: str | None = None  # a batch's requestId


END_EVENT: Final = Event(END, b'{"reason":"the gateway is stopping"}')
TIMEOUT_EVENT: Final = Event(END, b'{"reason":"timeout"}')


class StreamSlots:
    """How many streams are open on this gateway, in all and per consumer, within their
    limits (0: none): one stream more is refused before it opens, so no consumer's token can
    hold the gateway's connections and pull loops."""

    def __init__(self, max_open: int, max_per_consumer: int) -> None:
        self.max_open = max_open
        self.max_per_consumer = max_per_consumer
        self.open = 0
        self.by_consumer: dict[str, int] = {}

    def take(self, consumer: str) -> Callable[[], None]:
        """A slot for a stream of `consumer` (429 if there is none) and how to give it back
        (once; calling it again does nothing)."""
        mine = self.by_consumer.get(consumer, 0)
        if self.max_open and self.open >= self.max_open:
            raise TooManyRequests(
                f"{self.open} streams are open on this gateway, the most at once (stream_max_open)",
                field="consumer",
            )
        if self.max_per_consumer and mine >= self.max_per_consumer:
            raise TooManyRequests(
                f"consumer {consumer} has {mine} streams open on this gateway, the most at once "
                "(stream_max_per_consumer)",
                field="consumer",
            )
        self.open += 1
        self.by_consumer[consumer] = mine + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self.open -= 1
            left = self.by_consumer[consumer] - 1
            if left:
                self.by_consumer[consumer] = left
            else:
                del self.by_consumer[consumer]

        return give_back


class Streams:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        settings = gateway.ctx.settings
        self.slots = StreamSlots(settings.stream_max_open, settings.stream_max_per_consumer)

    async def ack(self, c: ConsumerRecord, client_id: str | None, event_id: str, field: str) -> str:
        """Ack the batch of a stream's event: a reconnection's `Last-Event-ID` (the client had
        it), or an ack over the WebSocket. What that gave: "ok", or why not (acked before, its
        lock ran out so it comes again); 400 naming `field` for an id that is not this
        stream's."""
        try:
            token = self.gw.consuming.token(event_id)
        except MqgateError as exc:
            raise BadRequest(f"{field} is not a requestId: {exc.message}", field=field) from None
        if token.consumer != c.name or token.client_id != (client_id or ""):
            raise BadRequest(f"{field} names another consumer's or client's batch", field=field)
        try:
            await self.gw.consuming.ack(c, token)
        except MqgateError as exc:
            return exc.code or "refused"
        return "ok"

    async def _settled(self, c: ConsumerRecord, t: AckToken, now_ms: int) -> bool:
        table = await self.gw.ctx.offsets.table(c.name, t.client_id)
        if table is None or t.queue >= len(table):
            return True
        e = table[t.queue]
        return e.committed >= t.next_offset or e.lock_ts != t.lock_ts or e.lock_deadline_ms <= now_ms

    async def stream(
        self,
        c: ConsumerRecord,
        *,
        client_id: str | None,
        max_in_flight: int,
        heartbeat_s: float,
        owner: str,
        body_of: BodyOf,
        duration_s: float | None = None,
    ) -> AsyncIterator[Event]:
        """The stream's events until the gateway stops or, given `duration_s`, that long has
        passed (then it ends with `end`, reason "timeout": a client reconnects and resumes)."""
        consuming = self.gw.consuming
        yield Event(OPEN, c.name.encode())  # the head goes out at once
        outstanding: list[AckToken] = []
        quiet_since = time.monotonic()
        ends = None if duration_s is None else quiet_since + duration_s
        while not consuming.closing:
            if ends is not None and time.monotonic() >= ends:
                yield TIMEOUT_EVENT
                return
            now_ms = int(time.time() * 1000)
            outstanding = [t for t in outstanding if not await self._settled(c, t, now_ms)]
            room = max_in_flight - sum(t.next_offset - t.offset for t in outstanding)
            if room <= 0:
                if time.monotonic() - quiet_since >= heartbeat_s:
                    yield Event(WAITING)
                    quiet_since = time.monotonic()
                # An ack on this gateway wakes the consumer's waiters; one elsewhere is seen
                # within SETTLED_CHECK_S.
                await self.gw.ctx.store.wait_for_data(c.topic, SETTLED_CHECK_S, (c.name, client_id or ""))
                continue
            wait_s = heartbeat_s if ends is None else max(0.0, min(heartbeat_s, ends - time.monotonic()))
            result: PullResult = await consuming.pull(
                c, client_id=client_id, max_count=room, wait_s=wait_s, request_id=None, owner=owner
            )
            if result.status == FOUND and result.messages and result.request_id:
                outstanding.append(consuming.token(result.request_id))
                yield Event(MESSAGES, body_of(result), result.request_id)
                quiet_since = time.monotonic()
                continue
            if result.status == RATE_LIMITED:
                await asyncio.sleep(result.retry_after_s)
            elif result.status != NO_NEW_MSG:
                await asyncio.sleep(BUSY_PAUSE_S)
            if time.monotonic() - quiet_since >= heartbeat_s:
                yield Event(HEARTBEAT)
                quiet_since = time.monotonic()
        yield END_EVENT
