"""The HTTP protocol's answer writes (api/protocol.py: _HeadWithBody), through uvicorn on uvloop
as `mqgate serve` runs it: a response's head goes out with its body; a head alone (a stream's, a
HEAD request's) still goes out, and before anything the protocol writes itself (a 400 for a
pipelined request that does not parse)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn
import uvloop

from mqgate.api.protocol import GuardedHttpToolsProtocol
from tests.conftest import free_port

DEADLINE_S = 20.0


def serve_while(app: Any, client: Callable[[int], bytes]) -> bytes:
    """Run `app` under uvicorn with the gateway's protocol on uvloop while `client(port)` runs
    in a thread; what the client read."""
    port = free_port()
    got: list[bytes] = []
    failed: list[BaseException] = []

    def run_client() -> None:
        try:
            got.append(client(port))
        except BaseException as exc:  # raised in the test, not lost in the thread
            failed.append(exc)

    async def main() -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, http=GuardedHttpToolsProtocol, lifespan="off", log_level="error"
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            assert not serving.done(), "the server did not start"
            await asyncio.sleep(0.01)
        thread = threading.Thread(target=run_client, daemon=True)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        server.should_exit = True
        await asyncio.wait_for(serving, DEADLINE_S)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(main(), DEADLINE_S * 2))
    if failed:
        raise failed[0]
    return got[0]


def read_until_closed(s: socket.socket) -> bytes:
    s.settimeout(DEADLINE_S)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_a_held_stream_head_goes_before_the_400_the_protocol_writes_for_a_bad_pipelined_request() -> None:
    ready, garbage_sent = threading.Event(), threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ready.set()
        # Blocks the loop until the bad request is in the socket: it is read in the turn the
        # head waits in.
        assert garbage_sent.wait(DEADLINE_S)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": False})

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
            s.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            assert ready.wait(DEADLINE_S)
            s.sendall(b"\x01NOT HTTP\r\n\r\n")
            garbage_sent.set()
            return read_until_closed(s)

    got = serve_while(app, client)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n"), got
    assert b"content-type: text/event-stream" in got and got.index(b"HTTP/1.1 400") > got.index(b"\r\n\r\n")


def test_head_and_body_arrive_whole_and_a_head_request_is_answered_before_the_next() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b'{"ok":true}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
            s.sendall(b"HEAD /a HTTP/1.1\r\nhost: x\r\n\r\n")
            s.sendall(b"GET /b HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            return read_until_closed(s)

    got = serve_while(app, client)
    first, second = got.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first.endswith(b"\r\n\r\n") and b"content-length: 11" in first  # a HEAD's head, no body
    assert second.endswith(b'\r\n\r\n{"ok":true}')


def test_a_100_continue_is_sent_at_once_and_the_answer_after_it() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()  # reading the body sends the 100 Continue
        body = b"got %d" % len(message["body"])
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
            s.sendall(
                b"POST /p HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n"
                b"expect: 100-continue\r\nconnection: close\r\n\r\n"
            )
            s.settimeout(DEADLINE_S)
            interim = s.recv(65536)
            assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
            s.sendall(b"hello")
            return interim + read_until_closed(s)

    got = serve_while(app, client)
    assert got.index(b"HTTP/1.1 100 Continue") < got.index(b"HTTP/1.1 200 OK") and got.endswith(b"got 5")
