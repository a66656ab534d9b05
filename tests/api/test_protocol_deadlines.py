"""The header deadline of the HTTP protocol (api/protocol.py), on a clock the test moves: a
real protocol on a real socket pair in an event loop whose time is the test's, so each case is
exact whatever the machine's load. A new connection's first request keeps the deadline the
connection got; a next request's late headers are refused only once the answer being sent is
whole, never in its middle."""

from __future__ import annotations

import asyncio
import selectors
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from mqgate.api.protocol import GuardedHttpToolsProtocol

TIMEOUT_S = 1.0


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is `now`, moved by the test: its timers fire when it passes them."""

    now = 1000.0

    def __init__(self) -> None:
        super().__init__(selectors.SelectSelector())

    def time(self) -> float:
        return self.now


class Connection:
    def __init__(self, loop: ClockLoop, app: Any) -> None:
        self.loop = loop
        config = uvicorn.Config(app, http=GuardedHttpToolsProtocol, lifespan="off", log_level="error")
        config.load()
        state = ServerState()
        self.server_side, self.client = socket.socketpair()
        self.client.setblocking(False)
        self.transport, _ = self.loop.run_until_complete(
            loop.connect_accepted_socket(
                lambda: GuardedHttpToolsProtocol(config, state, {}, _loop=loop), self.server_side
            )
        )
        OPEN.append(self)
        self.turns()

    def close(self) -> None:
        self.client.close()
        self.transport.close()
        self.turns()

    def turns(self, n: int = 20) -> None:
        """Let the loop run what is ready now (no time passes)."""
        for _ in range(n):
            self.loop.run_until_complete(asyncio.sleep(0))

    def at(self, seconds: float) -> None:
        """Move the clock to `seconds` after the start, and run what is due."""
        self.loop.now = 1000.0 + seconds
        self.turns()

    def send(self, data: bytes) -> None:
        self.client.sendall(data)
        self.turns()

    def received(self) -> bytes:
        data = b""
        while True:
            try:
                chunk = self.client.recv(65536)
            except BlockingIOError:
                return data
            if not chunk:
                return data + b"<closed>"
            data += chunk


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["path"] == "/slow":
        await RELEASE.wait()
    body = scope["path"].encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


RELEASE: asyncio.Event
OPEN: list[Connection] = []


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[ClockLoop]:
    global RELEASE
    monkeypatch.setattr(GuardedHttpToolsProtocol, "header_timeout_s", TIMEOUT_S)
    loop = ClockLoop()
    asyncio.set_event_loop(loop)
    RELEASE = asyncio.Event()
    yield loop
    while OPEN:
        OPEN.pop().close()
    loop.run_until_complete(loop.shutdown_asyncgens())
    asyncio.set_event_loop(None)
    loop.close()


def test_a_first_request_begun_late_keeps_the_connections_deadline(loop: ClockLoop) -> None:
    conn = Connection(loop, app)
    conn.at(0.9)
    conn.send(b"GET /fast HTTP/1.1\r\n")  # its first byte just before the deadline, then nothing
    conn.at(0.99)
    assert conn.received() == b""
    conn.at(1.0)
    assert conn.received().startswith(b"HTTP/1.1 408 ")


def test_a_kept_alive_connections_next_request_has_a_deadline_of_its_own(loop: ClockLoop) -> None:
    conn = Connection(loop, app)
    conn.at(0.9)
    conn.send(b"GET /fast HTTP/1.1\r\nhost: x\r\n\r\n")
    assert conn.received().startswith(b"HTTP/1.1 200 ")
    conn.at(5.0)
    conn.send(b"GET /fast HTTP/1.1\r\n")
    conn.at(5.99)
    assert conn.received() == b""
    conn.at(6.0)
    assert conn.received().startswith(b"HTTP/1.1 408 ")


def test_a_next_requests_late_headers_are_refused_after_the_answer_being_served(loop: ClockLoop) -> None:
    conn = Connection(loop, app)
    conn.send(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\nGET /fast HTTP/1.1\r\n")
    conn.at(3.0)  # the next request's deadline passed while /slow is served: nothing written
    assert conn.received() == b""
    RELEASE.set()
    conn.turns()
    answer = conn.received()
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert answer.index(b"/slow") < answer.index(b"HTTP/1.1 408 "), answer
    assert answer.endswith(b"<closed>")
