"""The store process: the embedded backends of one data directory, served to gateway workers.

Each call runs as its own task, so a long poll (`wait_for_data`, the scheduler's `wait`) holds
up nothing else; a worker that cancels a call (its request went away) cancels that task. The
backends are the same objects a single-process gateway uses, so every guarantee of theirs (one
writer per file, the group commit, crash recovery, the disk-full floor) holds unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec

from mqgate.core.layout import Layout
from mqgate.core.tokens import AckToken
from mqgate.errors import MqgateError, StorageError, Unavailable
from mqgate.health import Health
from mqgate.model import QueueBounds
from mqgate.storeproc.wire import CANCEL, CONTROL, NOTICE, OFFSETS, SCHEDULER, STORE, FramedConnection, frame

log = logging.getLogger(__name__)

# What a worker may call on each backend: the contract's methods that run in the store
# process. Not `open`/`close` (the store process owns its backends' life), not `watch` or
# `wake_all` (a worker's own listeners and long polls), not the properties.
STORE_METHODS: Final = frozenset(
    {
        "create_topic",
        "delete_topic",
        "append",
        "append_many",
        "append_encoded",
        "read",
        "read_raw",
        "bounds",
        "queue_bytes",
        "offset_for_time",
        "wait_for_data",
        "wake",
        "enforce_retention",
    }
)
OFFSETS_METHODS: Final = frozenset(
    {
        "ensure_table",
        "table",
        "clients",
        "lease",
        "ack",
        "release",
        "extend",
        "record_dead_letters",
        "add_dead_letters",
        "receive",
        "delete_message",
        "change_visibility",
        "receipt_counts",
        "reset",
        "advance",
        "expire_clients",
        "drop_group",
        "take_tokens",
        "return_tokens",
    }
)
SCHEDULER_METHODS: Final = frozenset(
    {"hold", "claim_due", "settle", "next_due_ms", "wait", "held_for", "stats"}
)
# Calls whose first step must already run in a task of their own: the scheduler's wait
# (asyncio.timeout). A backend method that starts to use the current task belongs here; the
# remote contract suites fail without it ("Timeout should be used inside a task").
_IN_A_TASK: Final = frozenset({(SCHEDULER, "wait")})
_FIRST: Final = object()  # `resume` runs the call's first step itself
_PEERCRED: Final = struct.Struct("3i")


class StoreServer:
    def __init__(self, store: Any, offsets: Any, scheduler: Any, health: Health) -> None:
        self.health = health
        self._store_bounds = store.bounds
        self._read_raw = store.read_raw
        # The embedded store names where a batch's records are: the worker reads them itself.
        self._span: Callable[[str, int, int, int], Any] | None = getattr(store, "span", None)
        self._lease = offsets.lease
        self._ack = offsets.ack
        self._methods: dict[int, dict[str, Callable[..., Any]]] = {
            STORE: {name: getattr(store, name) for name in STORE_METHODS},
            OFFSETS: {name: getattr(offsets, name) for name in OFFSETS_METHODS},
            SCHEDULER: {name: getattr(scheduler, name) for name in SCHEDULER_METHODS},
            CONTROL: {
                "health": health.snapshot,
                "topics": store.topic_names,
                "bounds": self._bounds,
                "lease_read": self._lease_read,
                "ack_lease_read": self._ack_lease_read,
                "subscribe": self._subscribe,
                "announce": self._announce,
            },
        }
        self._connections: set[_ServerConnection] = set()
        self._subscribers: set[_ServerConnection] = set()
        self._current: _ServerConnection | None = None
        self._server: asyncio.AbstractServer | None = None

    async def start(self, path: Path) -> None:
        with_suffix = path.with_name(path.name + ".new")
        with_suffix.unlink(missing_ok=True)
        loop = asyncio.get_running_loop()
        # Made under another name and renamed into place once it has its mode: a worker never
        # connects to a socket that is not ready, nor to one another user could have opened.
        old = os.umask(0o177)
        try:
            self._server = await loop.create_unix_server(lambda: _ServerConnection(self), str(with_suffix))
        finally:
            os.umask(old)
        os.replace(with_suffix, path)
        log.info("store process serving %s", path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()

    def method(self, target: int, name: str) -> Callable[..., Any] | None:
        methods = self._methods.get(target)
        return None if methods is None else methods.get(name)

    async def _bounds(self, topics: list[str]) -> list[list[QueueBounds] | MqgateError]:
        """Several topics' bounds in one call; each topic's error (an unknown topic) in its place."""
        answers: list[list[QueueBounds] | MqgateError] = []
        for topic in topics:
            try:
                answers.append(await self._store_bounds(topic))
            except MqgateError as exc:
                answers.append(exc)
        return answers

    async def _lease_read(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        layout: Layout,
        args: dict[str, Any],
    ) -> Any:
        """`OffsetStore.lease` with the layout's queue bounds taken here when the worker sent
        none, and a first delivery's records read at once (`Lease.records`): a pull's bounds,
        lease and read in one round trip. Where the store says where those records are in its
        files, the answer is (the lease, that place) instead, and the worker reads them there
        (`FileSpan`): the store process neither reads them nor sends them. A batch delivered
        before, or to be dead lettered, is read by the worker as its path needs it."""
        if bounds is None:
            bounds = layout.queue_bounds([await self._store_bounds(t) for t in layout.store_topics])
        lease = await self._lease(group, client_id, bounds, **args)  # an offsets.interface.Lease
        if lease is None or lease.dead_letter or lease.attempts != 1:
            return lease
        slot = layout.slot(lease.queue)
        count = lease.next_offset - lease.offset
        span = None if self._span is None else self._span(slot.topic, slot.queue, lease.offset, count)
        if span is not None:
            return lease, span
        records = await self._read_raw(slot.topic, slot.queue, lease.offset, count)
        return msgspec.structs.replace(lease, records=records)

    async def _ack_lease_read(
        self,
        token: AckToken,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        layout: Layout | None,
        args: dict[str, Any],
    ) -> tuple[Any, Any, Exception | None]:
        """`OffsetStore.ack_and_lease`: a pull's ack, then `_lease_read` (or the plain lease when
        the worker sent no layout), in one round trip: (the ack's refusal, the lease, what kept
        the lease from being taken after the ack was done)."""
        refusal = await self._ack(token, args["now_ms"])
        try:
            if layout is None:
                lease = await self._lease(group, client_id, bounds, **args)
            else:
                lease = await self._lease_read(group, client_id, bounds, layout, args)
        except Exception as exc:  # the ack is done: it is answered, with what kept the lease
            return refusal, None, exc
        return refusal, lease, None

    def _subscribe(self) -> None:
        assert self._current is not None
        self._subscribers.add(self._current)

    def _announce(self, version: int) -> None:
        notice = frame((0, NOTICE, version))
        for connection in self._subscribers:
            connection.send(notice)


class _ServerConnection(FramedConnection):
    """A worker's socket: calls in, answers out."""

    def __init__(self, server: StoreServer) -> None:
        super().__init__()
        self.server = server
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            _pid, uid, _gid = _PEERCRED.unpack(creds)
            if uid != os.getuid():
                log.error("store process: refused a connection from uid %d", uid)
                transport.close()
                return
        self.server._connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except Exception as exc:
            log.error("store process: unreadable call (%s); closing the connection", exc)
            self.close()
            return
        server = self.server
        for call_id, target, name, args, kwargs in frames:
            if target == CANCEL:
                task = self.tasks.pop(call_id, None)
                if task is not None:
                    task.cancel()
                continue
            method = server.method(target, name)
            if method is None:
                self.reply(call_id, False, StorageError(f"the store process has no method {target}.{name}"))
                continue
            server._current = self
            try:
                call = method(*args, **kwargs)
                if not asyncio.iscoroutine(call):
                    self.reply(call_id, True, call)
                    continue
                # The call's first step runs now, in call order: most calls (bounds, reads, a
                # lease) end in it without a task or a turn of the loop, and a long poll has
                # registered its waiter before a wake-up sent after it is read. Not a call that
                # needs to be in a task from its start (asyncio.timeout reads the current task).
                yielded = _FIRST if (target, name) in _IN_A_TASK else call.send(None)
            except StopIteration as done:
                self.reply(call_id, True, done.value)
                continue
            except (Exception, asyncio.CancelledError) as exc:
                self.reply(call_id, False, _cancelled_here(exc))
                continue
            finally:
                server._current = None
            task = asyncio.get_running_loop().create_task(self.resume(call_id, call, yielded))
            if call_id and not task.done():
                self.tasks[call_id] = task

    async def resume(self, call_id: int, call: Any, yielded: Any) -> None:
        """Drive a call whose first step waits on `yielded` (a future, or None for a bare turn
        of the loop), as a task would have, to its answer."""
        try:
            if yielded is _FIRST:
                yielded = call.send(None)
            while True:
                cancelled = False
                try:
                    if yielded is None:
                        await asyncio.sleep(0)
                    else:
                        # Taken over from the call, as a task does before it waits on it.
                        yielded._asyncio_future_blocking = False
                        await yielded
                except asyncio.CancelledError:
                    # This task was cancelled (the worker's cancel): the call hears it, from
                    # its future or, if that had finished meanwhile, thrown in.
                    cancelled = yielded is None or not yielded.cancelled()
                except Exception:
                    pass  # the call reads its future's outcome when it goes on
                yielded = call.throw(asyncio.CancelledError()) if cancelled else call.send(None)
        except StopIteration as done:
            self.reply(call_id, True, done.value)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                return  # the worker cancelled it: it waits for no answer
            self.reply(call_id, False, _cancelled_here(exc))  # the backend cancelled it
        except Exception as exc:
            # As the backend raised it (an unknown queue's IndexError too): the worker's caller
            # sees what it would see in one process.
            self.reply(call_id, False, exc)
        finally:
            self.tasks.pop(call_id, None)

    def reply(self, call_id: int, ok: bool, value: Any) -> None:
        if not call_id:
            if not ok:
                log.error("store process: a call without an answer failed: %s", value)
            return
        try:
            data = frame((call_id, ok, value))
        except Exception as exc:  # an answer that cannot travel: say so rather than hang the call
            log.exception("store process: an answer could not be encoded")
            data = frame(
                (call_id, False, StorageError(f"the store process could not send its answer: {exc}"))
            )
        self.send(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        self.server._subscribers.discard(self)
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()


def _cancelled_here(exc: BaseException) -> BaseException:
    """What a worker is told of a call the store process's backend cancelled (it is stopping):
    an error to answer, not a cancellation of the worker's own request."""
    if isinstance(exc, asyncio.CancelledError):
        return Unavailable("the store process cancelled the call (it is stopping?)")
    return exc
