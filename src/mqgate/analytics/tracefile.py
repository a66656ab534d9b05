"""A generated trace as the records a trace topic holds: one JSON event (the encoding of
mqgate.tracing.events.TraceEvent) per record, in trace topics `%TRACE%<project>` of 4 queues,
with offsets in time order per queue, plus a few malformed records at the ends of the queues.

The JSON is assembled column-wise with Arrow (no Python loop per event), so 10 million
records take seconds; `raw_batches` gives them as Arrow record batches with the columns the
input stage reads (`topic, queue, offset, timestamp, body`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqgate.analytics.generator import (
    ERROR_TYPES,
    GATEWAYS,
    HOPS,
    NODES,
    TOPICS,
    EventArrays,
    LoadTrace,
    client_name,
)
from mqgate.tracing.events import HOP_ORDER, trace_topic

TRACE_QUEUES: Final = 4
MALFORMED_BODIES: Final = (
    "not json at all",
    '{"msgId": "x1", "hop": "accepted"',  # cut short
    '{"msgId": "x2", "hop": "teleported", "timeMs": 1, "project": "shop", "topic": "orders",'
    ' "resource": {"gatewayId": "gw-1"}}',
    '{"hop": "stored", "timeMs": 1, "project": "shop", "topic": "orders", "resource": {"gatewayId": "gw-1"}}',
    '{"msgId": "x4", "hop": "acked", "timeMs": "noon", "project": "pay", "topic": "payments",'
    ' "resource": {"gatewayId": "gw-2"}}',
    "[1, 2, 3]",
    '{"msgId": "x6", "hop": "acked", "timeMs": 5, "project": "pay", "topic": "payments", "resource": {}}',
)
PROJECTS: Final = tuple(sorted({t[0] for t in TOPICS}))


def msg_id(index: int) -> str:
    return f"m{index:09d}"


def _take(table: list[str], codes: np.ndarray) -> pa.Array:
    return pa.array(table, pa.string()).take(pa.array(codes))


def _numbers(fragment: str, values: np.ndarray, present: np.ndarray) -> pa.Array:
    text = pc.binary_join_element_wise(fragment, pc.cast(pa.array(values), pa.string()), "")
    return pc.if_else(pa.array(present), text, "")


def trace_order(ev: EventArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event order, trace queue, trace offset): the events of each trace topic queue in time
    order (ties by the usual hop order), numbered from 0."""
    project = np.array([PROJECTS.index(t[0]) for t in TOPICS])[ev.topic]
    tq = ev.msg % TRACE_QUEUES  # a message's events share a queue, so its hops stay in order
    hop_rank = np.array([HOP_ORDER[h] for h in HOPS])[ev.hop]
    order = np.lexsort((hop_rank, ev.time, tq, project))
    group = (project * TRACE_QUEUES + tq)[order]
    starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    offsets = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return order, tq[order], offsets


def bodies(ev: EventArrays, idx: np.ndarray) -> pa.Array:
    """The JSON body of events `idx` (positions into `ev`)."""
    hop = ev.hop[idx]
    topic = ev.topic[idx]
    err = ev.error_type[idx]
    node = ev.error_node[idx]
    client = ev.client[idx]
    gw = ev.gateway[idx]
    producer_side = ~ev.has_consumer[idx]
    ids = pc.utf8_lpad(pc.cast(pa.array(ev.msg[idx]), pa.string()), width=9, padding="0")
    hop_frag = [f'","hop":"{h}","timeMs":' for h in HOPS]
    topic_frag = [f',"project":"{p}","topic":"{t}"' for p, t, *_ in TOPICS]
    gw_frag = [
        f',"resource":{{"gatewayId":"{g}","host":"10.0.0.{i + 1}","service":"mqgate","port":8080}}'
        for i, g in enumerate(GATEWAYS)
    ]
    producer_frag = [f',"producer":"{t[2]}"' for t in TOPICS]
    consumer_frag = [f',"consumer":"{t[3]}"' for t in TOPICS]
    clients = [client_name(t, c) for t in range(len(TOPICS)) for c in range(2)]
    client_frag = ["", *(f',"clientId":"{c}"' for c in clients)]
    error_frag = ["", *(f',"status":"error","level":"error","errorType":"{e}"' for e in ERROR_TYPES)]
    node_frag = ["", *(f',"errorNode":"{n}"' for n in NODES)]
    client_code = np.where(client >= 0, topic * 2 + client + 1, 0)
    return pc.binary_join_element_wise(
        '{"msgId":"m',
        ids,
        _take(hop_frag, hop),
        pc.cast(pa.array(ev.time[idx]), pa.string()),
        _take(topic_frag, topic),
        _take(gw_frag, gw),
        _numbers(',"queue":', ev.queue[idx], ev.queue[idx] >= 0),
        _numbers(',"offset":', ev.offset[idx], ev.offset[idx] >= 0),
        pc.if_else(pa.array(producer_side), _take(producer_frag, topic), ""),
        pc.if_else(pa.array(producer_side), "", _take(consumer_frag, topic)),
        _take(client_frag, client_code),
        _numbers(',"attempt":', ev.attempt[idx], ev.attempt[idx] > 0),
        _take(error_frag, err + 1),
        _take(node_frag, node + 1),
        "}",
        "",
    )


RAW_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("queue", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("body", pa.string()),
    ]
)


def raw_batches(trace: LoadTrace, rows_per_batch: int = 500_000) -> Iterator[pa.RecordBatch]:
    """Every record of the trace topics: the events in trace order, then the malformed ones
    (spread over the queues after the events, stored at the end of the run)."""
    ev = trace.events
    order, tq, offsets = trace_order(ev)
    names = [trace_topic(p) for p in PROJECTS]
    project = np.array([PROJECTS.index(t[0]) for t in TOPICS])[ev.topic]
    for start in range(0, len(order), rows_per_batch):
        idx = order[start : start + rows_per_batch]
        yield pa.record_batch(
            [
                _take(names, project[idx]),
                pa.array(tq[start : start + rows_per_batch], pa.int32()),
                pa.array(offsets[start : start + rows_per_batch], pa.int64()),
                pa.array(ev.time[idx], pa.timestamp("ms", tz="UTC")),
                bodies(ev, idx),
            ],
            schema=RAW_SCHEMA,
        )
    bad = malformed_records(trace, order, tq, offsets, project)
    if bad.num_rows:
        yield bad


def malformed_records(
    trace: LoadTrace, order: np.ndarray, tq: np.ndarray, offsets: np.ndarray, project: np.ndarray
) -> pa.RecordBatch:
    n = trace.spec.malformed
    group = project[order] * TRACE_QUEUES + tq
    next_offset = {int(g): int(o) + 1 for g, o in zip(group, offsets, strict=True)}  # last wins: max
    rows: list[tuple[str, int, int, int, str]] = []
    for i in range(n):
        g = i % (len(PROJECTS) * TRACE_QUEUES)
        off = next_offset.get(g, 0)
        next_offset[g] = off + 1
        rows.append(
            (
                trace_topic(PROJECTS[g // TRACE_QUEUES]),
                g % TRACE_QUEUES,
                off,
                trace.spec.end_ms,
                MALFORMED_BODIES[i % 7],
            )
        )
    cols: list[tuple[object, ...]] = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
    return pa.record_batch(
        [pa.array(list(c), t) for c, t in zip(cols, RAW_SCHEMA.types, strict=True)], schema=RAW_SCHEMA
    )
