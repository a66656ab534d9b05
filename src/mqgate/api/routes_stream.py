"""Streaming consumption over HTTP (issue 31, docs/STREAM.md): `GET /mq/stream` answers
Server-Sent Events or, with an Upgrade, a WebSocket, one event per batch (stream/service.py);
`POST /mq/stream/tickets` gives a browser a ticket to open it with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Final

import msgspec
from msgspec import Meta

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.api.routes_data import found_body
from mqgate.errors import BadRequest, MqgateError
from mqgate.model import MODE_BROADCAST, MODE_CLUSTER
from mqgate.registry.records import ConsumerRecord
from mqgate.services.consume import PullResult
from mqgate.services.gateway import Gateway
from mqgate.stream.service import END, HEARTBEAT, MESSAGES, OPEN, WAITING, Event, Streams
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route
from mqgate.web.websocket import GOING_AWAY, NORMAL_CLOSURE, TOO_BIG, Disconnected, WebSocket

log = logging.getLogger(__name__)

EVENT_STREAM = b"text/event-stream"
# No cache may keep it, no proxy buffer it.
STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
# A client's message on a stream's WebSocket: an ack, `{"ack": "<requestId>"}` (~200 bytes).
MAX_SOCKET_MESSAGE_CHARS: Final = 4096


class SocketAck(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    ack: Annotated[str, Meta(min_length=1, max_length=1024)]


_ack_decoder: Final = msgspec.json.Decoder(SocketAck)
_encode: Final = msgspec.json.Encoder().encode


SSE_RETRY_MS: Final = 1000
_SSE_COMMENTS: Final = {HEARTBEAT: b": heartbeat\n\n", WAITING: b": waiting for acks\n\n"}


def sse(ev: Event) -> bytes:
    """An event as Server-Sent Events write it: batches and the end as events, the rest as
    comments (EventSource ignores them; they keep proxies from closing an idle stream)."""
    if ev.kind == MESSAGES or ev.kind == END:
        head = b"id: %b\n" % ev.event_id.encode() if ev.event_id else b""
        return head + b"event: %b\ndata: %b\n\n" % (ev.kind.encode(), ev.data)
    if ev.kind == OPEN:  # and how soon an EventSource reconnects (with Last-Event-ID)
        return b"retry: %d\n: stream of %b\n\n" % (SSE_RETRY_MS, ev.data)
    return _SSE_COMMENTS[ev.kind]


def socket_message(ev: Event) -> str:
    """An event as a WebSocket text message: `{"event": kind, "id": requestId, "data": ...}`."""
    if ev.kind == MESSAGES:
        return f'{{"event":"messages","id":{_encode(ev.event_id).decode()},"data":{ev.data.decode()}}}'
    if ev.kind == END:
        return f'{{"event":"end","data":{ev.data.decode()}}}'
    if ev.kind == OPEN:
        return f'{{"event":"open","consumer":{_encode(ev.data.decode()).decode()}}}'
    return f'{{"event":"{ev.kind}"}}'


def _error(exc: MqgateError) -> str:
    return _encode({"event": "error", "code": exc.code, "field": exc.field, "message": exc.message}).decode()


class StreamRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.streams = Streams(gateway)

    @staticmethod
    def _streamable(c: ConsumerRecord, client_id: str | None) -> None:
        if c.mode not in (MODE_CLUSTER, MODE_BROADCAST):
            why = f"consumer {c.name} is a {c.mode} consumer: streams are for cluster and broadcast ones"
            raise BadRequest(why, field="consumer")
        if c.mode == MODE_BROADCAST and not client_id:
            raise BadRequest(
                f"clientId is required: consumer {c.name} is a broadcast consumer", field="clientId"
            )

    def _events(self, req: Request) -> AsyncIterator[Event]:
        inp: s.StreamIn = req.input
        c: ConsumerRecord = req.caller
        owner = f"{req.client_host}/{inp.client_id}" if inp.client_id else req.client_host
        broker = self.gw.ctx.store.broker

        def body_of(result: PullResult) -> bytes:
            return found_body(result, broker)

        return self.streams.stream(
            c,
            client_id=inp.client_id,
            max_in_flight=inp.max,
            heartbeat_s=inp.heartbeat,
            owner=owner,
            body_of=body_of,
            duration_s=inp.timeout,
        )

    async def stream(self, req: Request) -> Response:
        inp: s.StreamIn = req.input
        c: ConsumerRecord = req.caller
        self._streamable(c, inp.client_id)
        headers = list(STREAM_HEADERS)
        give_back = self.streams.slots.take(c.name)  # before the resume's ack: a refusal acks nothing
        try:
            resumed = await self._resume(req)
        except BaseException:
            give_back()
            raise
        if resumed is not None:
            headers.append((b"x-mq-resume-ack", resumed[1].encode()))

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for ev in self._events(req):
                    yield sse(ev)
            except MqgateError as exc:  # a store fault: said, and the stream ends (EventSource retries)
                log.warning("stream of %s ended by a fault: %s", c.name, exc.message)
                yield sse(Event(END, _encode({"reason": exc.message, "code": exc.code})))

        return Response(content_type=EVENT_STREAM, headers=headers, stream=chunks(), on_close=give_back)

    async def _resume(self, req: Request) -> tuple[str, str] | None:
        """The batch a reconnection resumes after (`Last-Event-ID`, or `lastEventId` where the
        header cannot be sent), acked: its id and what the ack gave."""
        inp: s.StreamIn = req.input
        header = req.headers.get(b"last-event-id", b"").decode("latin-1").strip()
        if header and inp.last_event_id and header != inp.last_event_id:
            raise BadRequest("Last-Event-ID and lastEventId name different batches", field="lastEventId")
        event_id, field = (header, "Last-Event-ID") if header else (inp.last_event_id, "lastEventId")
        if not event_id:
            return None
        return event_id, await self.streams.ack(req.caller, inp.client_id, event_id, field)

    async def stream_socket(self, req: Request, ws: WebSocket) -> None:
        """The same stream over a WebSocket; the client acks each batch over it with
        `{"ack": "<requestId>"}` and is answered `{"event": "acked", "id", "outcome"}`."""
        inp: s.StreamIn = req.input
        c: ConsumerRecord = req.caller
        self._streamable(c, inp.client_id)
        give_back = self.streams.slots.take(c.name)
        try:
            resumed = await self._resume(req)
            await ws.accept()
            if resumed is not None:
                event_id, outcome = resumed
                await ws.send_text(_encode({"event": "resumed", "id": event_id, "outcome": outcome}).decode())
            await self._serve_socket(req, ws)
        finally:
            give_back()

    async def _serve_socket(self, req: Request, ws: WebSocket) -> None:
        inp: s.StreamIn = req.input
        c: ConsumerRecord = req.caller
        events = self._events(req)
        sender = asyncio.ensure_future(self._send_all(events, ws))
        try:
            while True:
                receiving = asyncio.ensure_future(ws.receive_text())
                await asyncio.wait({sender, receiving}, return_when=asyncio.FIRST_COMPLETED)
                if not receiving.done():  # the stream ended: its timeout, the gateway stops, a fault
                    receiving.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Disconnected):
                        await receiving
                    if (fault := sender.exception()) is not None:
                        raise fault  # answered by the web layer: logged, the socket closed with it
                    if self.gw.consuming.closing:
                        await ws.close(GOING_AWAY, "the gateway is stopping")
                    else:
                        await ws.close(NORMAL_CLOSURE, "timeout")
                    return
                text = receiving.result()  # Disconnected when the client went away
                if len(text) > MAX_SOCKET_MESSAGE_CHARS:
                    await ws.close(TOO_BIG, f"a message over {MAX_SOCKET_MESSAGE_CHARS} characters")
                    return
                await ws.send_text(await self._answer(c, inp.client_id, text))
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Disconnected):
                await sender

    @staticmethod
    async def _send_all(events: AsyncIterator[Event], ws: WebSocket) -> None:
        async for ev in events:
            await ws.send_text(socket_message(ev))

    async def _answer(self, c: ConsumerRecord, client_id: str | None, text: str) -> str:
        try:
            try:
                request_id = _ack_decoder.decode(text).ack
            except msgspec.ValidationError as exc:
                raise BadRequest(f'not an ack, {{"ack": "<requestId>"}}: {exc}', field="ack") from None
            except msgspec.DecodeError:
                raise BadRequest('not JSON: send {"ack": "<requestId>"}', field="ack") from None
            outcome = await self.streams.ack(c, client_id, request_id, "ack")
        except MqgateError as exc:
            return _error(exc)
        return _encode({"event": "acked", "id": request_id, "outcome": outcome}).decode()

    async def ticket(self, req: Request) -> Response:
        inp: s.StreamTicketIn = req.input
        c: ConsumerRecord = req.caller
        self._streamable(c, inp.client_id)
        text, expires_ms = self.gw.consuming.issue_ticket(c, inp.client_id, inp.expires_in_s)
        return Response(a.StreamTicketOut(ticket=text, expires_at_ms=expires_ms))

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/mq/stream", self.stream, "stream",
                  "A consumer's batches as Server-Sent Events or, with an Upgrade, over a WebSocket; "
                  "each acked by its requestId (docs/STREAM.md)",
                  s.StreamIn, a.PullOut, (404,), body="none", websocket=self.stream_socket),
            Route("POST", "/mq/stream/tickets", self.ticket, "consumer",
                  "A stream ticket: opens this consumer's stream and acks its batches, for a browser "
                  "that cannot send the token (docs/STREAM.md)",
                  s.StreamTicketIn, a.StreamTicketOut, (404,), body="json"),
        ]  # fmt: skip
