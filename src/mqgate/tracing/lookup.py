"""The answer to "where is message X?" (SPEC P6): its traced path, and for every consumer of
its topic the message's state derived from the offsets, also where no hop was traced for that
consumer (as MQCloud's track view does)."""

from __future__ import annotations

import msgspec

from mqgate.core.queue_choice import lock_is_held
from mqgate.errors import MqgateError
from mqgate.model import MODE_BROADCAST
from mqgate.services.context import Context, now_ms
from mqgate.services.topology import Topology
from mqgate.tracing.paths import MessagePath
from mqgate.tracing.policy import cut_body
from mqgate.tracing.query import TraceAnswer
from mqgate.tracing.service import Tracing

CONSUMED = "consumed"
NOT_CONSUMED = "not_consumed"
IN_DELIVERY = "in_delivery"
IN_RETRY = "in_retry"
DEAD_LETTERED = "dead_lettered"
REDRIVEN = "redriven"  # redriven from the dead letters to the consumer's inbox, not delivered yet
UNKNOWN = "unknown"  # no queue and offset were recorded for it (a route policy keeps neither)


class GroupState(msgspec.Struct, frozen=True):
    consumer: str
    state: str
    committed: int | None = None


class TracedPath(msgspec.Struct, frozen=True):
    path: MessagePath
    consumers: list[GroupState]


class TraceResult(msgspec.Struct, frozen=True):
    paths: list[TracedPath]
    may_be_incomplete: bool
    index_lag_events: int
    index_lag_ms: int


class TraceLookup:
    def __init__(self, ctx: Context, topology: Topology, tracing: Tracing) -> None:
        self.ctx = ctx
        self.topology = topology
        self.tracing = tracing

    async def find(self, *, msg_id: str | None, request_id: str | None, key: str | None) -> TraceResult:
        answer: TraceAnswer = await self.tracing.find(msg_id=msg_id, request_id=request_id, key=key)
        paths = []
        for found in answer.paths:
            path = await self._with_content(found)
            paths.append(TracedPath(path, await self._states(path)))
        return TraceResult(paths, answer.may_be_incomplete, answer.index_lag_events, answer.index_lag_ms)

    async def _with_content(self, path: MessagePath) -> MessagePath:
        """`path` with the body its trace kept by reference read from the store, on the first
        hop that points at it (the stored hop). A message no longer stored (retention), or an
        offset that now holds another message, leaves the body out."""
        at = next((i for i, h in enumerate(path.hops) if h.content_ref and h.body is None), None)
        if at is None:
            return path
        hop = path.hops[at]
        assert hop.queue is not None and hop.offset is not None  # content_ref holds an address
        try:
            found = await self.ctx.store.read(hop.topic, hop.queue, hop.offset, 1)
        except MqgateError:
            return path  # the store cannot say now: the path without the body
        if not found or found[0][0] != hop.offset or found[0][1].msg_id != path.msg_id:
            return path
        body = cut_body(found[0][1].body, self.ctx.settings.trace_body_max_bytes)
        hops = list(path.hops)
        hops[at] = msgspec.structs.replace(hop, body=body)
        return msgspec.structs.replace(path, hops=hops)

    async def _states(self, path: MessagePath) -> list[GroupState]:
        stored = next((h for h in path.hops if h.hop == "stored" and h.topic == path.topic), None)
        topic = self.ctx.registry.topic(path.topic)
        consumers = [c for c in self.ctx.registry.snapshot.consumers.values() if c.topic == path.topic]
        out = []
        for c in sorted(consumers, key=lambda c: c.name):
            # The consumer's committed offset in the message's queue, whatever its state says:
            # known for a cluster consumer once the stored hop names the queue.
            entry = None
            known = stored is not None and stored.queue is not None and stored.offset is not None
            if known and topic is not None and c.mode != MODE_BROADCAST:
                assert stored is not None and stored.queue is not None
                table = await self.ctx.offsets.table(c.name, "") or []
                index = topic.grid.table_index(stored.queue)
                entry = table[index] if index < len(table) else None
            committed = entry.committed if entry is not None else None
            mine = [h for h in path.hops if h.consumer == c.name]
            redrives = [i for i, h in enumerate(mine) if h.hop == "redriven"]
            if redrives:  # what happened before the last redrive is over: its copy's hops tell
                mine = mine[redrives[-1] :]
                if mine[-1].hop in ("redriven", "delivered"):
                    state = REDRIVEN if mine[-1].hop == "redriven" else IN_DELIVERY
                    out.append(GroupState(c.name, state, committed))
                    continue
            if any(h.hop == "dead_lettered" for h in mine):
                out.append(GroupState(c.name, DEAD_LETTERED, committed))
                continue
            if any(h.hop == "acked" for h in mine):
                out.append(GroupState(c.name, CONSUMED, committed))
                continue
            if mine and mine[-1].hop in ("redelivered", "released", "lock_expired", "due"):
                out.append(GroupState(c.name, IN_RETRY, committed))
                continue
            if not known or topic is None or c.mode == MODE_BROADCAST:
                out.append(GroupState(c.name, UNKNOWN))  # broadcast: see each client's progress
                continue
            assert stored is not None and stored.offset is not None
            if entry is None:
                out.append(GroupState(c.name, NOT_CONSUMED))
                continue
            if entry.committed > stored.offset:
                state = CONSUMED
            elif (
                lock_is_held(entry.lock_ts, entry.lock_deadline_ms, now_ms())
                and entry.delivered_end > stored.offset
            ):
                state = IN_DELIVERY
            else:
                state = NOT_CONSUMED
            out.append(GroupState(c.name, state, entry.committed))
        return out
