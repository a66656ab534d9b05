"""The job reads a round record's batches as the gateway does (tracing.batch.expand): one row
per message and hop, with each message's own accepted time in a run of single produces."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from mqgate.analytics.ingest import parse_raw
from mqgate.core.ids import new_message_ids
from mqgate.model import StoredMessage, decode_stored
from mqgate.tracing.batch import BatchShape, batches_of, decode_record, expand
from mqgate.tracing.events import Resource
from mqgate.tracing.policy import Level, MatchedTrace, Mode
from mqgate.tracing.produce_batches import Origin, queue_batch
from mqgate.tracing.rounds import QueueTracer, RoundGroup

pytestmark = pytest.mark.slow

GATEWAY = Resource("gw-1", "host-a", "mqgate", 8080)
INFO = BatchShape("info", queue=True, offset=True, producer=True, body=False, content_ref=True)


def test_a_round_of_single_produce_runs_and_a_batch_reads_as_the_gateway_expands_it(spark: Any) -> None:
    group = RoundGroup(lambda: 1_100, "%TRACE%shop", 0)
    matched = MatchedTrace(Level.INFO, frozenset({Mode.PROJECT}), ("p",))
    in_1 = QueueTracer("shop", "orders", 1, "p1", matched, GATEWAY, 0, lambda project, msg_id: group)
    for i in range(3):  # three single produces to queue 1: one run
        [msg_id] = new_message_ids(1_000 + 10 * i, 1)
        in_1.join(StoredMessage(msg_id, 1_000 + 10 * i, "p1", "x", [f"k{i}"], [], {}), {1: 20 + i})
    ids = new_message_ids(1_050, 2)  # and a request of two messages to queue 0
    two = [StoredMessage(m, 1_050, "p1", "y", [], [], {}) for m in ids]
    group.add(queue_batch(Origin("shop", "orders", GATEWAY, 1_050, 1_060, 0), INFO, 0, two, 5, None))
    [(_, raw)] = group.seal()
    body = decode_stored(raw).body
    record = decode_record(body)
    expected = sorted(
        (e.msg_id, e.hop, e.time_ms, e.queue, e.offset)
        for b in batches_of(record)  # type: ignore[arg-type]
        for e in expand(b)
    )
    when = dt.datetime.fromtimestamp(1.1, dt.UTC)
    rows = spark.createDataFrame(
        [("%TRACE%shop", 0, 0, when, body)],
        "topic string, queue int, offset long, timestamp timestamp, body string",
    )
    got = sorted(
        (r.msgId, r.hop, r.timeMs, r.queue, r.offset)
        for r in parse_raw(rows).where("reason is null").collect()
    )
    assert got == expected
    assert {t for _, hop, t, q, _ in got if hop == "accepted" and q == 1} == {1_000, 1_010, 1_020}
