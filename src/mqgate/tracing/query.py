"""The answer to a trace query (SPEC P6): the paths the index holds, and whether they may be
incomplete because the indexer has not yet read everything the store holds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mqgate.errors import BadRequest
from mqgate.tracing.index import TraceIndex
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.paths import MessagePath


@dataclass(slots=True, frozen=True)
class TraceAnswer:
    paths: list[MessagePath]  # one per message, newest first for a request id or key
    may_be_incomplete: bool  # stored trace events are not indexed yet
    index_lag_events: int
    index_lag_ms: int


class TraceQuery:
    def __init__(self, index: TraceIndex, indexer: TraceIndexer | None) -> None:
        self.index = index
        self.indexer = indexer  # None: no indexer in this process, so lag is unknown

    async def find(
        self, *, msg_id: str | None = None, request_id: str | None = None, key: str | None = None
    ) -> TraceAnswer:
        given = {"msgId": msg_id, "requestId": request_id, "key": key}
        named = [name for name, value in given.items() if value is not None]
        if len(named) != 1:
            raise BadRequest("give exactly one of msgId, requestId, key", field="msgId")
        for name in named:
            if not given[name]:
                raise BadRequest(f"{name} is empty", field=name)
        # The lag first: when it is zero, every event stored before the query is in the index
        # the query then reads.
        lag = None if self.indexer is None else await self.indexer.lag_now()
        paths = await asyncio.to_thread(self.index.paths, msg_id=msg_id, request_id=request_id, key=key)
        if lag is None:
            return TraceAnswer(paths, may_be_incomplete=True, index_lag_events=-1, index_lag_ms=-1)
        return TraceAnswer(paths, lag.events > 0, lag.events, lag.time_ms)
