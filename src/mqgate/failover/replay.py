"""Resending the spool through the active cluster, in order per queue (SPEC P8, E7).

`replay` drains the queues of the spool (of one project, or all): each queue in its own task,
batch after batch, oldest first; a batch is marked "tried", sent with `send`, and marked sent
once `send` returned (the cluster acknowledged it). A failed send stops that queue (its order
must hold) and leaves its records for the next replay; the other queues go on. A send that
raises `NotSent` reached no cluster: its try is taken back (not a possible duplicate). One replay at
a time per queue: a queue being replayed is skipped by a concurrent `replay`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from mqgate.errors import Unavailable
from mqgate.failover.spool import QueueKey, Spool, SpoolRecord

log = logging.getLogger("mqgate.failover")

# Stores a batch for one queue, in order; raises if it was not (all) acknowledged.
Send = Callable[[QueueKey, list[SpoolRecord]], Awaitable[None]]


class NotSent(Unavailable):
    """Raised by a `Send` that gave up before anything reached a cluster (no active cluster
    known, the project not declared there): the batch's try does not count."""


class ReplayResult(msgspec.Struct):
    resent: int = 0
    batches: int = 0
    failed: dict[QueueKey, str] = msgspec.field(default_factory=dict)  # queue -> why it stopped


class Replayer:
    def __init__(self, spool: Spool, *, batch: int = 256, concurrency: int = 8) -> None:
        self.spool = spool
        self.batch = batch
        self.concurrency = concurrency
        self._busy: set[QueueKey] = set()

    async def replay(self, send: Send, project: str | None = None) -> ReplayResult:
        """Resend what is spooled (for `project`, or everything) until it is empty or a send
        fails; records spooled meanwhile for a queue being replayed are resent too."""
        result = ReplayResult()
        limit = asyncio.Semaphore(self.concurrency)

        async def drain(key: QueueKey) -> None:
            async with limit:
                await self._drain(key, send, result)

        keys = [k for k in self.spool.queues(project) if k not in self._busy]
        self._busy.update(keys)
        try:
            await asyncio.gather(*(drain(k) for k in keys))
        finally:
            self._busy.difference_update(keys)
        return result

    async def _drain(self, key: QueueKey, send: Send, result: ReplayResult) -> None:
        spool = self.spool
        while True:
            records = spool.head(key, self.batch)
            if not records:
                return
            seqs = [r.seq for r in records]
            again = spool.begin(seqs)
            try:
                await send(key, records)
            except NotSent as exc:
                spool.untry(seqs, again)
                result.failed[key] = f"{type(exc).__name__}: {exc}"
                log.warning("spool replay of %s waits at seq %d: %s", key, seqs[0], exc)
                return
            except Exception as exc:
                result.failed[key] = f"{type(exc).__name__}: {exc}"
                log.warning("spool replay of %s stopped at seq %d: %s", key, seqs[0], exc)
                return
            await spool.mark_sent(seqs)
            result.resent += len(seqs)
            result.batches += 1
