"""A WebSocket as a route's handler sees it, over ASGI's `websocket` scope.

Before it is accepted, a socket can still be refused with an HTTP answer (ASGI's
`websocket.http.response` extension, which uvicorn offers): the door's JSON error, as a plain
request would get. Without the extension the refusal is a close (1008) naming the error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from mqgate.web.asgi import Receive, Scope, Send

NORMAL_CLOSURE: Final = 1000
POLICY_VIOLATION: Final = 1008
GOING_AWAY: Final = 1001
TOO_BIG: Final = 1009
INTERNAL_ERROR: Final = 1011
MAX_REASON_BYTES: Final = 123  # RFC 6455: a close frame's reason fits in 125 bytes with its code


class Disconnected(Exception):
    """The client went away (or closed the socket)."""


class WebSocket:
    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.accepted = False
        self.closed = False
        self._sending = asyncio.Lock()  # one message at a time from any of the handler's tasks

    async def connected(self) -> bool:
        """The first message: the client's connect (False: it went away first)."""
        message = await self._receive()
        return bool(message["type"] == "websocket.connect")

    async def accept(self, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await self._send({"type": "websocket.accept", "headers": headers or []})
        self.accepted = True

    async def refuse(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, reason: str) -> None:
        """Before accepting: an HTTP answer where the server can send one, else a close."""
        if "websocket.http.response" in self.scope.get("extensions", {}):
            await self._send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await self._send({"type": "websocket.http.response.body", "body": body})
        else:
            await self.close(POLICY_VIOLATION, reason)
        self.closed = True

    async def send_text(self, text: str) -> None:
        if self.closed:
            raise Disconnected
        try:
            async with self._sending:
                await self._send({"type": "websocket.send", "text": text})
        except OSError:  # uvicorn's ClientDisconnected is one
            self.closed = True
            raise Disconnected from None

    async def receive_text(self) -> str:
        """The next text (or UTF-8 bytes) message; Disconnected when the client is gone."""
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self.closed = True
                raise Disconnected
            if kind == "websocket.receive":
                text = message.get("text")
                if text is not None:
                    return str(text)
                data: bytes = message.get("bytes") or b""
                return data.decode("utf-8", "replace")

    async def close(self, code: int, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        raw = reason.encode()[:MAX_REASON_BYTES].decode("utf-8", "ignore")
        with contextlib.suppress(OSError):
            await self._send({"type": "websocket.close", "code": code, "reason": raw})
