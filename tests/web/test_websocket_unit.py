"""The web layer's WebSocket over ASGI messages (web/websocket.py), in process: a refusal is an
HTTP answer where the server offers one and a close otherwise, a close reason fits a close
frame, text and bytes read alike, and a client gone is `Disconnected` on either side."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mqgate.errors import TooManyRequests
from mqgate.stream.service import StreamSlots
from mqgate.web.websocket import MAX_REASON_BYTES, POLICY_VIOLATION, Disconnected, WebSocket


class Channel:
    """What an ASGI server would hand the app: the client's messages in order, the app's kept."""

    def __init__(self, *incoming: dict[str, Any], fail_send: bool = False) -> None:
        self.incoming = list(incoming)
        self.sent: list[dict[str, Any]] = []
        self.fail_send = fail_send

    async def receive(self) -> dict[str, Any]:
        return self.incoming.pop(0)

    async def send(self, message: dict[str, Any]) -> None:
        if self.fail_send:
            raise OSError("the client is gone")
        self.sent.append(message)


def socket(channel: Channel, extensions: dict[str, Any] | None = None) -> WebSocket:
    scope = {"type": "websocket", "extensions": extensions or {}}
    return WebSocket(scope, channel.receive, channel.send)


def test_a_refusal_is_an_http_answer_where_offered_and_a_close_otherwise() -> None:
    offered = Channel()
    ws = socket(offered, {"websocket.http.response": {}})
    asyncio.run(ws.refuse(401, [(b"content-type", b"application/json")], b'{"x":1}', "no token"))
    kinds = [m["type"] for m in offered.sent]
    assert kinds == ["websocket.http.response.start", "websocket.http.response.body"]
    assert offered.sent[0]["status"] == 401 and offered.sent[1]["body"] == b'{"x":1}'
    plain = Channel()
    asyncio.run(socket(plain).refuse(401, [], b"", "é" * 200))
    (close,) = plain.sent
    assert close["type"] == "websocket.close" and close["code"] == POLICY_VIOLATION
    assert len(close["reason"].encode()) <= MAX_REASON_BYTES  # cut on a character, not inside one
    assert close["reason"] == "é" * (MAX_REASON_BYTES // 2)


def test_messages_in_and_out_and_a_client_gone() -> None:
    async def run() -> None:
        channel = Channel(
            {"type": "websocket.connect"},
            {"type": "websocket.receive", "text": "hello"},
            {"type": "websocket.receive", "bytes": b"bytes too"},
            {"type": "websocket.disconnect", "code": 1000},
        )
        ws = socket(channel)
        assert await ws.connected()
        await ws.accept()
        assert await ws.receive_text() == "hello"
        assert await ws.receive_text() == "bytes too"
        await ws.send_text("out")
        with pytest.raises(Disconnected):
            await ws.receive_text()
        with pytest.raises(Disconnected):  # no send after the client went
            await ws.send_text("late")
        await ws.close(1000)  # nothing sent twice, no error
        assert [m["type"] for m in channel.sent] == ["websocket.accept", "websocket.send"]

    asyncio.run(run())


def test_a_send_to_a_vanished_client_is_disconnected_and_a_close_is_quiet() -> None:
    async def run() -> None:
        ws = socket(Channel(fail_send=True))
        with pytest.raises(Disconnected):
            await ws.send_text("x")
        assert ws.closed
        await socket(Channel(fail_send=True)).close(1000, "bye")  # the error is swallowed

    asyncio.run(run())


def test_stream_slots_count_per_consumer_and_in_all_and_give_back_once() -> None:
    slots = StreamSlots(max_open=3, max_per_consumer=2)
    a1, a2 = slots.take("a"), slots.take("a")
    with pytest.raises(TooManyRequests, match="stream_max_per_consumer"):
        slots.take("a")
    b1 = slots.take("b")
    with pytest.raises(TooManyRequests, match="stream_max_open"):
        slots.take("c")
    a1()
    a1()  # twice: given back once
    assert slots.open == 2 and slots.by_consumer == {"a": 1, "b": 1}
    a2()
    b1()
    assert slots.open == 0 and slots.by_consumer == {}
    unlimited = StreamSlots(max_open=0, max_per_consumer=0)
    for _ in range(50):
        unlimited.take("a")
    assert unlimited.open == 50
