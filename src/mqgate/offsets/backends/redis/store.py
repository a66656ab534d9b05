"""The consumer-group table in Redis, shared by every gateway that uses the same Redis.

Each step that reads and then writes is one Lua script, so it is atomic against every other
gateway; the key layout and each script's KEYS/ARGV are in README.md. Times always come from
the caller (`now_ms`), never from the Redis clock, exactly as in the embedded backend.
Durable as far as Redis persistence is configured (appendonly yes, appendfsync always).
"""

from __future__ import annotations

from typing import Any, Final

from mqgate.core.acks import ALREADY_ACKED, LOCK_EXPIRED, LOCK_TAKEN, OFFSET_MOVED, AckRefusal
from mqgate.core.layout import Layout
from mqgate.core.message_window import (
    ALREADY,
    CHANGED,
    DELETED,
    NOT_IN_FLIGHT,
    STALE,
    MessageOutcome,
    Received,
)
from mqgate.core.tokens import AckToken
from mqgate.errors import NotFound
from mqgate.model import QueueBounds
from mqgate.offsets.interface import (
    AckedLease,
    GroupListener,
    Lease,
    OffsetEntry,
    ack_then_lease,
    given_bounds,
)
from mqgate.redisio import RedisClient, ReplicaWait, register, run_script, translated

PACKAGE: Final = "mqgate.offsets.backends.redis"
SCRIPTS: Final = (
    "ensure_table",
    "lease",
    "settle",
    "ack_lease",
    "reset",
    "advance",
    "expire_clients",
    "rate",
    "drop_group",
    "receive",
    "settle_message",
)
NO_TABLE: Final = -1
MISMATCH: Final = -2
_REFUSALS: Final[dict[str, AckRefusal]] = {
    r: r for r in (LOCK_EXPIRED, LOCK_TAKEN, OFFSET_MOVED, ALREADY_ACKED)
}

_OUTCOMES: Final[dict[str, MessageOutcome]] = {
    o: o for o in (DELETED, ALREADY, STALE, CHANGED, NOT_IN_FLIGHT)
}

# Hash field suffix -> OffsetEntry attribute; a missing field is the attribute's default.
_FIELDS: Final = {
    "committed": "committed",
    "lock_ts": "lock_ts",
    "lock_deadline": "lock_deadline_ms",
    "owner": "lock_owner",
    "access": "last_access_ms",
    "attempts": "attempts",
    "delivered_end": "delivered_end",
    "dead": "dead_lettered",
    "acked": "acked_lock_ts",
    "first": "first_lock_ts",
}


