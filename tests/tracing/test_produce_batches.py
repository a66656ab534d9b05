"""A produce's trace record built from its stored messages (pure): one queue's messages as a
run or a list, a request over several queues as one batch of runs, and what a policy's shape
keeps."""

from __future__ import annotations

from mqgate.core.ids import ids_by_queue, new_message_ids
from mqgate.model import StoredMessage
from mqgate.tracing.batch import BatchShape, TraceBatch, expand
from mqgate.tracing.produce_batches import Origin, queue_batch, request_batch
from tests.tracing.conftest import GATEWAY

ORIGIN = Origin("shop", "orders", GATEWAY, accepted_ms=1_000, stored_ms=1_002, body_max_bytes=5)
INFO = BatchShape("info", queue=True, offset=True, producer=True, body=False, content_ref=True)
ROUTE = BatchShape("info", queue=False, offset=False, producer=True, body=True, content_ref=False)


def msgs(ids: list[str], keys: bool = False) -> list[StoredMessage]:
    return [StoredMessage(m, 1, "p1", f"body {m[-4:]}", [m] if keys else [], [], {}) for m in ids]


def test_one_queue_s_consecutive_ids_are_a_run_and_others_a_list() -> None:
    run = queue_batch(ORIGIN, INFO, 3, msgs(new_message_ids(1_000, 4)), 40, "tp")
    assert run.first_id is not None and run.count == 4 and run.msg_ids == []
    assert (run.queue, run.first_offset, run.content_ref, run.bodies) == (3, 40, True, [])
    gap = new_message_ids(1_000, 3)
    listed = queue_batch(ORIGIN, INFO, 3, msgs([gap[0], gap[2]]), 40, "tp")
    assert listed.first_id is None and listed.msg_ids == [gap[0], gap[2]]
    # A route policy: no queue or offset, the bodies copied and cut to the bound.
    copied = queue_batch(ORIGIN, ROUTE, 3, msgs(new_message_ids(1_000, 2)), 40, None)
    assert (copied.queue, copied.first_offset) == (None, None) and all(
        len(b or "") <= 5 for b in copied.bodies
    )


def test_a_request_over_several_queues_is_one_batch_unless_a_queue_is_not_a_run() -> None:
    queues = [0, 1, 0, 2, 1, 0]
    ids = ids_by_queue(1_000, queues)
    by_queue = {
        q: msgs([m for m, at in zip(ids, queues, strict=True) if at == q], keys=True) for q in (0, 1, 2)
    }
    firsts = {0: 10, 1: 20, 2: 30}
    whole = request_batch(ORIGIN, INFO, [(q, by_queue[q], firsts[q]) for q in (0, 1, 2)], "tp")
    assert whole is not None and [p.queue for p in whole.parts] == [0, 1, 2]
    singles = [queue_batch(ORIGIN, INFO, q, by_queue[q], firsts[q], "tp") for q in (0, 1, 2)]
    assert expand(whole) == [e for b in singles for e in expand(b)]
    assert whole.keys == [[m.msg_id] for q in (0, 1, 2) for m in by_queue[q]]
    broken = [*by_queue[0][:1], *by_queue[0][2:]]  # a gap in queue 0's ids
    assert request_batch(ORIGIN, INFO, [(0, broken, 10), (1, by_queue[1], 20)], "tp") is None


def test_a_queue_batch_holds_each_field_by_its_name() -> None:
    """queue_batch builds its TraceBatch positionally (the hot path): each value must land in
    the field of its name, for a single message and for a run."""
    [one] = msgs(new_message_ids(1_000, 1), keys=True)
    assert queue_batch(ORIGIN, ROUTE, 3, [one], 40, "tp") == TraceBatch(
        kind="batch",
        hops=["accepted", "stored"],
        time_ms=1_000,
        last_ms=1_002,
        project="shop",
        topic="orders",
        resource=GATEWAY,
        msg_ids=[one.msg_id],
        level="info",
        producer="p1",
        keys=[[one.msg_id]],
        traceparent="tp",
        bodies=["body "],
    )
    run = msgs(new_message_ids(1_000, 3))
    assert queue_batch(ORIGIN, INFO, 5, run, 40, None) == TraceBatch(
        kind="batch",
        hops=["accepted", "stored"],
        time_ms=1_000,
        last_ms=1_002,
        project="shop",
        topic="orders",
        resource=GATEWAY,
        first_id=run[0].msg_id,
        count=3,
        level="info",
        queue=5,
        first_offset=40,
        producer="p1",
        content_ref=True,
    )
