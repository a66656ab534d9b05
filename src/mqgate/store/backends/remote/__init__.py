"""The message store of a store process (`mqgate serve --workers N` on the embedded store).

Every call is carried out by the store process's embedded store; this adapter keeps what is
a worker's own: its listeners (told of its own moves, as the Redis adapter's: other workers
write too, so `hears_every_change` is False), which topics it has seen, and its long polls
(`wake_all` ends them here, at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mqgate.errors import MqgateError, Unavailable
from mqgate.model import QueueBounds, StoredMessage, encode_stored
from mqgate.store.interface import Companions, Encoded, TopicConfig, TopicListener, write_companions
from mqgate.store.waiters import ANY_READER, Reader
from mqgate.storeproc.client import StoreClient
from mqgate.storeproc.wire import CONTROL, STORE


class RemoteStore:
    def __init__(self, client: StoreClient, broker: str) -> None:
        self._client = client
        self._broker = broker
        self._topics: set[str] = set()
        self._watchers: list[TopicListener] = []
        self._woken: asyncio.Future[None] | None = None
        self._bounds_batch: list[tuple[str, asyncio.Future[list[QueueBounds]]]] | None = None
        client.on_reconnect(lambda: self._moved(None))

    @property
    def broker(self) -> str:
        return self._broker

    @property
    def hears_every_change(self) -> bool:
        return False

    async def open(self) -> None:
        self._topics = set(await self._client.call(CONTROL, "topics"))

    async def close(self) -> None:
        self.wake_all()

    async def create_topic(self, config: TopicConfig) -> None:
        await self._client.call(STORE, "create_topic", config)
        self._topics.add(config.name)
        self._moved(config.name)

    async def delete_topic(self, topic: str) -> None:
        await self._client.call(STORE, "delete_topic", topic)
        self.forget_topic(topic)

    def forget_topic(self, topic: str) -> None:
        self._topics.discard(topic)
        self._moved(topic)

    def has_topic(self, topic: str) -> bool:
        return topic in self._topics

    async def append(self, topic: str, queue: int, messages: list[StoredMessage]) -> int:
        return (await self.append_many(topic, {queue: messages}))[queue]

    async def append_many(self, topic: str, batches: dict[int, list[StoredMessage]]) -> dict[int, int]:
        # Encoded here, as the store would: the worker's CPU, not the store process's, and
        # bytes travel at a fraction of the pickled messages' cost.
        return await self.append_encoded(
            topic, {q: [(m.timestamp_ms, encode_stored(m)) for m in msgs] for q, msgs in batches.items()}
        )

    async def append_encoded(self, topic: str, batches: dict[int, list[Encoded]]) -> dict[int, int]:
        firsts: dict[int, int] = await self._client.call(STORE, "append_encoded", topic, batches)
        self._moved(topic)
        return firsts

    async def append_many_with(
        self,
        topic: str,
        batches: dict[int, list[StoredMessage]],
        companions: Callable[[dict[int, int]], Companions],
    ) -> tuple[dict[int, int], MqgateError | None]:
        # The companions are made from the offsets, here: a second call, not one shared wait.
        firsts = await self.append_many(topic, batches)
        return firsts, await write_companions(companions(firsts), self.append_encoded)

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]:
        got: list[tuple[int, StoredMessage]] = await self._client.call(
            STORE, "read", topic, queue, offset, max_count
        )
        return got

    async def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = await self._client.call(
            STORE, "read_raw", topic, queue, offset, max_count
        )
        return got

    async def bounds(self, topic: str) -> list[QueueBounds]:
        return await self._ask_bounds(topic)

    async def bounds_many(self, topics: list[str]) -> list[list[QueueBounds]]:
        # Futures only, no task: gather collects them (and their errors, all retrieved).
        return list(await asyncio.gather(*(self._ask_bounds(topic) for topic in topics)))

    def _ask_bounds(self, topic: str) -> asyncio.Future[list[QueueBounds]]:
        # A pull asks for three topics' bounds at once (its topic, retry queue and inbox), and
        # concurrent pulls for theirs: the asks of one turn of the loop travel as one call.
        batch = self._bounds_batch
        if batch is None:
            batch = self._bounds_batch = []
            asyncio.get_running_loop().call_soon(self._send_bounds)
        future: asyncio.Future[list[QueueBounds]] = asyncio.get_running_loop().create_future()
        batch.append((topic, future))
        return future

    def _send_bounds(self) -> None:
        batch, self._bounds_batch = self._bounds_batch or [], None
        topics = list(dict.fromkeys(topic for topic, _ in batch))
        answer = asyncio.ensure_future(self._client.started(CONTROL, "bounds", topics))

        def answered(done: asyncio.Future[list[list[QueueBounds] | MqgateError]]) -> None:
            error = None if done.cancelled() else done.exception()
            by_topic = {} if error else dict(zip(topics, done.result(), strict=True))
            for topic, future in batch:
                if future.done():
                    continue  # its caller was cancelled
                got = by_topic.get(topic, error)
                if isinstance(got, BaseException) or got is None:
                    future.set_exception(got or Unavailable("the store process did not answer"))
                else:
                    future.set_result(got)

        answer.add_done_callback(answered)

    async def queue_bytes(self, topic: str) -> list[int]:
        got: list[int] = await self._client.call(STORE, "queue_bytes", topic)
        return got

    async def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        got: int = await self._client.call(STORE, "offset_for_time", topic, queue, timestamp_ms)
        return got

    async def wait_for_data(
        self, topic: str, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        woken = self._woken
        if woken is None or woken.done():
            woken = self._woken = asyncio.get_running_loop().create_future()
        # Asked before this returns to its caller: a wake-up sent after it reaches it.
        waiting = asyncio.ensure_future(
            self._client.started(STORE, "wait_for_data", topic, timeout_s, reader, recheck_s)
        )
        try:
            await asyncio.wait((waiting, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()  # woken here (shutdown), or this poll was cancelled
        if waiting.done() and not waiting.cancelled():
            waiting.result()  # the store process's error, if any

    def wake(self, topic: str, *, consumer: str | None = None, count: int | None = None) -> None:
        self._client.send(STORE, "wake", topic, consumer=consumer, count=count)

    def wake_all(self) -> None:
        """This worker's long polls return now; the other workers' go on waiting."""
        woken, self._woken = self._woken, None
        if woken is not None and not woken.done():
            woken.set_result(None)

    def watch(self, listener: TopicListener) -> None:
        self._watchers.append(listener)

    def _moved(self, topic: str | None) -> None:
        for listener in self._watchers:
            listener(topic)

    async def enforce_retention(self, now_ms: int) -> int:
        dropped: int = await self._client.call(STORE, "enforce_retention", now_ms)
        if dropped:
            self._moved(None)
        return dropped