class RedisOffsetStore:
    def __init__(
        self, client: RedisClient, *, broker: str, prefix: str = "mq", wait: ReplicaWait | None = None
    ) -> None:
        self.client = client
        self._wait = wait  # commits (acks) wait for replicas when set
        self.broker = broker
        self.prefix = prefix
        self._scripts: dict[str, Any] = {}
        self._watchers: list[GroupListener] = []

    async def open(self) -> None:
        # Scripts load on first use (EVALSHA, reloaded after NOSCRIPT): opening needs no Redis.
        for name in SCRIPTS:
            self._scripts[name] = register(self.client, PACKAGE, f"{name}.lua")

    async def close(self) -> None:
        """The client belongs to the app (other adapters share it): nothing to close here."""

    # --- keys (one hash tag per group: every script's keys live in one cluster slot) -------

    def _group(self, group: str) -> str:
        return f"{self.prefix}:{{g:{group}}}"

    def _table_key(self, group: str, client_id: str) -> str:
        base = f"{self._group(group)}:o"
        return f"{base}:{client_id}" if client_id else base

    def _clients_key(self, group: str) -> str:
        return f"{self._group(group)}:clients"

    def _rate_key(self, group: str) -> str:
        return f"{self._group(group)}:rate"

    def _receipt_keys(self, group: str, client_id: str) -> list[str]:
        """A message-level consumer's receipts hash and visibility zset."""
        suffix = f":{client_id}" if client_id else ""
        return [f"{self._group(group)}:m{suffix}", f"{self._group(group)}:mv{suffix}"]

    async def _run(
        self, what: str, script: str, keys: list[str], args: list[Any], wait: ReplicaWait | None = None
    ) -> Any:
        with translated(what):
            return await run_script(self.client, self._scripts[script], keys, args, wait)

    # --- tables -------------------------------------------------------------------------

    async def ensure_table(self, group: str, client_id: str, starts: list[int], now_ms: int) -> bool:
        keys = [self._table_key(group, client_id), self._clients_key(group)]
        created = await self._run(
            "ensure offset table", "ensure_table", keys, [self.broker, client_id, now_ms, *starts]
        )
        self._moved(group)
        return bool(created)

    async def table(self, group: str, client_id: str) -> list[OffsetEntry] | None:
        with translated("read offset table"):
            raw = await self.client.hgetall(self._table_key(group, client_id))
        if not raw:
            return None
        fields = {_text(k): v for k, v in raw.items()}
        entries = []
        for q in range(int(fields["n"])):
            values: dict[str, Any] = {}
            for suffix, attr in _FIELDS.items():
                value = fields.get(f"{self.broker}:{q}:{suffix}")
                if value is not None:
                    values[attr] = _text(value) if attr == "lock_owner" else int(value)
            entries.append(OffsetEntry(**values))
        return entries

    async def clients(self, group: str) -> list[str]:
        with translated("list offset clients"):
            members = await self.client.zrange(self._clients_key(group), 0, -1)
        return sorted(_text(m) for m in members)

    def watch(self, listener: GroupListener) -> None:
        """Listeners hear this gateway's moves only: other gateways commit to the same keys
        (`hears_every_change` is False)."""
        self._watchers.append(listener)

    @property
    def reads_bounds(self) -> bool:
        return False

    @property
    def hears_every_change(self) -> bool:
        return False

    def _moved(self, group: str) -> None:
        for listener in self._watchers:
            listener(group)

    # --- leasing ------------------------------------------------------------------------

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
        args = self._lease_args(client_id, bounds, now_ms, max_count, lock_timeout_ms, max_attempts, owner)
        keys = [self._table_key(group, client_id), self._clients_key(group)]
        got = await self._run("lease a queue", "lease", keys, args)
        return _lease(got, group, client_id, bounds)

    def _lease_args(
        self,
        client_id: str,
        bounds: list[QueueBounds] | None,
        now_ms: int,
        max_count: int,
        lock_timeout_ms: int,
        max_attempts: int,
        owner: str,
    ) -> list[Any]:
        args: list[Any] = [now_ms, max_count, lock_timeout_ms, max_attempts, owner, client_id, self.broker]
        for i, b in enumerate(given_bounds(bounds)):
            if b.queue != i:
                raise ValueError(f"bounds[{i}] is queue {b.queue}: bounds must be in queue order")
            args += (b.min, b.max, b.lane)
        return args

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
        }
        # Two tables: two calls. With a replica wait, the ack's wait must fail before a lease is
        # taken (a lease the pull never answers stays locked until its timeout): two calls.
        if (token.consumer, token.client_id) != (group, client_id) or self._wait is not None:
            return await ack_then_lease(self, token, group, client_id, bounds, **lease)
        ack = self._settle_args(token, now_ms, "commit", token.next_offset)
        args = self._lease_args(client_id, bounds, now_ms, max_count, lock_timeout_ms, max_attempts, owner)
        keys = [self._table_key(group, client_id), self._clients_key(group)]
        got = await self._run("ack and lease", "ack_lease", keys, [*ack, *args])
        if got == NO_TABLE:
            raise _no_table(group, client_id)
        acked, leased = got
        if acked is None:
            self._moved(group)
        refusal = None if acked is None else _REFUSALS[_text(acked)]
        try:
            return AckedLease(refusal, _lease(leased, group, client_id, bounds))
        except ValueError as exc:  # bounds that do not match the table: the ack is done
            return AckedLease(refusal, None, exc)

    async def _settle(
        self, what: str, token: AckToken, now_ms: int, op: str, value: int = 0, dead: int = 0
    ) -> AckRefusal | None:
        keys = [self._table_key(token.consumer, token.client_id), self._clients_key(token.consumer)]
        # A commit that a failover loses would deliver its batch again: commits wait.
        wait = self._wait if op in ("commit", "dead") else None
        got = await self._run(what, "settle", keys, self._settle_args(token, now_ms, op, value, dead), wait)
        if got is None:
            if op in ("commit", "dead"):
                self._moved(token.consumer)
            return None
        if got == NO_TABLE:
            raise _no_table(token.consumer, token.client_id)
        return _REFUSALS[_text(got)]

    @staticmethod
    def _settle_args(token: AckToken, now_ms: int, op: str, value: int = 0, dead: int = 0) -> list[Any]:
        """settle_batch.lua's arguments (settle.lua, ack_lease.lua)."""
        return [
            op,
            token.broker,
            token.queue,
            token.offset,
            token.lock_ts,
            now_ms,
            value,
            dead,
            token.client_id,
        ]

    async def ack(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        return await self._settle("ack", token, now_ms, "commit", token.next_offset)

    async def record_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        return await self._settle("record dead letters", token, now_ms, "dead", token.next_offset, count)

    async def add_dead_letters(self, token: AckToken, count: int, now_ms: int) -> AckRefusal | None:
        return await self._settle("count dead letters", token, now_ms, "count", 0, count)

    async def release(self, token: AckToken, now_ms: int) -> AckRefusal | None:
        return await self._settle("release", token, now_ms, "release")

    async def extend(self, token: AckToken, now_ms: int, seconds: float) -> AckRefusal | None:
        return await self._settle("extend", token, now_ms, "extend", now_ms + int(seconds * 1000))

    # --- message-level mode (core/message_window.py; receive.lua, settle_message.lua) -----

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
        n = len(bounds)
        order = [bounds[(first_queue + i) % n] for i in range(n)]
        args: list[Any] = [
            now_ms, max_count, visibility_ms, max_attempts, window, client_id, self.broker, int(ordered)
        ]  # fmt: skip
        for b in order:
            args += (b.queue, b.min, b.max)
        keys = [
            self._table_key(group, client_id),
            self._clients_key(group),
            *self._receipt_keys(group, client_id),
        ]
        got = await self._run("receive messages", "receive", keys, args, self._wait)
        if got == NO_TABLE:
            raise _no_table(group, client_id)
        if got and got[0] == MISMATCH:
            raise ValueError(f"a queue of the bounds is not in the table of {got[1]} queues")
        self._moved(group)
        return [
            Received(int(got[i]), int(got[i + 1]), int(got[i + 2]), int(got[i + 3]), bool(int(got[i + 4])))
            for i in range(0, len(got), 5)
        ]

    async def _settle_message(self, what: str, group: str, client_id: str, args: list[Any]) -> MessageOutcome:
        keys = [self._table_key(group, client_id), *self._receipt_keys(group, client_id)]
        got = await self._run(what, "settle_message", keys, [*args[:1], self.broker, *args[1:]], self._wait)
        if got == NO_TABLE:
            raise _no_table(group, client_id)
        if got == MISMATCH:
            raise NotFound(f"queue {args[1]} is not a queue of consumer {group}", field="receiptHandle")
        outcome = _OUTCOMES[_text(got)]
        if outcome == DELETED:
            self._moved(group)
        return outcome

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
        args = ["delete", queue, offset, receives, first_ms, now_ms, 1 if dead_letter else 0]
        return await self._settle_message("delete a message", group, client_id, args)

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
        args = ["visibility", queue, offset, receives, first_ms, now_ms, visible_ms]
        return await self._settle_message("change a message's visibility", group, client_id, args)

    async def receipt_counts(self, group: str, client_id: str, now_ms: int) -> dict[int, tuple[int, int]]:
        # The receipts hash holds `<q>:<offset>` → `d` (deleted, waiting for the ones before it:
        # always past the committed offset) or `<visible ms>:<receives>:<first ms>`; `<q>:end` too.
        with translated("count message receipts"):
            raw = await self.client.hgetall(self._receipt_keys(group, client_id)[0])
        counts: dict[int, tuple[int, int]] = {}
        for name, value in raw.items():
            queue, _, offset = _text(name).partition(":")
            if offset == "end" or not queue.isdigit():
                continue
            hidden, deleted = counts.get(int(queue), (0, 0))
            text = _text(value)
            if text == "d":
                deleted += 1
            elif int(text.split(":", 1)[0]) > now_ms:
                hidden += 1
            counts[int(queue)] = (hidden, deleted)
        return counts

    async def reset(self, group: str, client_id: str, queue: int, offset: int) -> None:
        keys = [self._table_key(group, client_id), *self._receipt_keys(group, client_id)]
        got = await self._run("reset offset", "reset", keys, [self.broker, queue, offset])
        self._moved(group)
        if got == NO_TABLE:
            raise _no_table(group, client_id)
        if got == MISMATCH:
            raise IndexError(f"queue {queue} is not in the offset table of {group} client {client_id!r}")

    async def advance(
        self, group: str, client_id: str, offsets: dict[int, int], now_ms: int
    ) -> dict[int, int]:
        pairs = [x for q, o in offsets.items() for x in (q, o)]
        keys = [self._table_key(group, client_id), *self._receipt_keys(group, client_id)]
        got = await self._run("advance offsets", "advance", keys, [self.broker, *pairs])
        self._moved(group)
        if got == NO_TABLE:
            raise _no_table(group, client_id)
        if got == MISMATCH:
            raise IndexError(f"a queue of {sorted(offsets)} is not in the offset table of {group}")
        return {q: int(c) for q, c in zip(offsets, got, strict=True)}

    async def expire_clients(self, group: str, idle_before_ms: int) -> list[str]:
        clients_key = self._clients_key(group)
        with translated("find idle clients"):
            members = await self.client.zrangebyscore(clients_key, "-inf", f"({idle_before_ms}")
        idle = [c for c in map(_text, members) if c]  # the cluster table never expires
        if not idle:
            return []
        keys = [clients_key, *(self._table_key(group, c) for c in idle)]
        gone = await self._run("expire clients", "expire_clients", keys, [idle_before_ms, *idle])
        if gone:
            self._moved(group)
        return sorted(_text(c) for c in gone)

    async def drop_group(self, group: str) -> None:
        clients_key = self._clients_key(group)
        with translated("list offset clients"):
            clients = [_text(m) for m in await self.client.zrange(clients_key, 0, -1)]
        keys = [clients_key, self._rate_key(group), *(self._table_key(group, c) for c in clients)]
        keys += [k for c in clients for k in self._receipt_keys(group, c)]
        await self._run("drop group", "drop_group", keys, clients)
        self._moved(group)

    # --- rate limit (one bucket per group in Redis, shared by every gateway) -------------

    async def take_tokens(self, group: str, rate_per_s: float, wanted: int, now_ms: int) -> tuple[int, float]:
        args = ["take", rate_per_s, wanted, now_ms]
        granted, retry = await self._run("take rate tokens", "rate", [self._rate_key(group)], args)
        return int(granted), float(retry)

    async def return_tokens(self, group: str, rate_per_s: float, count: int) -> None:
        args = ["return", rate_per_s, count, 0]
        await self._run("return rate tokens", "rate", [self._rate_key(group)], args)


def _lease(got: Any, group: str, client_id: str, bounds: list[QueueBounds] | None) -> Lease | None:
    """lease_queue.lua's answer."""
    if got is None:
        return None
    if got == NO_TABLE:
        raise _no_table(group, client_id)
    if got[0] == MISMATCH:
        raise ValueError(f"{len(given_bounds(bounds))} queue bounds for a table of {got[1]} queues")
    queue, offset, next_offset, lock_ts, attempts, dead, first = got
    return Lease(queue, offset, next_offset, lock_ts, attempts, bool(dead), first_lock_ts=first)


def _no_table(group: str, client_id: str) -> NotFound:
    return NotFound(f"no offsets for consumer {group} client {client_id!r}", field="consumer")


def _text(value: Any) -> str:
    # The client is shared: it may or may not have been made with decode_responses.
    return value.decode() if isinstance(value, bytes) else str(value)
