"""Reading a topic by offset, without locks or commits, and the progress of readers that
track their own position (a Spark job): SPEC D1."""

from __future__ import annotations

from mqgate.errors import BadRequest
from mqgate.model import MODE_CLUSTER, QueueBounds
from mqgate.registry.records import ConsumerRecord
from mqgate.services.consume import Consuming
from mqgate.services.context import Context, now_ms
from mqgate.services.topology import Topology


class LogReading:
    def __init__(self, ctx: Context, topology: Topology, consuming: Consuming) -> None:
        self.ctx = ctx
        self.topology = topology
        self.consuming = consuming
        self.observers = consuming.observers

    async def bounds(self, topic: str) -> list[QueueBounds]:
        """min/max of each of the topic's store queues (every priority lane, in store order)."""
        await self.topology.topic(topic)
        return await self.ctx.store.bounds(topic)

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int, reader: str | None = None
    ) -> tuple[int, list[tuple[int, bytes]]]:
        """Up to `max_count` stored records of one queue from `offset` on: (first offset read,
        records). Retention may have removed older records. `reader`: who reads (a traced
        message's `read` hop names it)."""
        bounds = await self.bounds(topic)
        if not 0 <= queue < len(bounds):
            raise BadRequest(f"queue must be between 0 and {len(bounds) - 1}", field="queue")
        start = max(offset, bounds[queue].min)
        raw = await self.read_within(topic, queue, start, max_count)
        if raw:
            for read in self.observers.read:
                read(topic, queue, raw, reader)
        return (raw[0][0] if raw else start), raw

    async def read_within(
        self, topic: str, queue: int, start: int, max_count: int
    ) -> list[tuple[int, bytes]]:
        """Up to `max_count` records from `start`, stopping before their bytes pass the answer
        budget (`max_answer_bytes`; at least one record), read in chunks sized from what was
        read so far: neither the answer nor the gateway's memory grows with the messages' size."""
        settings = self.ctx.settings
        budget = settings.max_answer_bytes
        out: list[tuple[int, bytes]] = []
        size = 0
        offset = start
        chunk = min(max_count, max(1, budget // settings.max_message_bytes))
        while True:
            got = await self.ctx.store.read_raw(topic, queue, offset, chunk)
            for o, r in got:
                if out and size + len(r) > budget:
                    return out
                out.append((o, r))
                size += len(r)
            if not got or len(out) == max_count:
                return out
            offset = got[-1][0] + 1
            per_record = size / len(out)
            chunk = max(1, min(max_count - len(out), int((budget - size) // per_record)))

    async def commit(self, c: ConsumerRecord, offsets: dict[int, int]) -> dict[int, int]:
        """Raise the committed offsets of `c`'s topic queues (store numbering) to those given,
        never lowering one: the progress of a reader that tracks its own position."""
        if c.mode != MODE_CLUSTER:
            raise BadRequest(f"consumer {c.name} is in {c.mode} mode; commit needs cluster", field="consumer")
        layout = await self.topology.layout(c)
        await self.consuming.ensure_table(c, layout, "")
        bounds = await self.topology.bounds(layout)
        topic_queues = layout.topic_queues
        moves: dict[int, int] = {}
        for q, offset in offsets.items():
            where = f"offsets.{q}"
            if not 0 <= q < topic_queues:
                raise BadRequest(f"topic {c.topic} has queues 0 to {topic_queues - 1}", field=where)
            index = layout.grid.table_index(q)
            if not 0 <= offset <= bounds[index].max:
                raise BadRequest(
                    f"offset must be between 0 and the queue's end {bounds[index].max}", field=where
                )
            moves[index] = offset
        committed = await self.ctx.offsets.advance(c.name, "", moves, now_ms())
        return {q: committed[layout.grid.table_index(q)] for q in offsets}
