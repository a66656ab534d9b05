"""uvicorn's httptools protocol with the bounds it lacks: a time limit for a request's headers
(slow clients holding connections open: 408), and a limit on the number and size of headers
(431). uvicorn 0.54 has neither for httptools; the lock file pins the version this is for."""

from __future__ import annotations

import asyncio
from typing import Any, Final, NoReturn

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REASONS: Final = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    max_headers: int = 100
    max_header_bytes: int = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One timer a connection, re-armed lazily (not one `call_later` and `cancel` a request:
        # 15 % of a bare app's rate on this server): when it fires it compares the clock with
        # the deadline of the headers being received, if any.
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_deadline: float | None = None
        self._header_count = 0
        self._header_bytes = 0
        self._refusal: tuple[int, str] | None = None
        self.held: _HeadWithBody | None = None  # a response head waiting for its body

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline = self.loop.time() + self.header_timeout_s
        self._header_timer = self.loop.call_at(self._header_deadline, self._check_header_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        if self.held is not None:  # before anything this data makes the protocol write (a 400, a 431)
            self.held.send_head()
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        self._header_bytes = 0
        if self._header_deadline is None:  # a new connection's first request: its own, kept
            self._header_deadline = self.loop.time() + self.header_timeout_s

    # uvicorn's on_url and on_header (0.54, pinned), with the counts in the same call: they
    # run once a header of every request.
    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self.max_header_bytes:
            self._too_large()
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refusal = (431, f"more than {self.max_headers} header fields")
            raise _Refused
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.max_header_bytes:
            self._too_large()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._header_deadline = None
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not before:  # not a WebSocket upgrade
            self.cycle.transport = _HeadWithBody(self)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request's headers ran late while this one was served: refused now that
        # its answer is whole (never a 408 in the middle of it).
        deadline = self._header_deadline
        if deadline is not None and self.loop.time() >= deadline and not self.transport.is_closing():
            self._refuse_late()

    # What the protocol writes or closes itself goes after a head still held (_HeadWithBody).
    def send_400_response(self, msg: str) -> None:
        self._send_held()
        super().send_400_response(msg)

    def shutdown(self) -> None:
        self._send_held()
        super().shutdown()

    def timeout_keep_alive_handler(self) -> None:
        self._send_held()
        super().timeout_keep_alive_handler()

    def _send_held(self) -> None:
        if self.held is not None:
            self.held.send_head()

    def _too_large(self) -> NoReturn:
        self._refusal = (431, f"request line and headers over {self.max_header_bytes} bytes")
        raise _Refused

    def _refuse_late(self) -> None:
        self._refuse(408, f"request headers not received within {self.header_timeout_s:g} s")

    def _disarm(self) -> None:
        self._header_deadline = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _check_header_deadline(self) -> None:
        """The connection's timer: 408 if a request's headers (or a new connection's first
        request) are late; otherwise armed again for the deadline, or a period ahead."""
        self._header_timer = None
        if self.transport.is_closing():
            return
        deadline, now = self._header_deadline, self.loop.time()
        serving = self.cycle is not None and not self.cycle.response_complete
        if deadline is not None and now >= deadline and not serving:
            self._refuse_late()
            return
        # Late while a request is served: `on_response_complete` refuses it.
        at = deadline if deadline is not None and now < deadline else now + self.header_timeout_s
        self._header_timer = self.loop.call_at(at, self._check_header_deadline)

    def _refuse(self, status: int, message: str) -> None:
        self._send_held()
        self._refusal = (status, message)
        self._disarm()
        body = b'{"status":%d,"message":"%s","result":{"code":"bad_request","field":"headers"}}' % (
            status,
            message.encode(),
        )
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, REASONS[status], len(body), body)
        )
        self.transport.close()


# A head written alone is held for its body up to this size of body (larger: two buffers, one
# writev, no copy).
_JOIN_MAX_BYTES: Final = 64 * 1024
_CONTINUE: Final = b"HTTP/1.1 100 "


class _HeadWithBody:
    """A response's transport that sends its status line and headers with the first part of its
    body, in one write: on loopback each write runs the receiver's TCP path too, and a
    produce's answer was two of them (a quarter of the event loop's time). A head with no body
    after it (a stream's, a HEAD request's) goes when the loop runs its next callbacks, or
    before anything the protocol itself writes or closes (`GuardedHttpToolsProtocol`)."""

    __slots__ = ("_flush", "_head", "_protocol", "_transport")

    def __init__(self, protocol: GuardedHttpToolsProtocol) -> None:
        self._protocol = protocol
        self._transport = protocol.transport
        self._head: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        if self._flush is None and not data.startswith(_CONTINUE):  # the head: held for its body
            self._head = data
            self._protocol.held = self
            self._flush = self._protocol.loop.call_soon(self.send_head)
            return
        head = self._take_head()
        if head is None:
            self._transport.write(data)
        elif len(data) <= _JOIN_MAX_BYTES:
            self._transport.write(head + data)
        else:
            self._transport.writelines((head, data))

    def send_head(self) -> None:
        head = self._take_head()
        if head is not None:
            self._transport.write(head)

    def _take_head(self) -> bytes | None:
        head, self._head = self._head, None
        if head is not None:
            assert self._flush is not None
            self._flush.cancel()
            if self._protocol.held is self:
                self._protocol.held = None
        return head

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.send_head()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# What uvicorn is given as `http=`: an import path, so worker processes load it too.
PROTOCOL_PATH: Final = "mqgate.api.protocol:GuardedHttpToolsProtocol"


def configure(header_timeout_s: float, max_headers: int, max_header_bytes: int) -> None:
    """Set the limits (from the settings) in this process, before it serves."""
    GuardedHttpToolsProtocol.header_timeout_s = header_timeout_s
    GuardedHttpToolsProtocol.max_headers = max_headers
    GuardedHttpToolsProtocol.max_header_bytes = max_header_bytes
