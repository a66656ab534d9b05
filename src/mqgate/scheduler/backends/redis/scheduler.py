"""The scheduler in Redis, shared by every gateway that uses the same Redis and name.

Each change is one Lua script, so it is atomic against every other gateway: a destination is
claimed by one gateway at a time. Key layout and each script's KEYS/ARGV are in README.md.
Times always come from the caller (`now_ms`), never from the Redis clock, as in the embedded
backend. Durable as far as Redis persistence is configured (appendonly yes, appendfsync
always); the group commit's fsync mode does not apply here.

A hold that brings the earliest start forward publishes on a wake channel;
`wait` listens on it, so a delivery loop sleeping in any gateway wakes up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from mqgate.core.scheduling import TIME_BITS, is_expired
from mqgate.redisio import RedisClient, ReplicaWait, register, run_script, subscriber, translated
from mqgate.scheduler.interface import Destination, Due, SchedulerStats, check_destinations

PACKAGE: Final = "mqgate.scheduler.backends.redis"
SCRIPTS: Final = ("hold", "claim", "settle", "forget")
# Order matters: the scripts address the keys by position (common.lua).
KEY_NAMES: Final = (
    "seq", "msg", "dst", "left", "due", "ready", "claims", "tries", "targets", "once", "once_until"
)  # fmt: skip
# How long a hold key is kept when nobody forgets it (a gateway that died before its commit).
KEEP_KEYS_MS: Final = 24 * 3_600_000
# Members moved per claim script call: bounds how long one call blocks Redis.
MOVE_CAP: Final = 5_000
_SEQ_DIGITS: Final = 15

_encode = msgspec.msgpack.Encoder().encode
_decode_destination = msgspec.msgpack.Decoder(Destination).decode


def member(seq: int, index: int) -> str:
    return f"{seq:0{_SEQ_DIGITS}d}:{index:05d}"


def parse_member(raw: bytes) -> tuple[int, int]:
    return int(raw[:_SEQ_DIGITS]), int(raw[_SEQ_DIGITS + 1 :])


class RedisScheduler:
    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "mq",
        name: str = "default",
        wait: ReplicaWait | None = None,
        keep_keys_ms: int = KEEP_KEYS_MS,
    ) -> None:
        self.client = client
        self._wait = wait  # holds (accepted produces) wait for replicas when set
        self._keep_keys_ms = keep_keys_ms  # hold keys nobody forgets go after this
        base = f"{prefix}:{{s:{name}}}"
        self.keys = [f"{base}:{k}" for k in KEY_NAMES]
        self.channel = f"{base}:wake"
        self._scripts: dict[str, Any] = {}
        self._pubsub: PubSub | None = None
        self._pubsub_client: aioredis.Redis | None = None  # a cluster's: ours to close

    async def open(self) -> None:
        # Scripts load on first use (EVALSHA, reloaded after NOSCRIPT): opening needs no Redis.
        for name in SCRIPTS:
            self._scripts[name] = register(self.client, PACKAGE, f"{name}.lua")

    async def close(self) -> None:
        """The client belongs to the app; only the wake subscription is ours."""
        await self._drop_subscription()

    async def _run(self, what: str, script: str, args: list[Any], wait: ReplicaWait | None = None) -> Any:
        with translated(what):
            return await run_script(self.client, self._scripts[script], self.keys, args, wait)

    # --- intake and delivery --------------------------------------------------------------

    async def hold(
        self, items: list[tuple[bytes, list[Destination]]], keys: list[str] | None = None
    ) -> list[int]:
        if not items:
            return []
        if keys is not None and len(keys) != len(items):
            raise ValueError(f"{len(keys)} hold keys for {len(items)} messages")
        now = int(time.time() * 1000)
        args: list[Any] = [self.channel, len(items), now, now + self._keep_keys_ms]
        for i, (payload, dests) in enumerate(items):
            check_destinations(dests)
            args += [keys[i] if keys is not None else "", payload, len(dests)]
            for d in dests:
                args += [_encode(d), d.deliver_at_ms, d.target]
        got = await self._run("schedule hold", "hold", args, self._wait)
        first = int(got[0])
        seqs = list(range(first, first + len(items)))
        for i in range(1, len(got), 2):  # held before, under the same key
            seqs[int(got[i])] = int(got[i + 1])
        return seqs

    async def forget(self, keys: list[str]) -> None:
        if keys:
            await self._run("schedule forget", "forget", list(keys))

    async def claim_due(self, now_ms: int, limit: int, claim_ms: int) -> list[Due]:
        args = [now_ms, limit, now_ms + claim_ms, MOVE_CAP]
        while True:  # each round moves MOVE_CAP members: the backlog shrinks to nothing
            res = await self._run("schedule claim", "claim", args)
            if int(res[0]) == 0:
                break
        out = []
        for i in range(1, len(res), 4):
            seq, index = parse_member(res[i])
            d = _decode_destination(res[i + 2])
            out.append(Due(seq, index, res[i + 1], d, is_expired(d.deadline_ms, now_ms), int(res[i + 3])))
        return out

    async def settle(self, done: list[tuple[int, int]]) -> None:
        if done:
            await self._run("schedule settle", "settle", [v for pair in done for v in pair])

    async def next_due_ms(self) -> int | None:
        await self._drain_wakes()  # what they announced is in the answer below
        with translated("schedule next due"):
            async with self.client.pipeline(transaction=False) as pipe:
                for key in (self.keys[4], self.keys[5], self.keys[6]):  # due, ready, claims
                    pipe.zrange(key, 0, 0, withscores=True)
                due, ready, claims = await pipe.execute()
        times = [int(due[0][1])] if due else []
        if ready:  # due already; the rank's low bits are the start
            times.append(int(ready[0][1]) % (1 << TIME_BITS))
        if claims:
            times.append(int(claims[0][1]))
        return min(times) if times else None

    # --- waiting --------------------------------------------------------------------------

    async def _subscription(self) -> PubSub:
        if self._pubsub is None:
            pubsub, own = subscriber(self.client, ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
            except BaseException:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                if own is not None:
                    await own.aclose()
                raise
            self._pubsub, self._pubsub_client = pubsub, own
        return self._pubsub

    async def _drop_subscription(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        own, self._pubsub_client = self._pubsub_client, None
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        if own is not None:
            with contextlib.suppress(RedisError, OSError):
                await own.aclose()

    async def _drain_wakes(self) -> None:
        try:
            pubsub = await self._subscription()
            while await pubsub.get_message(ignore_subscribe_messages=True, timeout=0) is not None:
                pass
        except (RedisError, OSError):
            await self._drop_subscription()

    async def wait(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        try:
            pubsub = await self._subscription()
            while (remaining := deadline - loop.time()) > 0:
                if await pubsub.get_message(ignore_subscribe_messages=True, timeout=remaining) is not None:
                    return
        except (RedisError, OSError):
            # No wake-ups without Redis: sleep it out; the next claim reports the failure.
            await self._drop_subscription()
            await asyncio.sleep(max(deadline - loop.time(), 0.0))

    async def held_for(self, target: str) -> int:
        with translated("schedule count"):
            count = await self.client.hget(self.keys[8], target)
        return max(int(count or 0), 0)

    async def stats(self) -> SchedulerStats:
        with translated("schedule stats"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hlen(self.keys[1])
                pipe.hlen(self.keys[2])
                pipe.zcard(self.keys[6])
                messages, destinations, claimed = await pipe.execute()
        return SchedulerStats(held_messages=messages, held_destinations=destinations, claimed=claimed)
