"""Issue 27: the lag gauges follow what changed. An idle pass recomputes no consumer (a pass
recomputed every consumer every 10 s, reading the store and the offsets for each); a produce
recomputes the consumers of its topic and /metrics shows their lag at the next pass; an ack
recomputes its consumer; a message stored without the data path (straight to the store, as the
failover's replay or drain would) and retention dropping unread messages are seen as well.

A real gateway's data path, store, offsets and registry in this process, passes every 0.2 s
instead of 10 s; the counters are read from the /metrics text."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mqgate.api.routes_log import LogRoutes
from mqgate.api.shapes import MessageIn
from mqgate.backends import backends_for
from mqgate.metrics import Metrics
from mqgate.model import StoredMessage
from mqgate.registry.cache import RegistryCache
from mqgate.registry.sql import SqlRegistry
from mqgate.services import operations
from mqgate.services.context import Context, now_ms
from mqgate.services.gateway import Gateway
from mqgate.settings import load_settings
from mqgate.web.request import Request
from tests.conftest import metric_samples, run_bounded

TOPICS = 40
PER_TOPIC = 3  # consumers per topic: 120 in all
WEEK_MS = 7 * 86_400_000


figures = metric_samples


def test_idle_passes_recompute_nobody_and_a_change_recomputes_its_consumers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operations, "LAG_FULL_PASS_S", 0.2)

    async def go() -> None:
        # Segments of 4 KiB: retention (which drops whole segments) has something to drop.
        env = {"MQGATE_SEGMENT_BYTES": "4096"}
        settings = load_settings(env=env, data_dir=tmp_path / "data", admin_token="x")
        backends = backends_for(settings)
        registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
        ctx = Context(
            settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
        )
        gw = Gateway(ctx)
        routes = LogRoutes(gw)
        scrape = Request("GET", "/metrics", {}, "127.0.0.1")

        async def metrics() -> dict[str, float]:
            return figures(((await routes.metrics(scrape)).body or b"").decode())

        async def counters() -> tuple[int, int]:
            """(passes, consumers recomputed) so far."""
            f = await metrics()
            if "mqgate_lag_recomputed_total" not in f:
                raise AssertionError("no mqgate_lag_recomputed_total in /metrics")
            passes = sum(v for k, v in f.items() if k.startswith("mqgate_lag_passes_total"))
            return int(passes), int(f["mqgate_lag_recomputed_total"])

        async def passes_beyond(passes: int, more: int) -> tuple[int, int]:
            """Poll until `more` passes ended after `passes`; the counters then."""
            deadline = time.monotonic() + 60
            while (now := await counters())[0] < passes + more:
                assert time.monotonic() < deadline, f"{more} passes did not come within 60 s"
                await asyncio.sleep(0.05)
            return now

        def lag_of(f: dict[str, float], consumer: str) -> float:
            return f[f'mqgate_consumer_lag{{consumer="{consumer}"}}']

        await backends.start()
        await gw.start()
        try:
            for i in range(TOPICS):
                await gw.topology.create_topic(f"t{i}", 2, WEEK_MS, None)
                for j in range(PER_TOPIC):
                    await gw.topology.register_consumer(f"c{i}-{j}", f"t{i}", "cluster", "earliest", 60, 16)
            producer, _ = await gw.topology.register_producer("p7", "t7")
            await gw.topology.create_topic("short", 1, 1_000, None)  # a second's retention
            await gw.topology.register_consumer("s-0", "short", "cluster", "earliest", 60, 16)
            await gw.operations.lag_settled(30)

            # Idle: five passes recompute no consumer.
            before, recomputed = await counters()
            passes, idle = await passes_beyond(before, 5)
            per_pass = (idle - recomputed) / (passes - before)
            assert idle == recomputed, f"{per_pass:g} consumers recomputed per idle pass"

            # A produce to t7: its three consumers, and only they, at the next pass.
            await gw.producing.produce(producer, [MessageIn(body="a"), MessageIn(body="b")])
            await gw.operations.lag_settled(10)
            f = await metrics()
            assert [lag_of(f, f"c7-{j}") for j in range(PER_TOPIC)] == [2.0] * PER_TOPIC
            assert lag_of(f, "c8-0") == 0.0
            passes, after_produce = await passes_beyond(passes, 1)
            assert after_produce - idle == PER_TOPIC

            # An ack by c7-0: c7-0 alone.
            c = await gw.topology.consumer("c7-0")
            while lag_of(await metrics(), "c7-0") > 0:
                pulled = await gw.consuming.pull(
                    c, client_id=None, max_count=10, wait_s=0, request_id=None, owner="test"
                )
                assert pulled.request_id is not None
                await gw.consuming.ack(c, gw.consuming.token(pulled.request_id))
                await gw.operations.lag_settled(10)
            f = await metrics()
            assert [lag_of(f, f"c7-{j}") for j in range(PER_TOPIC)] == [0.0, 2.0, 2.0]
            passes, after_acks = await passes_beyond(passes, 1)
            assert 1 <= after_acks - after_produce <= 2  # one per ack: the messages sat in two queues or one

            # Straight to the store, past the data path (as a failover replay writes): seen too.
            direct = StoredMessage("m-1", 1_800_000_000_000, "x", "direct", [], [], {})
            await ctx.store.append("t9", 1, [direct])
            await gw.operations.lag_settled(10)
            f = await metrics()
            assert [lag_of(f, f"c9-{j}") for j in range(PER_TOPIC)] == [1.0] * PER_TOPIC
            passes, stored = await passes_beyond(passes, 1)
            assert stored - after_acks == PER_TOPIC

            # Retention drops what s-0 never read: its lag falls, and s-0 alone is recomputed.
            old = now_ms() - 60_000
            body = "x" * 1000
            for k in range(12):  # 3 records a segment: 4 segments, the last one open
                await ctx.store.append("short", 0, [StoredMessage(f"o-{k}", old, "x", body, [], [], {})])
            await gw.operations.lag_settled(10)
            assert lag_of(await metrics(), "s-0") == 12.0
            passes, written = await counters()
            assert await ctx.store.enforce_retention(now_ms()) > 0
            await gw.operations.lag_settled(10)
            left = lag_of(await metrics(), "s-0")
            assert 0 < left < 12
            passes, dropped = await passes_beyond(passes, 1)
            assert dropped - written == 1

            # Idle again: nobody.
            passes, idle = await passes_beyond(passes, 5)
            assert idle == dropped
        finally:
            await gw.stop()
            await backends.stop()

    run_bounded(go(), 180)
