"""`MessageStore` and `OffsetStore` facades over `ClusterRouter` (see failover/routing.py).

Data-path calls to a cluster report their outcome to the pool's detector (SPEC P8: connect
failures, send time-outs and the error rate fail a cluster), within the send time-out, and
wait until their project is declared on that cluster for its current move (routing.py).
Ack-token calls go to the cluster that served the batch, declared there when it was served.
Calls that concern every store (retention, waking readers) go to each opened one.

While no project has clusters (`direct`), each data-path method goes straight to the
gateway's own store: a gateway that does not use failover pays one attribute check per call.
They route again as soon as a project gets clusters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mqgate.core.acks import AckRefusal
from mqgate.core.layout import Layout
from mqgate.core.message_window import MessageOutcome, Received
from mqgate.core.tokens import AckToken
from mqgate.errors import MqgateError
from mqgate.failover.routing import ClusterRouter
from mqgate.model import QueueBounds, StoredMessage
from mqgate.offsets.interface import (
    AckedLease,
    GroupListener,
    Lease,
    OffsetEntry,
    OffsetStore,
    ack_then_lease,
)
from mqgate.store.interface import (
    Companions,
    Encoded,
    MessageStore,
    TopicConfig,
    TopicListener,
    write_companions,
)
from mqgate.store.waiters import ANY_READER, Reader

T = TypeVar("T")


class _Facade:
    """`direct` while no project has clusters: every call to the gateway's own store.

    Watchers (`watch`) hear the gateway's own store; the clusters' moves they do not hear, so
    the facade hears every change only while direct, and tells its watchers "anything may
    have moved" (None) whenever the projects with clusters change."""

    def __init__(self, router: ClusterRouter) -> None:
        self.router = router
        self.direct = True
        self._watchers: list[Callable[[str | None], None]] = []
        router.on_assign(self._assigned)

    def _assigned(self, routing: bool) -> None:
        self.direct = not routing
        for listener in self._watchers:
            listener(None)

    def _watch(self, own: MessageStore | OffsetStore, listener: Callable[[str | None], None]) -> None:
        self._watchers.append(listener)
        own.watch(listener)

    def _hears(self, own: MessageStore | OffsetStore) -> bool:
        return self.direct and own.hears_every_change


