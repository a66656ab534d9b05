"""Issue 27: the queue state probe of an idle gateway reads what changed, not every topic and
every consumer every 5 s. A gateway's own produces and acks mark their topic; every other queue
is confirmed unchanged, and still counts as sampled in its intervals; a full probe comes once
a minute (and after a registry change) for what moves without a hook here.

A real gateway's data path and stores, in this process; `Counting` only counts the probe's
reads of the real store and offsets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from msgspec.structs import replace

from mqgate.api.shapes import MessageIn
from mqgate.backends import backends_for
from mqgate.metrics import Metrics
from mqgate.model import QueueBounds
from mqgate.offsets.interface import OffsetStore
from mqgate.queuestate.sampler import QueueStateSampler
from mqgate.queuestate.service import QueueState
from mqgate.registry.cache import RegistryCache
from mqgate.registry.sql import SqlRegistry
from mqgate.services.context import Context
from mqgate.services.gateway import Gateway
from mqgate.services.observers import Observers
from mqgate.services.topology import Topology
from mqgate.settings import load_settings
from mqgate.store.interface import MessageStore
from tests.conftest import run_bounded

TOPICS = 40
QUEUES = 4
IV = 60_000
B = 1_800_000_000_000 - 1_800_000_000_000 % IV  # an interval's start


class Counting:
    """A real store or offset store, its `bounds` and `table` calls counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def bounds(self, topic: str) -> list[QueueBounds]:
        self.calls += 1
        result: list[QueueBounds] = await self.inner.bounds(topic)
        return result

    async def table(self, consumer: str, client: str) -> Any:
        self.calls += 1
        return await self.inner.table(consumer, client)


@contextlib.asynccontextmanager
async def topics_and_consumers(tmp_path: Path) -> AsyncIterator[tuple[Gateway, Observers]]:
    """A real gateway's data path and stores, in this process, with TOPICS topics of QUEUES queues,
    each with a cluster consumer."""
    settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
    backends = backends_for(settings)
    registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
    ctx = Context(
        settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
    )
    observers = Observers()
    gateway = Gateway(ctx, Topology(ctx), observers)
    await backends.start()
    await gateway.start()
    try:
        for i in range(TOPICS):
            await gateway.topology.create_topic(f"t{i}", QUEUES, 86_400_000, None)
            await gateway.topology.register_consumer(f"c{i}", f"t{i}", "cluster", "earliest", 60, 16)
        yield gateway, observers
    finally:
        await gateway.stop()
        await backends.stop()


def test_an_idle_probe_reads_nothing_and_a_produce_costs_its_topic(tmp_path: Path) -> None:
    async def go() -> None:
        async with topics_and_consumers(tmp_path) as (gateway, observers):
            ctx = gateway.ctx
            producer, _ = await gateway.topology.register_producer("p7", "t7")
            store, offsets = Counting(ctx.store), Counting(ctx.offsets)
            qs = QueueState(replace(ctx, store=cast(MessageStore, store), offsets=cast(OffsetStore, offsets)))
            observers.attach(qs)

            await qs._probe(B)  # the first probe reads everything
            assert (store.calls, offsets.calls) == (TOPICS, TOPICS)

            # Idle: ten more probes, 5 s apart, read nothing (before: 40 bounds and 40 offset
            # tables each).
            store.calls = offsets.calls = 0
            for k in range(1, 11):
                await qs._probe(B + k * 5_000)
            assert (store.calls, offsets.calls) == (0, 0)

            # A produce to t7 through the data path: the next probe reads t7 and its consumer.
            await gateway.producing.produce(producer, [MessageIn(body="m")])
            await qs._probe(B + 11 * 5_000)
            assert (store.calls, offsets.calls) == (1, 1)

            # A minute after the last: a full probe (what moved without a hook here is seen).
            store.calls = offsets.calls = 0
            await qs._probe(B + 12 * 5_000)
            assert qs.probes.full_rounds == 2 and (store.calls, offsets.calls) == (TOPICS, TOPICS)

            # The intervals of the idle queues are as if sampled every 5 s: covered whole.
            rows = qs.sampler.roll_up(B + IV + 1)
            idle = [r for r in rows.queues if r.topic == "t3"]
            assert [(r.start_ms, r.covered_ms, r.max_length) for r in idle] == [(B, IV, 0)] * QUEUES
            backlog = [r for r in rows.consumers if r.consumer == "c3"]
            assert {(r.covered_ms, r.max_backlog) for r in backlog} == {(IV, 0)}
            moved = [r for r in rows.queues if r.topic == "t7"]
            assert sorted(r.max_length or 0 for r in moved) == [0] * (QUEUES - 1) + [1]
            assert {r.covered_ms for r in moved} == {IV}

    run_bounded(go(), 60)


def test_confirmations_hold_a_value_a_stall_is_not_counted_and_a_gone_key_lapses() -> None:
    s = QueueStateSampler(interval_s=60, sample_every_s=5)  # a sample holds 10 s
    s.begin_full_round()
    s.observe_queue("p", "t", 0, 7, B)
    s.observe_queue("p", "gone", 0, 3, B)
    for k in range(1, 4):  # confirmed every 5 s up to 15 s
        s.confirm(B + k * 5_000)
    s.begin_full_round()  # at 20 s: "gone" is not sampled in it any more
    s.observe_queue("p", "t", 0, 7, B + 20_000)
    s.confirm(B + 20_000)
    s.confirm(B + 25_000)
    s.confirm(B + 50_000)  # the prober stalled 25 s: [35 s, 50 s) is nobody's
    s.confirm(B + 55_000)
    rows = {r.topic: r for r in s.roll_up(B + IV).queues}
    t, gone = rows["t"], rows["gone"]
    assert (t.covered_ms, t.length_area, t.samples, t.max_length) == (45_000, 7 * 45_000, 2, 7)
    assert (gone.covered_ms, gone.samples) == (25_000, 1)  # its last confirmation (15 s) + 10 s


def test_following_the_gateways_moves_needs_no_periodic_full_probe(tmp_path: Path) -> None:
    """Followed by the gateway's record of moves (which hears every move of the embedded store and
    offsets), an idle gateway's probes read nothing however long it idles, and a move no hook of
    the queue state hears (an admin reset of a consumer's offsets) costs its topic only."""

    async def go() -> None:
        async with topics_and_consumers(tmp_path) as (gateway, _):
            ctx = gateway.ctx
            store, offsets = Counting(ctx.store), Counting(ctx.offsets)
            qs = QueueState(replace(ctx, store=cast(MessageStore, store), offsets=cast(OffsetStore, offsets)))
            qs.follow(gateway.changes)
            await qs._probe(B)  # the first probe reads everything
            assert (store.calls, offsets.calls) == (TOPICS, TOPICS)

            # Five idle minutes of probes 5 s apart: nothing read (before: a full probe a minute).
            store.calls = offsets.calls = 0
            for k in range(1, 61):
                await qs._probe(B + k * 5_000)
            assert (store.calls, offsets.calls) == (0, 0) and qs.probes.full_rounds == 1

            # An admin reset moves c3's offsets without a hook of the queue state: t3 is read.
            await gateway.operations.reset(
                "c3", "latest", offset=None, timestamp_ms=None, queue=None, client_id=None
            )
            await qs._probe(B + 61 * 5_000)
            assert (store.calls, offsets.calls) == (1, 1) and qs.probes.full_rounds == 1

    run_bounded(go(), 60)
