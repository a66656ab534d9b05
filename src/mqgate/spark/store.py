"""Reading the Redis message store directly (option `store=redis://...`), without a gateway.

The key layout and the offset <-> stream-ID mapping belong to the store
(mqgate.store.backends.redis); this module drives that store's own `bounds` and `read_raw`
from a private event loop, so a Spark task can call it synchronously.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from mqgate.redisio import connect
from mqgate.spark.offsets import Bounds
from mqgate.store.backends.redis.store import RedisStore

T = TypeVar("T")


class StoreReader:
    def __init__(self, url: str, prefix: str, broker: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = connect(url)
        self._store = RedisStore(self._client, broker=broker, prefix=prefix)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        try:
            self._run(self._client.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bounds(self, topic: str) -> list[Bounds]:
        return [Bounds(b.queue, b.min, b.max) for b in self._run(self._store.bounds(topic))]

    def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        """Up to `max_count` (offset, stored JSON) records from `offset` (or the oldest)."""
        return self._run(self._store.read_raw(topic, queue, offset, max_count))
