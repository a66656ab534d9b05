"""Traced single-message produces of one group-commit round to one queue: one batch listing
their ids and each one's accepted time (tracing.produce_batches.SingleRun), which reads as the
batches each would have had, is a fraction of their bytes, and is retried whole when the store
refuses the round's records."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from mqgate.backends import backends_for
from mqgate.core.ids import new_message_ids
from mqgate.core.trace_context import TRACEPARENT
from mqgate.metrics import Metrics
from mqgate.model import StoredMessage, decode_stored
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import PolicyRecord, ProducerRecord, TopicRecord
from mqgate.registry.sql import SqlRegistry
from mqgate.services.context import Context
from mqgate.services.observers import Observers
from mqgate.services.topology import Topology
from mqgate.settings import load_settings
from mqgate.store.interface import MessageStore, TopicConfig
from mqgate.tracing.batch import BatchShape, TraceBatch, TraceRound, batches_of, decode_record, expand
from mqgate.tracing.events import trace_topic
from mqgate.tracing.policy import Level, MatchedTrace, Mode
from mqgate.tracing.produce_batches import SINGLE_RUN_MAX, Origin, queue_batch
from mqgate.tracing.rounds import QueueTracer, RoundGroup
from mqgate.tracing.service import Tracing
from tests.tracing.conftest import GATEWAY

INFO = BatchShape("info", queue=True, offset=True, producer=True, body=False, content_ref=True)
DEBUG = BatchShape("debug", queue=True, offset=True, producer=True, body=True, content_ref=False)
SEALED_MS = 1_050
CONTEXT = f"00-{'a' * 32}-{'b' * 16}-01"


def message(accepted_ms: int, producer: str = "p1", keys: bool = False, own: bool = False) -> StoredMessage:
    [msg_id] = new_message_ids(accepted_ms, 1)
    props = {TRACEPARENT: CONTEXT} if own else {}
    return StoredMessage(
        msg_id, accepted_ms, producer, f"body of {msg_id}", [msg_id] if keys else [], [], props
    )


def tracer(group: RoundGroup, queue: int, producer: str = "p1", level: Level = Level.INFO) -> QueueTracer:
    """The tracer of `producer`'s single produces to `queue` of shop's `orders`, joining `group`."""
    matched = MatchedTrace(level, frozenset({Mode.PROJECT}), ("p",))
    return QueueTracer("shop", "orders", queue, producer, matched, GATEWAY, 12, lambda project, msg_id: group)


def test_a_rounds_single_produces_to_one_queue_are_one_batch_that_reads_as_theirs() -> None:
    group = RoundGroup(lambda: SEALED_MS, "%TRACE%shop", 0)
    in_3, in_5 = tracer(group, 3), tracer(group, 5)
    by_p2, by_p2_debug = tracer(group, 3, "p2"), tracer(group, 3, "p2", Level.DEBUG)
    assert (in_3.shape, by_p2_debug.shape) == (INFO, DEBUG)
    # (queue, offset, message, tracer): a run of three in queue 3 (one with keys, one with its
    # own context), one in queue 5, then queue 3 again after a gap (an untraced append took
    # offset 43), by another producer, and at another level: four more runs.
    produced = [
        (3, 40, message(1_000), in_3),
        (3, 41, message(1_001, keys=True), in_3),
        (5, 7, message(1_002), in_5),
        (3, 42, message(1_003, own=True), in_3),
        (3, 44, message(1_004), in_3),
        (3, 45, message(1_005, producer="p2"), by_p2),
        (3, 46, message(1_006, producer="p2"), by_p2_debug),
    ]
    for q, offset, m, t in produced:
        assert t.join(m, {q: offset}) is group.records
    [(_, raw)] = group.seal()
    record = decode_record(decode_stored(raw).body)
    assert isinstance(record, TraceRound)
    runs = batches_of(record)
    assert [(b.queue, b.first_offset, len(b.msg_ids)) for b in runs] == [
        (3, 40, 3),
        (5, 7, 1),
        (3, 44, 1),
        (3, 45, 1),
        (3, 46, 1),
    ]
    first = runs[0]
    assert (first.time_ms, first.last_ms, first.times_ms) == (1_000, SEALED_MS, [1_000, 1_001, 1_003])
    assert first.traceparents == [None, None, CONTEXT] and first.keys[1] == [produced[1][2].msg_id]
    assert runs[4].bodies == [produced[6][2].body[:12]]  # debug keeps the body, cut to the bound
    # Every message's hops are those of a batch of its own, stored when the round was sealed.
    each = {
        m.msg_id: expand(
            queue_batch(
                Origin("shop", "orders", GATEWAY, m.timestamp_ms, SEALED_MS, 12),
                t.shape,
                q,
                [m],
                offset,
                None,
            )
        )
        for q, offset, m, t in produced
    }
    assert {m: [e for b in runs for e in expand(b, only=m)] for m in each} == each
    assert all(b.holds(m.msg_id) for b in runs[:1] for _, _, m, _ in produced[:2])


def test_a_run_is_a_fraction_of_the_bytes_of_a_batch_each() -> None:
    merged, apart = RoundGroup(lambda: SEALED_MS), RoundGroup(lambda: SEALED_MS)
    in_3 = tracer(merged, 3)
    for i in range(30):
        m = message(1_000 + i)
        in_3.join(m, {3: 40 + i})
        origin = Origin("shop", "orders", GATEWAY, m.timestamp_ms, SEALED_MS, 12)
        apart.add(queue_batch(origin, INFO, 3, [m], 40 + i, None))
    [(_, one)] = merged.seal()
    [(_, each)] = apart.seal()
    assert len(one) * 4 < len(each), (len(one), len(each))
    assert len(one) / 30 < 100  # bytes per message


def test_a_run_holds_at_most_its_bound_and_a_sealed_rounds_run_takes_no_more() -> None:
    groups = [RoundGroup(lambda: SEALED_MS)]
    matched = MatchedTrace(Level.INFO, frozenset({Mode.PROJECT}), ("p",))
    in_0 = QueueTracer("shop", "orders", 0, "p1", matched, GATEWAY, 12, lambda project, msg_id: groups[-1])
    messages = [message(1_000 + i) for i in range(SINGLE_RUN_MAX + 50)]
    for offset, m in enumerate(messages[:-10]):
        in_0.join(m, {0: offset})
    [(_, raw)] = groups[0].seal()
    assert [len(b.msg_ids) for b in batches_of(decode_record(decode_stored(raw).body))] == [
        SINGLE_RUN_MAX,
        40,
    ]  # type: ignore[arg-type]
    groups.append(RoundGroup(lambda: SEALED_MS))  # the next round: the offsets go on
    for offset, m in enumerate(messages[-10:], start=len(messages) - 10):
        assert in_0.join(m, {0: offset}) is groups[1].records
    [(_, raw)] = groups[1].seal()
    [batch] = batches_of(decode_record(decode_stored(raw).body))  # type: ignore[arg-type]
    assert (batch.first_offset, batch.msg_ids) == (len(messages) - 10, [m.msg_id for m in messages[-10:]])


def test_a_batch_whose_times_are_not_one_per_message_is_refused() -> None:
    run = RoundGroup(lambda: SEALED_MS)
    in_0 = tracer(run, 0)
    for i in range(2):
        in_0.join(message(1_000 + i), {0: i})
    [(_, raw)] = run.seal()
    body = decode_stored(raw).body
    assert isinstance(decode_record(body), TraceBatch)
    with pytest.raises(msgspec.ValidationError, match="timesMs"):
        decode_record(body.replace('"timesMs":[1000,1001]', '"timesMs":[1000]'))


@contextlib.asynccontextmanager
async def gateway_tracing(tmp_path: Path) -> AsyncIterator[tuple[Tracing, MessageStore]]:
    """A gateway's tracing on the embedded store, started and stopped."""
    settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
    backends = backends_for(settings)
    registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
    ctx = Context(
        settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
    )
    await backends.start()
    await backends.store.open()
    tracing = Tracing(ctx, Topology(ctx), Observers())
    await tracing.start()
    try:
        yield tracing, backends.store
    finally:
        await tracing.stop()
        await backends.store.close()
        await backends.stop()


