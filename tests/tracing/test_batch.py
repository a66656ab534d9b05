"""A produce's hops of many messages in one trace record: the same events as one record per
hop, found by message id and key once indexed, and far fewer records and index rows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import msgspec
import pytest
import sqlalchemy as sa

from mqgate.core.ids import new_message_ids
from mqgate.model import StoredMessage, decode_stored
from mqgate.store.interface import Companions, MessageStore, TopicConfig
from mqgate.tracing.batch import (
    QueueRun,
    TraceBatch,
    TraceRound,
    batches_of,
    cut_bodies,
    decode_record,
    encode_batch,
    expand,
    is_batch,
    shared_or_each,
)
from mqgate.tracing.events import TraceEvent, encode_event
from mqgate.tracing.index import TraceIndex, batch_row
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.query import TraceQuery
from mqgate.tracing.recorder import TraceRecorder
from mqgate.tracing.rounds import ROUND_ITEMS, RoundGroup
from tests.tracing.conftest import GATEWAY, Stores, event, run_with_stores


def batch(n: int = 3, **fields: object) -> TraceBatch:
    given: dict[str, object] = {
        "kind": "batch",
        "hops": ["accepted", "stored"],
        "time_ms": 1_000,
        "last_ms": 1_003,
        "project": "shop",
        "topic": "orders",
        "resource": GATEWAY,
        "msg_ids": [f"m{i}" for i in range(n)],
        "queue": 2,
        "first_offset": 40,
        "producer": "p1",
        "keys": [[f"k{i}"] if i % 2 == 0 else [] for i in range(n)],
        "traceparents": [f"00-{'1' * 32}-{'2' * 16}-01"] * n,
    }
    given.update(fields)
    return TraceBatch(**given)  # type: ignore[arg-type]


def test_a_batch_expands_to_the_events_one_record_per_hop_would_hold() -> None:
    b = batch()
    got = expand(b)
    want = []
    for i in range(3):
        common = {"queue": 2, "producer": "p1", "traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}
        keys = [f"k{i}"] if i % 2 == 0 else []
        want.append(event(f"m{i}", "accepted", 1_000, keys=keys, **common))
        want.append(event(f"m{i}", "stored", 1_003, keys=keys, offset=40 + i, **common))
    assert got == want
    assert expand(b, only="m1") == want[2:4]
    assert b.event_count == 6
    # A batch of one hop: that hop has the offset.
    [only] = expand(batch(1, hops=["stored"]))
    assert only.offset == 40 and only.time_ms == 1_000


def test_a_trace_context_the_messages_share_is_written_once() -> None:
    shared = f"00-{'1' * 32}-{'2' * 16}-01"
    assert shared_or_each([shared] * 3) == (shared, [])
    assert shared_or_each([shared, None]) == (None, [shared, None])
    assert shared_or_each([]) == (None, [])
    once = batch(traceparents=[], traceparent=shared)
    assert encode_batch(once).count(shared.encode()) == 1
    # Expanded, each message has it, as the per-message form gives it.
    assert expand(once) == expand(batch())
    assert decode_record(encode_batch(once)) == once


def test_a_batch_is_told_from_an_event_by_its_first_bytes_and_round_trips() -> None:
    b = batch(bodies=["a", None, "é"])
    raw = encode_batch(b)
    assert is_batch(raw) and is_batch(raw.decode())
    assert decode_record(raw) == b
    single = encode_event(event("m9", "acked", 5))
    assert not is_batch(single) and decode_record(single) == event("m9", "acked", 5)
    # Fields a policy does not keep are not written at all.
    bare = encode_batch(batch(1, queue=None, first_offset=None, producer=None, keys=[], traceparents=[]))
    assert b"queue" not in bare and b"producer" not in bare and b"keys" not in bare
    with pytest.raises(msgspec.ValidationError):
        decode_record(b'{"kind":"batch","hops":["accepted"]}')


def test_a_run_of_ids_stands_for_the_list_everywhere_a_batch_is_read() -> None:
    ids = new_message_ids(1_000, 100)
    listed = batch(100, keys=[], traceparents=[])
    listed = msgspec.structs.replace(listed, msg_ids=ids)
    run = msgspec.structs.replace(listed, msg_ids=[], first_id=ids[0], count=100)
    raw = encode_batch(run)
    assert ids[1].encode() not in raw and len(raw) < len(encode_batch(listed)) // 10
    back = decode_record(raw)
    assert isinstance(back, TraceBatch) and back.ids == ids and back.event_count == 200
    assert expand(back) == expand(listed) and expand(back, only=ids[57]) == expand(listed, only=ids[57])
    assert back.holds(ids[99]) and not back.holds(new_message_ids(1_000, 1)[0])
    assert back.first_msg_id == ids[0] and back.runs() == [(ids[0], 100)]
    # A run names ids it can hold, and not beside a list; a count needs a first id.
    for broken in (
        raw.replace(b'"count":100', b'"count":0'),
        raw.replace(ids[0].encode(), b"not-an-id"),
        raw.replace(b'"count":100', b'"count":100,"msgIds":["x"]'),
        encode_batch(listed).replace(b'"msgIds"', b'"count":3,"msgIds"'),
    ):
        with pytest.raises(msgspec.ValidationError):
            decode_record(broken)


def test_a_request_over_several_queues_is_one_batch_of_runs_that_reads_as_one_per_queue() -> None:
    a, b = new_message_ids(1_000, 3), new_message_ids(1_000, 2)
    keys = [["k0"], [], [], ["k3"], []]
    whole = batch(
        5, msg_ids=[], keys=keys, queue=None, first_offset=None, traceparents=[], traceparent="tp",
        parts=[QueueRun(a[0], 3, queue=4, first_offset=10), QueueRun(b[0], 2, queue=7, first_offset=0)],
    )  # fmt: skip
    per_queue = [
        batch(3, msg_ids=a, keys=keys[:3], queue=4, first_offset=10, traceparents=[], traceparent="tp"),
        batch(2, msg_ids=b, keys=keys[3:], queue=7, first_offset=0, traceparents=[], traceparent="tp"),
    ]
    back = decode_record(encode_batch(whole))
    assert isinstance(back, TraceBatch) and back == whole
    assert expand(back) == [e for q in per_queue for e in expand(q)]
    assert back.ids == a + b and back.message_count == 5 and back.event_count == 10
    assert all(back.holds(m) for m in a + b) and not back.holds(new_message_ids(1_000, 1)[0])
    assert back.runs() == [(a[0], 3), (b[0], 2)] and back.first_msg_id == a[0]
    raw = encode_batch(whole)
    for broken in (
        raw.replace(b'"count":3', b'"count":0'),
        raw.replace(b'"parts"', b'"queue":1,"parts"'),
        raw.replace(b'"parts"', b'"msgIds":["x"],"parts"'),
        raw.replace(b'"keys":[["k0"],[],[],["k3"],[]]', b'"keys":[["k0"]]'),
    ):
        with pytest.raises(msgspec.ValidationError):
            decode_record(broken)


def test_batches_are_indexed_and_found_by_id_and_key_with_the_other_hops(
    store_kind: str, tmp_path: Path, index: TraceIndex
) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        indexer = TraceIndexer(store, index, batch_events=50)
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        query = TraceQuery(index, indexer)
        # One request of 6 messages, round robin over 2 queues: two batches whose id ranges
        # overlap; then a bigger request in the same millisecond (the same id prefix).
        ids = new_message_ids(1_000, 6)
        keys = [[f"k{i}"] if i % 2 == 0 else [] for i in range(6)]
        q0 = batch(3, msg_ids=ids[0::2], keys=keys[0::2], queue=0, first_offset=10)
        q1 = batch(3, msg_ids=ids[1::2], keys=keys[1::2], queue=1, first_offset=40)
        run = new_message_ids(1_000, 120)
        big = batch(120, msg_ids=[], first_id=run[0], count=120, keys=[])  # named as a run
        spread = [new_message_ids(1_000, 4), new_message_ids(1_000, 4)]  # a request over 2 queues
        parts = [QueueRun(ids[0], 4, queue=q, first_offset=70) for q, ids in enumerate(spread)]
        whole = batch(8, msg_ids=[], queue=None, first_offset=None, keys=[], traceparents=[], parts=parts)
        await recorder.record([q0, q1, big, whole])
        await recorder.record([event(ids[3], "delivered", 1_050, consumer="c1", request_id="req-1")])
        assert recorder.counters.recorded == 6 + 6 + 240 + 16 + 1  # events, not records
        await indexer.run_until_caught_up()
        assert indexer.counters.indexed == 269 and indexer.counters.malformed == 0
        [second] = (await query.find(msg_id=spread[1][2])).paths
        assert [(h.hop, h.queue, h.offset) for h in second.hops] == [("accepted", 1, None), ("stored", 1, 72)]
        [path] = (await query.find(msg_id=ids[3])).paths
        assert [(h.hop, h.queue, h.offset) for h in path.hops] == [
            ("accepted", 1, None),
            ("stored", 1, 41),
            ("delivered", None, None),
        ]
        assert [h.latency_ms for h in path.hops] == [None, 3, 47]
        [by_request] = (await query.find(request_id="req-1")).paths
        assert by_request.msg_id == ids[3] and len(by_request.hops) == 3
        [k2] = (await query.find(key="k2")).paths
        assert k2.msg_id == ids[2] and [(h.hop, h.offset) for h in k2.hops] == [
            ("accepted", None),
            ("stored", 11),
        ]
        last = run[-1]
        [in_big] = (await query.find(msg_id=last)).paths
        assert [h.offset for h in in_big.hops] == [None, 40 + 119]
        # An id of the same millisecond and process in no batch, and one of another millisecond.
        assert (await query.find(msg_id=new_message_ids(1_000, 1)[0])).paths == []
        assert (await query.find(msg_id=new_message_ids(2_000, 1)[0])).paths == []
        await recorder.close()

    run_with_stores(store_kind, tmp_path / "data", body)


def test_a_malformed_batch_is_counted_and_passed(tmp_path: Path, index: TraceIndex) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        from mqgate.store.interface import TopicConfig
        from mqgate.tracing.recorder import encode_for_store

        indexer = TraceIndexer(store, index)
        await store.create_topic(TopicConfig("%TRACE%shop", 1, None, None))
        indexer.add_topic("%TRACE%shop")
        ids = new_message_ids(1_000, 2)
        good = encode_for_store(batch(2, msg_ids=ids), 1_000)
        bad = good.replace(b"msgIds", b"msgIdz")
        await store.append_encoded("%TRACE%shop", {0: [(1_000, bad), (1_000, good)]})
        await indexer.run_until_caught_up()
        assert indexer.counters.malformed == 1 and indexer.counters.indexed == 4
        assert [h.hop for h in (await TraceQuery(index, indexer).find(msg_id=ids[1])).paths[0].hops] == [
            "accepted",
            "stored",
        ]

    run_with_stores("embedded", tmp_path / "data", body)


def test_the_batches_of_a_commit_round_share_one_record_and_each_message_is_found(
    store_kind: str, tmp_path: Path, index: TraceIndex
) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        indexer = TraceIndexer(store, index, batch_events=50)
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        await store.create_topic(TopicConfig("orders", 2, 7 * 86_400_000, None))
        await recorder.ensure_topic("%TRACE%shop")
        requests = [new_message_ids(1_000 + i // 7, 1 + i % 3) for i in range(30)]

        async def produce(i: int, ids: list[str]) -> None:
            q = i % 2
            msgs = [StoredMessage(m, 1_000, "p1", f"b{m}", [f"k{m}"], [], {}) for m in ids]

            def companions(firsts: dict[int, int]) -> Companions:
                made = batch(
                    len(ids), msg_ids=ids, keys=[[f"k{m}"] for m in ids], queue=q, first_offset=firsts[q]
                )
                return recorder.companions([made])

            _, failed = await store.append_many_with("orders", {q: msgs}, companions)
            assert failed is None

        await asyncio.gather(*(produce(i, ids) for i, ids in enumerate(requests)))
        records = await store.read("%TRACE%shop", 0, 0, 1_000)
        kinds = [decode_record(m.body) for _, m in records]
        assert sum(len(batches_of(k)) for k in kinds if not isinstance(k, TraceEvent)) == 30
        if store_kind == "embedded":  # one group-commit round carries many requests
            assert len(records) < 30 and any(isinstance(k, TraceRound) for k in kinds)
        await indexer.run_until_caught_up()
        assert indexer.counters.malformed == 0 and index.counters.written == len(records)
        with index.engine.connect() as conn:
            n_ranges = conn.execute(sa.text("SELECT count(*) FROM mqgate_trace_ranges")).scalar_one()
        # One range per record and id prefix (millisecond and process), not one per batch.
        prefixes = [
            {m[:20] for b in batches_of(k) for m in b.ids} for k in kinds if not isinstance(k, TraceEvent)
        ]
        assert n_ranges == sum(map(len, prefixes)) and (store_kind != "embedded" or n_ranges < 30)
        query = TraceQuery(index, indexer)
        for ids in requests:
            for m in (ids[0], ids[-1]):
                [path] = (await query.find(msg_id=m)).paths
                assert [h.hop for h in path.hops] == ["accepted", "stored"]
            [by_key] = (await query.find(key=f"k{ids[-1]}")).paths
            assert by_key.msg_id == ids[-1]
        await recorder.close()

    run_with_stores(store_kind, tmp_path / "data", body)


def test_a_records_id_ranges_are_its_lowest_and_highest_id_per_prefix() -> None:
    """The index finds a record by the ranges of its ids per millisecond and process: runs
    counted up from their first id, listed ids as they are, both merged under one prefix."""
    a, b = "0000000003e8" + "0000beef", "0000000003e9" + "0000beef"  # two prefixes (ms, process)
    runs = batch(
        0,
        msg_ids=[],
        keys=[],
        traceparents=[],
        queue=None,
        first_offset=None,
        parts=[
            QueueRun(a + "000000000110", 5, 1, 0),  # counters 0x110-0x114
            QueueRun(a + "0000000000ff", 2, 2, 0),  # 0xff-0x100: a higher first, a lower start
            QueueRun(b + "00000000000a", 1, 3, 0),
        ],
    )
    listed = batch(2, msg_ids=[a + "000000000200", a + "000000000001"], keys=[], traceparents=[])
    other = batch(1, msg_ids=["m7"], keys=[], traceparents=[])
    row = batch_row(TraceRound(kind="round", batches=[runs, listed, other]), "{}")
    assert sorted(row.id_ranges) == sorted(
        [
            (a + "000000000001", a + "000000000200"),
            (b + "00000000000a", b + "00000000000a"),
            ("m7", "m7"),
        ]
    )
    only_runs = batch_row(runs, "{}")
    assert sorted(only_runs.id_ranges) == [
        (a + "0000000000ff", a + "000000000114"),
        (b + "00000000000a", b + "00000000000a"),
    ]


def test_produces_join_their_projects_open_group_until_it_is_sealed() -> None:
    recorder = TraceRecorder(cast(MessageStore, None))  # join touches no store
    first = recorder.join(batch(1))
    assert recorder.join(batch(2)) is first  # one open group per project: one object
    [[group]] = [next(iter(q.values())) for q in first.values()]
    assert isinstance(group, RoundGroup) and list(first) == ["%TRACE%shop"]
    assert recorder.join(batch(1, project="other")) is not first
    [(_, raw)] = group.seal()
    assert [b.message_count for b in batches_of(decode_record(decode_stored(raw).body))] == [1, 2]
    after = recorder.join(batch(3))
    assert after is not first and recorder.companions([batch(1)]) is after  # a new group once sealed


def test_a_round_is_sealed_once_and_split_past_its_bound() -> None:
    group = RoundGroup(lambda: 7)
    sizes = [150, 30, 30, 1, 250]
    for n in sizes:
        group.add(batch(n, msg_ids=[f"m{n}-{i}" for i in range(n)], keys=[]))
    records = group.seal()
    assert group.seal() == [] and group.is_sealed
    with pytest.raises(RuntimeError):
        group.add(batch(1))
    bodies = [decode_record(decode_stored(raw).body) for _, raw in records]
    # A listed batch weighs its ids and one: 151+31 fit in 200, then 31+2, then the 251 alone
    # (a batch is never split).
    assert [[len(b.msg_ids) for b in batches_of(r)] for r in bodies] == [[150, 30], [30, 1], [250]]
    # Runs of ids without copied bodies weigh one each: 150 batches of 100 messages in one record.
    runs = RoundGroup(lambda: 7)
    for ids in (new_message_ids(1_000, 100) for _ in range(150)):
        runs.add(batch(100, msg_ids=[], first_id=ids[0], count=100, keys=[], traceparents=[]))
    [(_, raw)] = runs.seal()
    assert sum(b.message_count for b in batches_of(decode_record(decode_stored(raw).body))) == 15_000
    assert all(ts == 7 for ts, _ in records) and ROUND_ITEMS == 200
    assert isinstance(bodies[2], TraceBatch)  # one batch alone is written as a batch
    with pytest.raises(msgspec.ValidationError):
        decode_record(b'{"kind":"round","batches":[]}')


def test_bodies_are_cut_to_the_byte_bound_only_when_one_can_be_over() -> None:
    short = ["a" * 10, "é" * 10]
    assert cut_bodies(short, 40) == short
    assert cut_bodies(["a" * 10, "é" * 30], 40) == ["a" * 10, "é" * 20]  # 2 bytes per é
    assert cut_bodies([], 40) == []
