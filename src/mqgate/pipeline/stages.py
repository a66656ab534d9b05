"""The per-partition steps of a micro-batch before the workers: parse and route.

They run on the executors (Spark pickles them by reference), on rows of the mqgate source.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Final

from mqgate.pipeline.config import PipelineConfig
from mqgate.pipeline.dispatch import spread_of, stable_hash, task_of, worker_of
from mqgate.pipeline.executor import KIND_EVENTS, KIND_RETRY
from mqgate.pipeline.parsing import (
    BatchSize,
    Event,
    ParseFailure,
    Progress,
    SourceMessage,
    parse_internal,
    parse_message,
)

Parsed = Event | ParseFailure | Progress


def _millis(ts: Any) -> int:
    return int(ts.timestamp() * 1000) if isinstance(ts, datetime) else int(ts or 0)


# The source columns a micro-batch is narrowed to before it goes to Python (fewer values to
# convert), in the order to_message reads them by position.
COLUMNS: Final = ("messageId", "body", "topic", "queue", "offset", "timestamp", "keys", "properties")


def to_message(row: Any) -> SourceMessage:
    mid, body, topic, queue, offset, ts, keys, properties = row
    return SourceMessage(mid, body, topic, int(queue), int(offset), _millis(ts), keys or (), properties or {})


def parse_rows(config: PipelineConfig, kind: str, type_name: str, rows: Iterable[Any]) -> Iterator[Parsed]:
    """Events and parse failures of the rows, then one Progress per source queue."""
    types = {et.type: et for et in config.events}
    ends: dict[int, int] = {}
    for row in rows:
        message = to_message(row)
        ends[message.queue] = max(ends.get(message.queue, 0), message.offset + 1)
        if kind == KIND_EVENTS:
            events, failures = parse_message(types[type_name], message)
        else:
            events, failures = parse_internal(message, types, next_attempt=kind == KIND_RETRY)
        yield from events
        yield from failures
    for queue, next_offset in sorted(ends.items()):
        yield Progress(queue, next_offset)


def route_partition(
    kind: str, partitions: int, tasks: int, items: Iterable[Parsed]
) -> Iterator[tuple[int, Any]]:
    """(task, what the task gets). Events: (worker, event), the worker by key hash for the
    event queries, spread by event id for hot and retry. All events of a key reach one task,
    which therefore sees its workers' whole load. Failures and progress ride along to be
    reported; an event query's partitions also send every task their BatchSize."""
    events = 0
    for item in items:
        if isinstance(item, Progress):
            yield item.queue % tasks, item
        elif isinstance(item, ParseFailure):
            yield stable_hash(item.event_id) % tasks, item
        else:
            events += 1
            if kind == KIND_EVENTS:
                worker = worker_of(item.key, partitions)
            else:
                worker = spread_of(item.event_id, partitions)
            yield task_of(worker, tasks), (worker, item)
    if kind == KIND_EVENTS:
        for task in range(tasks):
            yield task, BatchSize(events)


def identity(task: int) -> int:
    return task
