"""Long polls waiting on one topic, woken only as many at a time as there is work for.

Waiters queue per reader (a consumer, or a broadcast consumer's client): every reader sees
every message, but one reader's queue can be leased by one pull at a time, so a write to `n`
queues has work for at most `n` pulls of each reader. Waking them all (a thousand long polls
on one consumer) made every produce pay for a thousand lease attempts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

# Any reader (the default of `wait`): waiters that did not say who they read for.
ANY_READER: Final = ("", "")

Reader = tuple[str, str]  # (consumer, client id; "" for a cluster consumer)


class _Queue:
    __slots__ = ("futures", "live", "ticker")

    def __init__(self) -> None:
        self.futures: deque[asyncio.Future[None]] = deque()
        self.live = 0  # futures not done yet; done ones are dropped lazily
        self.ticker: asyncio.TimerHandle | None = None


class TopicWaiters:
    __slots__ = ("_readers", "epoch")

    def __init__(self) -> None:
        self._readers: dict[Reader, _Queue] = {}
        self.epoch = 0  # bumped by every wake, so a reader can tell it missed one

    @property
    def waiting(self) -> int:
        return sum(q.live for q in self._readers.values())

    async def wait(
        self, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        """Return when woken, or after `timeout_s`. With `recheck_s`, the longest waiting
        waiter of `reader` is woken every `recheck_s` (one, not each of them): a lock that
        expires tells no one, so someone must look now and then."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        queue = self._readers.get(reader)
        if queue is None:
            queue = self._readers[reader] = _Queue()
        queue.futures.append(future)
        queue.live += 1
        if recheck_s is not None and queue.ticker is None:
            queue.ticker = loop.call_later(recheck_s, self._tick, reader, queue, recheck_s)
        timer = loop.call_later(timeout_s, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
            if not future.done():
                future.cancel()  # the waiting task was cancelled
            queue.live -= 1
            if queue.live == 0:
                if queue.ticker is not None:
                    queue.ticker.cancel()
                    queue.ticker = None
                if self._readers.get(reader) is queue:
                    del self._readers[reader]
            elif len(queue.futures) > 2 * queue.live + 16:
                # Timed-out waiters stay queued until a wake passes them: drop them now and
                # then, so a topic nobody writes to does not collect them for ever.
                queue.futures = deque(f for f in queue.futures if not f.done())

    def wake(self, count: int | None = None, consumer: str | None = None) -> None:
        """Wake `count` waiters of each reader (all if None), longest waiting first; of
        `consumer`'s readers only, if given. Waiters of ANY_READER are always all woken."""
        self.epoch += 1
        for reader, queue in list(self._readers.items()):
            if reader == ANY_READER:
                _wake(queue, None)
            elif consumer is None or reader[0] == consumer:
                _wake(queue, count)

    def _tick(self, reader: Reader, queue: _Queue, recheck_s: float) -> None:
        queue.ticker = None
        if queue.live > 0:
            _wake(queue, 1)
            queue.ticker = asyncio.get_running_loop().call_later(
                recheck_s, self._tick, reader, queue, recheck_s
            )


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake(queue: _Queue, count: int | None) -> None:
    futures = queue.futures
    woken = 0
    while futures and (count is None or woken < count):
        future = futures.popleft()
        if not future.done():
            future.set_result(None)
            woken += 1
