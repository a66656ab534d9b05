"""The offset store of a store process (`mqgate serve --workers N` on the embedded store).

Every call is carried out by the store process's embedded offset store, one journal for every
worker; this adapter keeps a worker's listeners, told of its own moves (as the Redis adapter's:
other workers move offsets too, so `hears_every_change` is False).
"""

from __future__ import annotations

from typing import Any

import msgspec

from mqgate.core.acks import AckRefusal
from mqgate.core.layout import Layout
from mqgate.core.message_window import MessageOutcome, Received
from mqgate.core.tokens import AckToken
from mqgate.model import QueueBounds
from mqgate.offsets.interface import AckedLease, GroupListener, Lease, OffsetEntry, given_bounds
from mqgate.store.backends.embedded.file_span import read_file_span
from mqgate.storeproc.client import StoreClient
from mqgate.storeproc.wire import CONTROL, OFFSETS


class RemoteOffsetStore:
    def __init__(self, client: StoreClient) -> None:
        self._client = client
        self._watchers: list[GroupListener] = []
        client.on_reconnect(lambda: self._moved(None))

    @property
    def hears_every_change(self) -> bool:
        return False

    @property
    def reads_bounds(self) -> bool:
        return True  # the store process has the message store: bounds, lease and read in one call

    def watch(self, listener: GroupListener) -> None:
        self._watchers.append(listener)

    def _moved(self, group: str | None) -> None:
        for listener in self._watchers:
            listener(group)

    async def open(self) -> None:
        await self._client.connect()

    async def close(self) -> None:
        return None

    async def ensure_table(self, group: str, client_id: str, starts: list[int], now_ms: int) -> bool:
        made: bool = await self._client.call(OFFSETS, "ensure_table", group, client_id, starts, now_ms)
        self._moved(group)
        return made

    async def table(self, group: str, client_id: str) -> list[OffsetEntry] | None:
        got: list[OffsetEntry] | None = await self._client.call(OFFSETS, "table", group, client_id)
        return got

    async def clients(self, group: str) -> list[str]:
        got: list[str] = await self._client.call(OFFSETS, "clients", group)
        return got

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
        args = {
            "now_ms": now_ms,
            "max_count": max_count,
            "lock_timeout_ms": lock_timeout_ms,
            "max_attempts": max_attempts,
            "owner": owner,
        }
        if read_from is not None:  # the lease and its batch's records in one round trip
            return _with_records(
                await self._client.call(CONTROL, "lease_read", group, client_id, bounds, read_from, args)
            )
        got: Lease | None = await self._client.call(
            OFFSETS, "lease", group, client_id, given_bounds(bounds), **args
        )
        return got

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
        args = {
            "now_ms": now_ms,
            "max_count": max_count,
            "lock_timeout_ms": lock_timeout_ms,
            "max_attempts": max_attempts,
            "owner": owner,
        }
        # The ack, the bounds, the lease and its batch's records in one round trip.
        refusal, lease, error = await self._client.call(
            CONTROL, "ack_lease_read", token, group, client_id, bounds, read_from, args
        )
        if refusal is None:
            self._moved(token.consumer)
        return AckedLease(refusal, _with_records(lease), error)

    async def _settle(self, what: str, token: AckToken, *args: object) -> AckRefusal | None:
        refusal: AckRefusal | None = await self._client.call(OFFSETS, what, token, *args)
        if refusal is None:
            self._moved(token.consumer)
        return refusal

    async def ack(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        return await self._settle("ack", token, now_ms)

    async def release(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        return await self._settle("release", token, now_ms)

    async def extend(self, token: AckToken, now_ms: int, seconds: float) -> AckRefusal | None:
        got: AckRefusal | None = await self._client.call(OFFSETS, "extend", token, now_ms, seconds)
        return got

    async def record_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        return await self._settle("record_dead_letters", token, count, now_ms)

    async def add_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        return await self._settle("add_dead_letters", token, count, now_ms)

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
        got: list[Received] = await self._client.call(
            OFFSETS,
            "receive",
            group,
            client_id,
            bounds,
            now_ms=now_ms,
            max_count=max_count,
            visibility_ms=visibility_ms,
            max_attempts=max_attempts,
            window=window,
            first_queue=first_queue,
            ordered=ordered,
        )
        if got:
            self._moved(group)
        return got

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
        got: MessageOutcome = await self._client.call(
            OFFSETS,
            "delete_message",
            group,
            client_id,
            queue,
            offset,
            receives,
            first_ms,
            now_ms,
            dead_letter=dead_letter,
        )
        self._moved(group)
        return got

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
        got: MessageOutcome = await self._client.call(
            OFFSETS,
            "change_visibility",
            group,
            client_id,
            queue,
            offset,
            receives,
            first_ms,
            now_ms,
            visible_ms,
        )
        self._moved(group)
        return got

    async def receipt_counts(self, group: str, client_id: str, now_ms: int) -> dict[int, tuple[int, int]]:
        got: dict[int, tuple[int, int]] = await self._client.call(
            OFFSETS, "receipt_counts", group, client_id, now_ms
        )
        return got

    async def reset(self, group: str, client_id: str, queue: int, offset: int) -> None:
        await self._client.call(OFFSETS, "reset", group, client_id, queue, offset)
        self._moved(group)

    async def advance(
        self, group: str, client_id: str, offsets: dict[int, int], now_ms: int
    ) -> dict[int, int]:
        got: dict[int, int] = await self._client.call(OFFSETS, "advance", group, client_id, offsets, now_ms)
        self._moved(group)
        return got

    async def expire_clients(self, group: str, idle_before_ms: int) -> list[str]:
        gone: list[str] = await self._client.call(OFFSETS, "expire_clients", group, idle_before_ms)
        if gone:
            self._moved(group)
        return gone

    async def drop_group(self, group: str) -> None:
        await self._client.call(OFFSETS, "drop_group", group)
        self._moved(group)

    async def take_tokens(self, group: str, rate_per_s: float, wanted: int, now_ms: int) -> tuple[int, float]:
        got: tuple[int, float] = await self._client.call(
            OFFSETS, "take_tokens", group, rate_per_s, wanted, now_ms
        )
        return got

    async def return_tokens(self, group: str, rate_per_s: float, count: int) -> None:
        await self._client.call(OFFSETS, "return_tokens", group, rate_per_s, count)


def _with_records(got: Any) -> Lease | None:
    """A lease as the store process answered it: itself, or (itself, where its records are),
    read here (`FileSpan`); when they do not read back whole, the lease goes without them and
    the caller asks the store process (`MessageStore.read_raw`)."""
    if not isinstance(got, tuple):
        return got  # type: ignore[no-any-return]
    lease: Lease = got[0]
    records = read_file_span(got[1])
    return lease if records is None else msgspec.structs.replace(lease, records=records)
