"""One pipelined connection to a standalone Redis for the data path's commands.

redis-py's asyncio client spends about 60 µs of CPU and 360 Python calls on each command (a
pooled connection taken and given back, a retry wrapper, a timeout context per read, its own
parsing path); a pull is three commands. A lane writes each command, packed by hiredis, on one
connection as soon as it is asked, and hiredis's reader hands the replies, in order, to the
futures waiting for them: 8 µs a command (benchmarks/RESULTS.md, 2026-11-30). Redis runs the
commands of a connection in the order they arrive, as it would from several.

What a caller sees is what redis-py's client (`redisio.connect`: no retries) gives: its
exception classes (an error reply is parsed by redis-py's own parser, so `redisio.translated`
maps it the same way); a command that was written and then lost its connection fails with
`ConnectionError` and is not sent again (it may have run), unless the caller says it only reads;
one that found its connection gone before it was written goes on a new one. Each command
that waits longer than the socket timeout fails with `TimeoutError`, and its reply, should it
come, is dropped (the connection keeps the order); a connection that received nothing for
twice the timeout while commands wait is dropped, failing them, and the next command opens
another. Only plain TCP to a
standalone server: TLS, Unix sockets, Sentinel and Cluster keep redis-py.
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

# How often a connection checks its waiting commands against the timeout, as a part of it.
_WATCH_FRACTION: Final = 0.25
# Nothing received for this many timeouts while commands wait: the connection is dropped.
_SILENT_TIMEOUTS: Final = 2


class _LaneProtocol(asyncio.Protocol):
    def __init__(self, timeout_s: float, on_lost: Callable[[], None] | None) -> None:
        self.reader = hiredis.Reader()
        self._on_lost = on_lost
        # (future, when it was written): replies come in the order commands were written. A
        # future that timed out stays until its reply comes, which is then dropped.
        self.pending: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport
        self.closed = False
        self._why = ""
        self._timeout_s = timeout_s
        self._received = time.monotonic()
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._arm()

    def send_all(self, packed: list[bytes]) -> list[asyncio.Future[Any]]:
        """Write the commands; their futures. Raises `ConnectionError` when nothing was
        written (the connection is closed): the caller may send them elsewhere."""
        if self.closed:
            raise rexc.ConnectionError(f"the connection to redis is closed ({self._why})")
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        futures = [loop.create_future() for _ in packed]
        try:
            self.transport.write(packed[0] if len(packed) == 1 else b"".join(packed))
        except Exception as exc:  # a transport closing under it (uvloop raises, asyncio drops)
            self.abort(rexc.ConnectionError(f"writing to redis: {exc}"))
            raise rexc.ConnectionError(f"writing to redis: {exc}") from exc
        if not self.pending:
            self._received = sent  # the silence that counts starts with the first waiting command
        self.pending.extend((f, sent) for f in futures)
        return futures

    def data_received(self, data: bytes) -> None:
        self._received = time.monotonic()
        self.reader.feed(data)
        pending = self.pending
        while (reply := self.reader.gets()) is not False:
            if not pending:  # a reply to nothing (a refusal before any command): not ours to keep
                self.abort(rexc.ConnectionError(f"redis sent an unasked reply: {reply}"))
                return
            future, _ = pending.popleft()
            if future.done():  # timed out, or its caller went away: the reply is dropped
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(BaseParser.parse_error(str(reply)))  # type: ignore[no-untyped-call]
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:  # closed here: by `close`, or dropped as silent
            return
        self._fail(rexc.ConnectionError(f"connection to redis lost: {exc or 'closed by the server'}"))
        if self._on_lost is not None:
            self._on_lost()

    def abort(self, error: Exception) -> None:
        """Drop the connection now, failing what waits on it with `error`."""
        if self.closed:
            return
        self._fail(error)
        self.transport.abort()
        if self._on_lost is not None:
            self._on_lost()

    def close(self) -> None:
        if not self.closed:
            self._fail(rexc.ConnectionError("the connection to redis was closed"))
            self.transport.close()

    def _fail(self, error: Exception) -> None:
        self.closed = True
        self._why = str(error)
        if self._watch is not None:
            self._watch.cancel()
        while self.pending:
            future, _ = self.pending.popleft()
            if not future.done():
                future.set_exception(error)

    def _arm(self) -> None:
        self._watch = asyncio.get_running_loop().call_later(self._timeout_s * _WATCH_FRACTION, self._check)

    def _check(self) -> None:
        if self.closed:
            return
        now = time.monotonic()
        if self.pending and now - self._received > self._timeout_s * _SILENT_TIMEOUTS:
            self.abort(rexc.TimeoutError(f"redis sent nothing for {now - self._received:.1f} s"))
            return
        for future, sent in self.pending:  # oldest first
            if now - sent <= self._timeout_s:
                break
            if not future.done():
                future.set_exception(rexc.TimeoutError(f"redis did not answer within {self._timeout_s:g} s"))
        self._arm()


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
        """`on_lost`: called when the connection is lost or dropped as silent (not when closed
        here): the client's pooled connections to the same server most likely went as well."""
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
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._protocol is not None and not self._protocol.closed

    async def execute(self, *args: Any, reads: bool = False) -> Any:
        return (await self.execute_many(args, reads=reads))[0]

    async def execute_many(self, *commands: tuple[Any, ...], reads: bool = False) -> list[Any]:
        """Several commands written at once, their replies in order (an error reply raised).
        `reads`: they only read, so commands whose connection was lost under them are sent once
        more on a new one (a restarted server: the first command finds the old one dead)."""
        packed = [hiredis.pack_command(c) for c in commands]
        try:
            return await self._send(packed)
        except rexc.ConnectionError:
            if not reads or self._closed:
                raise
        return await self._send(packed)

    async def _send(self, packed: list[bytes]) -> list[Any]:
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connected()
        try:
            futures = protocol.send_all(packed)
        except rexc.ConnectionError:  # nothing was written: once more, on a new connection
            futures = (await self._connected()).send_all(packed)
        try:
            return [await f for f in futures]
        except BaseException:
            for f in futures:  # the others' outcomes are nobody's now
                if not f.done():
                    f.cancel()
                elif not f.cancelled():
                    f.exception()
            raise

    async def _connected(self) -> _LaneProtocol:
        """The live connection, opened once however many callers ask for it at the same time."""
        if self._closed:
            raise rexc.ConnectionError("the lane to redis is closed")
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
                for future in protocol.send_all([hiredis.pack_command(c) for c in self._hello]):
                    await future
        except BaseException:
            protocol.close()
            raise
        if self._closed:  # closed while it connected
            protocol.close()
            raise rexc.ConnectionError("the lane to redis is closed")
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        """For good: what waits fails, and nothing is sent any more."""
        self._closed = True  # a connect under way ends with it closed (`_connect`)
        if self._protocol is not None:
            self._protocol.close()

    def close_if_idle(self) -> None:
        """Close the connection unless commands wait on it (they keep it to their answers); the
        next command opens another (`redisio.close_idle_connections`)."""
        if self._protocol is not None and not self._protocol.pending:
            self._protocol.close()