class RoutedStore(_Facade):
    def __init__(self, router: ClusterRouter) -> None:
        super().__init__(router)
        self.own = router.default_store  # the gateway's own store

    @property
    def broker(self) -> str:
        return self.router.broker()

    async def _on(self, topic: str, call: Callable[[MessageStore], Awaitable[T]]) -> T:
        return await self.router.call_topic(topic, call)

    async def open(self) -> None:
        await self.router.default_store.open()

    async def close(self) -> None:
        await self.router.default_store.close()

    async def create_topic(self, config: TopicConfig) -> None:
        if self.direct:
            return await self.own.create_topic(config)
        await self._on(config.name, lambda s: s.create_topic(config))

    async def delete_topic(self, topic: str) -> None:
        if self.direct:
            return await self.own.delete_topic(topic)
        await self._on(topic, lambda s: s.delete_topic(topic))

    def forget_topic(self, topic: str) -> None:
        for store in self.router.opened_stores():
            store.forget_topic(topic)

    def has_topic(self, topic: str) -> bool:
        if self.direct:
            return self.own.has_topic(topic)
        try:
            return self.router.store_for(topic)[0].has_topic(topic)
        except MqgateError:
            return False

    async def append(self, topic: str, queue: int, messages: list[StoredMessage]) -> int:
        if self.direct:
            return await self.own.append(topic, queue, messages)
        return await self._on(topic, lambda s: s.append(topic, queue, messages))

    async def append_many(self, topic: str, batches: dict[int, list[StoredMessage]]) -> dict[int, int]:
        if self.direct:
            return await self.own.append_many(topic, batches)
        return await self._on(topic, lambda s: s.append_many(topic, batches))

    async def append_encoded(self, topic: str, batches: dict[int, list[Encoded]]) -> dict[int, int]:
        if self.direct:
            return await self.own.append_encoded(topic, batches)
        return await self._on(topic, lambda s: s.append_encoded(topic, batches))

    async def append_many_with(
        self,
        topic: str,
        batches: dict[int, list[StoredMessage]],
        companions: Callable[[dict[int, int]], Companions],
    ) -> tuple[dict[int, int], MqgateError | None]:
        if self.direct:
            return await self.own.append_many_with(topic, batches, companions)
        store, cluster, _ = self.router.route_topic(topic)
        if cluster is None:
            return await store.append_many_with(topic, batches, companions)
        # The companions (trace records) live in the gateway's own store, not the cluster's.
        firsts = await self._on(topic, lambda s: s.append_many(topic, batches))
        return firsts, await write_companions(companions(firsts), self.router.default_store.append_encoded)

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]:
        if self.direct:
            return await self.own.read(topic, queue, offset, max_count)
        return await self._on(topic, lambda s: s.read(topic, queue, offset, max_count))

    async def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        if self.direct:
            return await self.own.read_raw(topic, queue, offset, max_count)
        return await self._on(topic, lambda s: s.read_raw(topic, queue, offset, max_count))

    async def bounds(self, topic: str) -> list[QueueBounds]:
        if self.direct:
            return await self.own.bounds(topic)
        return await self._on(topic, lambda s: s.bounds(topic))

    async def bounds_many(self, topics: list[str]) -> list[list[QueueBounds]]:
        if self.direct:
            return await self.own.bounds_many(topics)
        return list(await asyncio.gather(*(self.bounds(topic) for topic in topics)))

    async def queue_bytes(self, topic: str) -> list[int]:
        if self.direct:
            return await self.own.queue_bytes(topic)
        return await self._on(topic, lambda s: s.queue_bytes(topic))

    async def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        if self.direct:
            return await self.own.offset_for_time(topic, queue, timestamp_ms)
        return await self._on(topic, lambda s: s.offset_for_time(topic, queue, timestamp_ms))

    async def wait_for_data(
        self, topic: str, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        # Not guarded: waiting the whole timeout is what it is for.
        if self.direct:
            return await self.own.wait_for_data(topic, timeout_s, reader, recheck_s)
        store, cluster, project = self.router.route_topic(topic)
        await self.router.declared(project, cluster)
        await store.wait_for_data(topic, timeout_s, reader, recheck_s)

    def wake(self, topic: str, *, consumer: str | None = None, count: int | None = None) -> None:
        # The readers of `topic` wait on the store it routes to (a failed cluster's: nobody).
        if self.direct:
            return self.own.wake(topic, consumer=consumer, count=count)
        with contextlib.suppress(MqgateError):
            self.router.store_for(topic)[0].wake(topic, consumer=consumer, count=count)

    def wake_all(self) -> None:
        for store in self.router.opened_stores():
            store.wake_all()

    def watch(self, listener: TopicListener) -> None:
        self._watch(self.own, listener)

    @property
    def hears_every_change(self) -> bool:
        return self._hears(self.own)

    async def enforce_retention(self, now_ms: int) -> int:
        dropped = await self.router.default_store.enforce_retention(now_ms)
        for store in self.router.opened_stores()[1:]:
            with contextlib.suppress(MqgateError):  # a failed cluster: the next round
                dropped += await store.enforce_retention(now_ms)
        return dropped


class RoutedOffsets(_Facade):
    def __init__(self, router: ClusterRouter) -> None:
        super().__init__(router)
        self.own = router.default_offsets  # the gateway's own offset store

    async def _group(self, group: str, call: Callable[[OffsetStore], Awaitable[T]]) -> T:
        return await self.router.call_group(group, call)

    async def _token(self, token: AckToken, call: Callable[[OffsetStore], Awaitable[T]]) -> T:
        offsets, cluster = self.router.offsets_of_token(token)
        return await self.router.call(cluster, lambda: call(offsets))

    async def open(self) -> None:
        await self.router.default_offsets.open()

    async def close(self) -> None:
        await self.router.default_offsets.close()

    async def ensure_table(self, group: str, client_id: str, starts: list[int], now_ms: int) -> bool:
        if self.direct:
            return await self.own.ensure_table(group, client_id, starts, now_ms)
        return await self._group(group, lambda o: o.ensure_table(group, client_id, starts, now_ms))

    async def table(self, group: str, client_id: str) -> list[OffsetEntry] | None:
        if self.direct:
            return await self.own.table(group, client_id)
        return await self._group(group, lambda o: o.table(group, client_id))

    async def clients(self, group: str) -> list[str]:
        if self.direct:
            return await self.own.clients(group)
        return await self._group(group, lambda o: o.clients(group))

    def watch(self, listener: GroupListener) -> None:
        self._watch(self.own, listener)

    @property
    def hears_every_change(self) -> bool:
        return self._hears(self.own)

    @property
    def reads_bounds(self) -> bool:
        return self.direct and self.own.reads_bounds

    async def lease(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        *,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
        read_from: Layout | None = None,
    ) -> Lease | None:
        if self.direct:
            return await self.own.lease(
                group,
                client_id,
                bounds,
                now_ms=now_ms,
                max_count=max_count,
                lock_timeout_ms=lock_timeout_ms,
                max_attempts=max_attempts,
                owner=owner,
                read_from=read_from,
            )
        return await self._group(
            group,
            lambda o: o.lease(
                group,
                client_id,
                bounds,
                now_ms=now_ms,
                max_count=max_count,
                lock_timeout_ms=lock_timeout_ms,
                max_attempts=max_attempts,
                owner=owner,
                read_from=read_from,
            ),
        )

    async def ack_and_lease(
        self,
        token: AckToken,
        group: str,
        client_id: str,
        bounds: list[QueueBounds] | None,
        *,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
        read_from: Layout | None = None,
    ) -> AckedLease:
        lease: dict[str, Any] = {
            "now_ms": now_ms,
            "max_count": max_count,
            "lock_timeout_ms": lock_timeout_ms,
            "max_attempts": max_attempts,
            "owner": owner,
            "read_from": read_from,
        }
        if self.direct:
            return await self.own.ack_and_lease(token, group, client_id, bounds, **lease)
        # The token's cluster may not be the group's: each call goes where it belongs.
        return await ack_then_lease(self, token, group, client_id, bounds, **lease)

    async def ack(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        if self.direct:
            return await self.own.ack(token, now_ms)
        return await self._token(token, lambda o: o.ack(token, now_ms))

    async def release(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        if self.direct:
            return await self.own.release(token, now_ms)
        return await self._token(token, lambda o: o.release(token, now_ms))

    async def extend(self, token: AckToken, now_ms: int, seconds: float) -> AckRefusal | None:
        if self.direct:
            return await self.own.extend(token, now_ms, seconds)
        return await self._token(token, lambda o: o.extend(token, now_ms, seconds))

    async def record_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        if self.direct:
            return await self.own.record_dead_letters(token, count, now_ms)
        return await self._token(token, lambda o: o.record_dead_letters(token, count, now_ms))

    async def add_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        if self.direct:
            return await self.own.add_dead_letters(token, count, now_ms)
        return await self._token(token, lambda o: o.add_dead_letters(token, count, now_ms))

    async def receive(
        self,
        group: str,
        client_id: str,
        bounds: list[QueueBounds],
        *,
        now_ms: int,
        max_count: int,
        visibility_ms: int,
        max_attempts: int,
        window: int,
        first_queue: int,
        ordered: bool = False,
    ) -> list[Received]:
        args: dict[str, Any] = {
            "now_ms": now_ms,
            "max_count": max_count,
            "visibility_ms": visibility_ms,
            "max_attempts": max_attempts,
            "window": window,
            "first_queue": first_queue,
            "ordered": ordered,
        }
        if self.direct:
            return await self.own.receive(group, client_id, bounds, **args)
        return await self._group(group, lambda o: o.receive(group, client_id, bounds, **args))

    async def delete_message(
        self,
        group: str,
        client_id: str,
        queue: int,
        offset: int,
        receives: int,
        first_ms: int,
        now_ms: int,
        *,
        dead_letter: bool = False,
    ) -> MessageOutcome:
        def call(o: OffsetStore) -> Awaitable[MessageOutcome]:
            return o.delete_message(
                group, client_id, queue, offset, receives, first_ms, now_ms, dead_letter=dead_letter
            )

        return await (call(self.own) if self.direct else self._group(group, call))

    async def change_visibility(
        self,
        group: str,
        client_id: str,
        queue: int,
        offset: int,
        receives: int,
        first_ms: int,
        now_ms: int,
        visible_ms: int,
    ) -> MessageOutcome:
        def call(o: OffsetStore) -> Awaitable[MessageOutcome]:
            return o.change_visibility(
                group, client_id, queue, offset, receives, first_ms, now_ms, visible_ms
            )

        return await (call(self.own) if self.direct else self._group(group, call))

    async def receipt_counts(self, group: str, client_id: str, now_ms: int) -> dict[int, tuple[int, int]]:
        if self.direct:
            return await self.own.receipt_counts(group, client_id, now_ms)
        return await self._group(group, lambda o: o.receipt_counts(group, client_id, now_ms))

    async def reset(self, group: str, client_id: str, queue: int, offset: int) -> None:
        if self.direct:
            return await self.own.reset(group, client_id, queue, offset)
        await self._group(group, lambda o: o.reset(group, client_id, queue, offset))

    async def advance(
        self, group: str, client_id: str, offsets: dict[int, int], now_ms: int
    ) -> dict[int, int]:
        if self.direct:
            return await self.own.advance(group, client_id, offsets, now_ms)
        return await self._group(group, lambda o: o.advance(group, client_id, offsets, now_ms))

    async def expire_clients(self, group: str, idle_before_ms: int) -> list[str]:
        if self.direct:
            return await self.own.expire_clients(group, idle_before_ms)
        return await self._group(group, lambda o: o.expire_clients(group, idle_before_ms))

    async def drop_group(self, group: str) -> None:
        await self.router.default_offsets.drop_group(group)
        for offsets in self.router.opened_offsets()[1:]:
            with contextlib.suppress(MqgateError):  # a failed cluster keeps it until retention
                await offsets.drop_group(group)

    async def take_tokens(self, group: str, rate_per_s: float, wanted: int, now_ms: int) -> tuple[int, float]:
        if self.direct:
            return await self.own.take_tokens(group, rate_per_s, wanted, now_ms)
        return await self._group(group, lambda o: o.take_tokens(group, rate_per_s, wanted, now_ms))

    async def return_tokens(self, group: str, rate_per_s: float, count: int) -> None:
        if self.direct:
            return await self.own.return_tokens(group, rate_per_s, count)
        await self._group(group, lambda o: o.return_tokens(group, rate_per_s, count))