def test_a_queue_tracer_lasts_until_the_policies_change(tmp_path: Path) -> None:
    async def go() -> None:
        async with gateway_tracing(tmp_path) as (tracing, _):
            topic = TopicRecord("orders", 2, 86_400_000, None, 0, project="shop")
            assert tracing.queue_tracer(topic, 1, "p1") is None  # no policy
            tracing.policies_changed([PolicyRecord("p", "project", "info", "shop", None, None, None, 0)])
            info = tracing.queue_tracer(topic, 1, "p1")
            assert info is not None and info.shape.level == "info"
            assert tracing.queue_tracer(topic, 1, "p1") is info  # one per producer and queue
            assert tracing.queue_tracer(topic, 1, "p2") not in (None, info)
            assert tracing.queue_tracer(topic, 0, "p1") not in (None, info)
            tracing.policies_changed([PolicyRecord("p", "project", "debug", "shop", None, None, None, 0)])
            debug = tracing.queue_tracer(topic, 1, "p1")
            assert debug is not None and debug.shape.level == "debug"
            tracing.policies_changed([PolicyRecord("q", "route", "info", None, "other", None, None, 0)])
            assert tracing.queue_tracer(topic, 1, "p1") is None

    asyncio.run(go())


def test_single_produces_whose_round_the_store_refused_are_retried_as_their_run(tmp_path: Path) -> None:
    """The trace topic is gone when the round is written (deleted under the recorder, which
    still knows it): the produces are stored and answered, their round group buffers its
    run's batch, counted as pending and as a failed append, and the retry stores it once the
    topic is back."""

    async def go() -> None:
        async with gateway_tracing(tmp_path) as (tracing, store):
            await store.create_topic(TopicConfig("orders", 2, 86_400_000, None))
            topic = TopicRecord("orders", 2, 86_400_000, None, 0, project="shop")
            tracing.policies_changed([PolicyRecord("p", "project", "info", "shop", None, None, None, 0)])
            traced = tracing.queue_tracer(topic, 1, "p1")
            assert traced is not None and await tracing.ready_for(topic)
            await store.delete_topic(trace_topic("shop"))
            produced = [message(2_000 + i) for i in range(3)]

            producer = ProducerRecord("p1", "orders", "", 0)

            async def produce(m: StoredMessage) -> tuple[dict[int, int], object]:
                records = await tracing.observer.records_with(
                    producer, topic, {1: [m]}, m.timestamp_ms, None, set()
                )
                assert records is not None  # a traced single produce joins its queue's run
                return await store.append_many_with("orders", {1: [m]}, records)

            results = await asyncio.gather(*(produce(m) for m in produced))
            assert sorted(firsts[1] for firsts, _ in results) == [0, 1, 2]
            assert all(failed is not None for _, failed in results)
            counters = tracing.recorder.counters
            assert counters.pending == 6 and counters.recorded == 0  # accepted and stored, each
            assert counters.append_failures >= 1
            await store.create_topic(TopicConfig(trace_topic("shop"), 1, 86_400_000, None))
            await tracing.recorder.flush()
            assert counters.pending == 0 and counters.recorded == 6
            records = await store.read(trace_topic("shop"), 0, 0, 10)
            events = [e for _, r in records for b in batches_of(decode_record(r.body)) for e in expand(b)]  # type: ignore[arg-type]
            hops = sorted(
                (e.msg_id, e.hop, e.time_ms, e.queue, e.offset) for e in events if e.hop == "accepted"
            )
            assert hops == [(m.msg_id, "accepted", m.timestamp_ms, 1, None) for m in produced]
            stored = sorted((e.msg_id, e.queue, e.offset) for e in events if e.hop == "stored")
            assert stored == sorted(zip((m.msg_id for m in produced), (1, 1, 1), (0, 1, 2), strict=True))

    asyncio.run(go())
