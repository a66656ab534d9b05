"""Draining a cluster a project left (SPEC P8: "the failed cluster's messages are recovered").

When the cluster a project switched away from is healthy again, what its consumers had not
consumed there is delivered through the active cluster: for each consumer, the messages of
every queue of its table from its committed offset to the end are appended to the consumer's
inbox topic on the active cluster (their ids and bodies unchanged), then the consumer's
offsets on the left cluster are raised to that end. Through the inbox only that consumer gets
them, so other consumer groups of the topic see no duplicates.

At-least-once: a drain interrupted between the copy and the raise copies again (same message
ids). A broadcast consumer's clients share its inbox: the copy starts at the lowest committed
offset among them, and the messages some clients had consumed already are counted as
`duplicates`.

Messages resent from a gateway's spool after a send that may have stored them (`skip`: the
ids whose latest resend went to the target cluster) have a copy in the target's topic: their
copy in this cluster's topic (a produce that reached it before its answer was lost) is not
moved (counted in `skipped`), so it is delivered once. Only topic copies are skipped: a copy
in an inbox or retry queue was moved or redelivered there and may be the one left to deliver,
and the latest resend's copy is never skipped, so every message is still delivered at least
once.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from mqgate.core.layout import Layout, inbox_topic
from mqgate.failover.declare import ProjectTopology, table_bounds
from mqgate.model import decode_stored
from mqgate.offsets.interface import OffsetStore
from mqgate.store.interface import Encoded, MessageStore

BATCH = 500


class DrainReport(msgspec.Struct):
    moved: dict[str, int] = msgspec.field(default_factory=dict)  # consumer -> messages copied
    duplicates: int = 0
    skipped: int = 0  # copies not moved: the message was resent to the active cluster

    @property
    def total(self) -> int:
        return sum(self.moved.values())


async def drain_backlog(
    topology: ProjectTopology,
    source_store: MessageStore,
    source_offsets: OffsetStore,
    target_store: MessageStore,
    now_ms: int,
    skip: Collection[str] = frozenset(),
) -> DrainReport:
    report = DrainReport()
    for c in topology.consumers.values():
        t = topology.topics.get(c.topic)
        if t is None:
            continue
        layout = Layout(c.name, c.topic, t.grid)
        bounds = await table_bounds(source_store, layout)
        tables = {}
        for client in await source_offsets.clients(c.name):
            table = await source_offsets.table(c.name, client)
            if table:
                tables[client] = table
        ends: dict[int, int] = {}
        for i, b in enumerate(bounds):
            committed = [max(tb[i].committed, b.min) for tb in tables.values() if len(tb) > i]
            if not committed or min(committed) >= b.max:
                continue
            start = min(committed)
            report.duplicates += sum(x - start for x in committed)
            slot = layout.slot(i)
            offset = start
            while offset < b.max:
                raw = await source_store.read_raw(slot.topic, slot.queue, offset, min(BATCH, b.max - offset))
                if not raw:
                    break
                encoded: list[Encoded] = []
                for _, r in raw:
                    m = decode_stored(r)
                    if slot.topic == c.topic and m.msg_id in skip:
                        report.skipped += 1
                    else:
                        encoded.append((m.timestamp_ms, r))
                if encoded:
                    await target_store.append_encoded(inbox_topic(c.name), {0: encoded})
                    report.moved[c.name] = report.moved.get(c.name, 0) + len(encoded)
                offset = raw[-1][0] + 1
            ends[i] = offset
        if ends:
            for client in tables:
                await source_offsets.advance(c.name, client, ends, now_ms)
    return report
