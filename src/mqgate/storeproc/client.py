"""A gateway worker's connection to the store process: calls multiplexed by id over one socket.

A call that cannot reach the store process (not started yet, restarting after a crash, gone)
raises `Unavailable` (503 with Retry-After): the call may or may not have been carried out, as
with a Redis connection that drops, and the client retries. The next call connects again; the
listeners `on_reconnect` names are then told that anything may have moved meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from mqgate.errors import MqgateError, Unavailable
from mqgate.storeproc.wire import CANCEL, CONTROL, NOTICE, FramedConnection, frame

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 2.0


class _Connection(FramedConnection):
    """The worker's socket: calls out; answers in, handed to their calls."""

    def __init__(self, client: StoreClient) -> None:
        super().__init__()
        self.client = client
        self.lost = False

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except Exception as exc:  # a broken stream: nothing after it can be trusted
            log.error("store process: unreadable answer (%s); reconnecting", exc)
            self.close()
            return
        calls = self.client._calls
        for call_id, ok, value in frames:
            if call_id == 0:
                if ok == NOTICE:
                    self.client._notice(value)
                continue
            future = calls.pop(call_id, None)
            if future is None or future.done():  # cancelled meanwhile
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.client._lost(self, exc)


class StoreClient:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._connection: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._on_notice: Callable[[int], Awaitable[None]] | None = None
        self._on_reconnect: list[Callable[[], None]] = []
        self._ever_connected = False
        self._closed = False

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each reconnection: what the store process did while this
        worker was not connected (or what a new store process recovered) went unheard."""
        self._on_reconnect.append(listener)

    async def connect(self) -> None:
        await self._connected()

    async def close(self) -> None:
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None and connection.transport is not None:
            connection.flush()
            connection.transport.close()
        self._fail_all(Unavailable("the store process connection is closed"))

    async def call(self, target: int, method: str, *args: Any, **kwargs: Any) -> Any:
        connection = self._connection or await self._connected()
        return await self._answer(connection, self._begin(connection, target, method, args, kwargs))

    def started(self, target: int, method: str, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """`call`, its frame sent before this returns when connected: the store process then
        carries out a call made after this one (a wake-up after a long poll began) after it."""
        connection = self._connection
        if connection is None:
            return self.call(target, method, *args, **kwargs)
        return self._answer(connection, self._begin(connection, target, method, args, kwargs))

    def _begin(
        self, connection: _Connection, target: int, method: str, args: Any, kwargs: Any
    ) -> tuple[int, asyncio.Future[Any]]:
        self._next_id += 1
        call_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        connection.send(frame((call_id, target, method, args, kwargs)))
        return call_id, future

    async def _answer(self, connection: _Connection, begun: tuple[int, asyncio.Future[Any]]) -> Any:
        call_id, future = begun
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (a long poll's request ended): stop the call there too, so a
            # waiter nobody listens to takes no wake-up from a live one.
            if self._calls.pop(call_id, None) is not None and not connection.lost:
                connection.send(frame((call_id, CANCEL, "", (), {})))
            raise

    def send(self, target: int, method: str, *args: Any, **kwargs: Any) -> None:
        """Call without waiting for, or getting, an answer (a wake-up). Lost if the store
        process cannot be reached now: what it would have woken looks again on its own
        (re-checks, timeouts)."""
        connection = self._connection
        if connection is not None and not connection.lost:
            connection.send(frame((0, target, method, args, kwargs)))

    async def listen(self, on_notice: Callable[[int], Awaitable[None]]) -> None:
        """Hear registry notices any worker announces (`announce`), from now on."""
        self._on_notice = on_notice
        with contextlib.suppress(MqgateError):  # not reachable now: subscribed on reconnecting
            await self.call(CONTROL, "subscribe")

    async def announce(self, version: int) -> None:
        with contextlib.suppress(MqgateError):  # best effort: the periodic refresh makes up for it
            await self.call(CONTROL, "announce", version)

    def _notice(self, version: int) -> None:
        if self._on_notice is not None:
            task = asyncio.ensure_future(self._on_notice(version))
            task.add_done_callback(_log_failure)

    async def _connected(self) -> _Connection:
        async with self._connecting:
            if self._connection is not None:
                return self._connection
            if self._closed:
                raise Unavailable("the store process connection is closed")
            loop = asyncio.get_running_loop()
            try:
                _, connection = await asyncio.wait_for(
                    loop.create_unix_connection(lambda: _Connection(self), str(self.path)),
                    CONNECT_TIMEOUT_S,
                )
            except (TimeoutError, OSError) as exc:
                raise Unavailable(f"the store process ({self.path}) cannot be reached: {exc}") from exc
            self._connection = connection
            if self._on_notice is not None:
                connection.send(frame((0, CONTROL, "subscribe", (), {})))
            if self._ever_connected:
                log.warning("store process: connected again (%s)", self.path)
                for listener in self._on_reconnect:
                    listener()
                if self._on_notice is not None:
                    self._notice(-1)  # notices were lost meanwhile: look anyway
            self._ever_connected = True
            return connection

    def _lost(self, connection: _Connection, exc: Exception | None) -> None:
        if self._connection is connection:
            self._connection = None
        if not self._closed:
            log.error("store process: connection lost (%s); calls in flight fail with 503", exc or "closed")
        self._fail_all(Unavailable(f"the store process connection was lost ({exc or 'closed'})"))

    def _fail_all(self, error: MqgateError) -> None:
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(error)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("registry notice handler failed", exc_info=task.exception())
