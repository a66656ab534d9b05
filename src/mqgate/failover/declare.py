"""The steps around a switch (SPEC P8): declare a project on its new cluster, and clean up the
cluster it left once that one is back.

`redeclare` makes a project's topics (every queue of every lane, retention) and its consumers'
side topics (retry, inbox) exist on the target cluster, and the cluster-mode consumers' offset
tables, starting at the beginning of each queue there: everything on the target was produced
for this project after (or around) the switch, so a consumer must get all of it; a table that
exists already (an earlier switch) keeps its offsets. Broadcast clients' tables are made on
their first pull, as anywhere.

`clean_up` works on the cluster a project left, once that one is healthy again. Its "problem
queues" are the queues locked by pulls served before the switch: the gateways that served
them moved on, and such a lock would hold the queue (and the drain of what is left there) for
up to the lock time-out. It releases each lock still held that was taken before `locked_before_ms`
(by compare-and-set on the lock: a lock taken later, by a drain, is left alone; the batch is
delivered again, counted as a new attempt) and reports each consumer's backlog there, so the
caller knows when the cluster is drained and may rejoin the pool. It deletes nothing: messages
and offsets stay until retention, so a fail-back finds the tables where they were.
"""

from __future__ import annotations

import msgspec

from mqgate.core.layout import Layout, inbox_topic, retry_topic
from mqgate.core.queue_choice import lock_is_held
from mqgate.core.tokens import AckToken
from mqgate.model import MODE_BROADCAST, QueueBounds
from mqgate.names import dlq_topic
from mqgate.offsets.interface import OffsetStore
from mqgate.registry.records import ConsumerRecord, Snapshot, TopicRecord
from mqgate.store.interface import MessageStore, TopicConfig


class ProjectTopology(msgspec.Struct, frozen=True):
    project: str
    topics: dict[str, TopicRecord]  # the project's topics and its consumers' dead-letter topics
    consumers: dict[str, ConsumerRecord]


def project_topology(snapshot: Snapshot, project: str) -> ProjectTopology:
    """What of the registry lives on the project's active cluster."""
    topics = {n: t for n, t in snapshot.topics.items() if t.project == project}
    consumers = {n: c for n, c in snapshot.consumers.items() if c.topic in topics}
    for name in consumers:
        dlq = snapshot.topics.get(dlq_topic(name))
        if dlq is not None:
            topics[dlq.name] = dlq
    return ProjectTopology(project, topics, consumers)


class DeclareReport(msgspec.Struct):
    topics: list[str] = msgspec.field(default_factory=list)
    tables_created: list[str] = msgspec.field(default_factory=list)


async def table_bounds(store: MessageStore, layout: Layout) -> list[QueueBounds]:
    """min/max of every queue of a consumer's table, numbered in table order, with its lane
    (as the gateway passes them to `OffsetStore.lease`)."""
    by_topic = {name: await store.bounds(name) for name in {layout.slot(i).topic for i in range(layout.size)}}
    slots = [layout.slot(i) for i in range(layout.size)]
    return [
        QueueBounds(i, by_topic[s.topic][s.queue].min, by_topic[s.topic][s.queue].max, s.lane)
        for i, s in enumerate(slots)
    ]


async def redeclare(
    topology: ProjectTopology, store: MessageStore, offsets: OffsetStore, now_ms: int
) -> DeclareReport:
    """Declare the project on the target cluster (idempotent; safe from several gateways)."""
    report = DeclareReport()
    for t in topology.topics.values():
        await store.create_topic(TopicConfig(t.name, t.store_queues, t.retention_ms, t.retention_bytes))
        report.topics.append(t.name)
    for c in topology.consumers.values():
        t = topology.topics[c.topic]
        for side in (retry_topic(c.name), inbox_topic(c.name)):
            await store.create_topic(TopicConfig(side, 1, t.retention_ms, t.retention_bytes))
            report.topics.append(side)
        if c.mode != MODE_BROADCAST:  # one table (cluster and message mode)
            layout = Layout(c.name, c.topic, t.grid)
            starts = [b.min for b in await table_bounds(store, layout)]
            if await offsets.ensure_table(c.name, "", starts, now_ms):
                report.tables_created.append(c.name)
    return report


async def consumer_backlog(
    topology: ProjectTopology, consumer: str, store: MessageStore, offsets: OffsetStore
) -> int:
    """What `consumer` has not consumed on this cluster: over every client's table, each queue's
    end minus its committed offset (a queue the table does not have yet: from its beginning),
    as the consumer's lag is counted on the active cluster."""
    c = topology.consumers.get(consumer)
    t = None if c is None else topology.topics.get(c.topic)
    if c is None or t is None:
        return 0
    bounds = await table_bounds(store, Layout(c.name, c.topic, t.grid))
    total = 0
    for client in await offsets.clients(c.name):
        table = await offsets.table(c.name, client) or []
        committed = [e.committed for e in table[: len(bounds)]] + [b.min for b in bounds[len(table) :]]
        total += sum(max(0, b.max - max(done, b.min)) for b, done in zip(bounds, committed, strict=True))
    return total


class CleanupReport(msgspec.Struct):
    released: list[tuple[str, str, int]] = msgspec.field(
        default_factory=list
    )  # consumer, client, table index
    refused: list[tuple[str, str, int, str]] = msgspec.field(default_factory=list)  # ... and why
    backlog: dict[tuple[str, str], int] = msgspec.field(
        default_factory=dict
    )  # (consumer, client) -> messages

    @property
    def drained(self) -> bool:
        """Nothing left to consume there: the cluster may rejoin the pool."""
        return not any(self.backlog.values())


async def clean_up(
    topology: ProjectTopology,
    store: MessageStore,
    offsets: OffsetStore,
    *,
    now_ms: int,
    locked_before_ms: int,
) -> CleanupReport:
    """Release the locks taken before `locked_before_ms` (the switch) on the project's tables of
    the cluster it left, and measure what is left to drain there (see the module doc)."""
    report = CleanupReport()
    for c in topology.consumers.values():
        t = topology.topics.get(c.topic)
        if t is None:
            continue
        layout = Layout(c.name, c.topic, t.grid)
        bounds = await table_bounds(store, layout)
        for client in await offsets.clients(c.name):
            table = await offsets.table(c.name, client)
            if table is None:
                continue
            backlog = 0
            for i, entry in enumerate(table[: len(bounds)]):
                backlog += max(0, bounds[i].max - max(entry.committed, bounds[i].min))
                if not lock_is_held(entry.lock_ts, entry.lock_deadline_ms, now_ms):
                    continue
                if entry.lock_ts >= locked_before_ms:
                    continue  # a pull after the switch (a drain): its holder is alive
                end = max(entry.delivered_end, entry.committed)
                token = AckToken(c.name, client, store.broker, i, entry.committed, end, entry.lock_ts)
                refusal = await offsets.release(token, now_ms)
                if refusal is None:
                    report.released.append((c.name, client, i))
                else:
                    report.refused.append((c.name, client, i, refusal))
            report.backlog[c.name, client] = backlog
    return report
