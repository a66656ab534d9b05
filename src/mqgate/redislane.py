"""One pipelined connection to a standalone Redis for the data path's commands.

redis-py's asyncio client spends about 60 µs of CPU and 360 Python calls on each command (a
pooled connection taken and given back, a retry wrapper, a timeout context per read, its own
parsing path); a pull is three commands. A lane writes each command, packed by hiredis, on one
connection as soon as it is asked, and hiredis's reader hands the replies, in order, to the
futures waiting for them: 8 µs a command (benchmarks/RESULTS.md, 2026-11-30). Redis runs the
commands of a connection in the order they arrive, as it would from several.

What a caller sees is what redis-py's client gives: its exception classes (an error reply is
parsed by redis-py's own parser, so `redisio.translated` maps it the same way), a command that
met a dead connection tried once more on a new one (as redis-py's retry does), and a reply
that does not come within the socket timeout failing every command waiting on the connection
with `TimeoutError` (a hung server: the connection is dropped and the next call opens another).
Only plain TCP to a standalone server: TLS, Unix sockets, Sentinel and Cluster keep redis-py.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any, Final

import hiredis
from redis import exceptions as rexc
from redis._parsers.base import BaseParser

# How often a connection checks that its oldest command has not waited past the timeout.
_WATCH_FRACTION: Final = 0.25


class _LaneProtocol(asyncio.Protocol):
    def __init__(self, timeout_s: float, on_lost: Callable[[], None] | None) -> None:
        self.reader = hiredis.Reader()
        self._on_lost = on_lost
        # (future, when it was sent): replies come in the order commands were written.
        self.pending: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._timeout_s = timeout_s
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        self._arm()

    async def send_all(self, packed: list[bytes]) -> list[Any]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        futures = [loop.create_future() for _ in packed]
        self.pending.extend((f, sent) for f in futures)
        self.transport.write(packed[0] if len(packed) == 1 else b"".join(packed))
        try:
            return [await f for f in futures]
        except BaseException:
            for f in futures:  # the others' outcomes are nobody's now
                if not f.done():
                    f.cancel()
                elif not f.cancelled():
                    f.exception()
            raise

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        pending = self.pending
        while (reply := self.reader.gets()) is not False:
            future, _ = pending.popleft()
            if future.done():  # its caller went away (cancelled): the reply is dropped
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(BaseParser.parse_error(str(reply)))  # type: ignore[no-untyped-call]
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:  # closed here: by `close`, or after a timeout
            return
        self._fail(rexc.ConnectionError(f"connection to redis lost: {exc or 'closed by the server'}"))
        self._lost()

    def _lost(self) -> None:
        if self._on_lost is not None:
            self._on_lost()

    def _fail(self, error: Exception) -> None:
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
        while self.pending:
            future, _ = self.pending.popleft()
            if not future.done():
                future.set_exception(error)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._watch = loop.call_later(self._timeout_s * _WATCH_FRACTION, self._check)

    def _check(self) -> None:
        if self.closed:
            return
        if self.pending and time.monotonic() - self.pending[0][1] > self._timeout_s:
            self._fail(rexc.TimeoutError(f"redis did not answer within {self._timeout_s:g} s"))
            assert self.transport is not None
            self.transport.abort()
            self._lost()
            return
        self._arm()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._fail(rexc.ConnectionError("the connection to redis was closed"))


class Lane:
    """Commands to one standalone Redis on one pipelined connection (opened on first use and
    again after it was lost). `execute(*args)` answers as `redis.asyncio.Redis.execute_command`
    does with no response callback: hiredis's raw reply."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        password: str | None = None,
        username: str | None = None,
        db: int = 0,
        timeout_s: float,
        connect_timeout_s: float,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """`on_lost`: called when the connection is lost or times out (not when closed here):
        the client's pooled connections to the same server are most likely gone as well."""
        self.host, self.port = host, port
        self._on_lost = on_lost
        self._hello: list[tuple[Any, ...]] = []
        if password is not None:
            self._hello.append(("AUTH", username, password) if username else ("AUTH", password))
        if db:
            self._hello.append(("SELECT", db))
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._protocol: _LaneProtocol | None = None
        self._connecting: asyncio.Future[_LaneProtocol] | None = None

    async def execute(self, *args: Any) -> Any:
        return (await self.execute_many(args))[0]

    async def execute_many(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Several commands written at once, their replies in order (an error reply raised)."""
        packed = [hiredis.pack_command(c) for c in commands]
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connected()
        try:
            return await protocol.send_all(packed)
        except rexc.ConnectionError:
            if not protocol.closed:
                raise
        # The connection died under the commands (a restarted server, an idle one closed):
        # once more on a new one, as redis-py tries a command again.
        return await (await self._connected()).send_all(packed)

    async def _connected(self) -> _LaneProtocol:
        """The live connection, opened once however many callers ask for it at the same time."""
        if self._protocol is not None and not self._protocol.closed:
            return self._protocol
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _LaneProtocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: _LaneProtocol(self._timeout_s, self._on_lost), self.host, self.port
                )
        except (OSError, TimeoutError) as exc:
            raise rexc.ConnectionError(f"cannot connect to redis at {self.host}:{self.port}: {exc}") from exc
        try:
            if self._hello:
                await protocol.send_all([hiredis.pack_command(c) for c in self._hello])
        except BaseException:
            protocol.close()
            raise
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None

    def close_if_idle(self) -> None:
        """Close the connection unless commands wait on it (they keep it to their answers); the
        next command opens another (`redisio.close_idle_connections`)."""
        if self._protocol is not None and not self._protocol.pending:
            self.close()
