"""Issue 27 item 3: after a fail-back the project switched again with no outage (epochs 4 -> 5
-> 6 within 20 s). The data path's pooled connections to the primary were opened before it was
killed; after its restart each one failed at its first use, and those failures (connect errors,
two in a row) failed the primary, which was serving fine, again.

Deterministic: produces under concurrency fill the primary's connection pool; the primary is
killed -9, the project switches to the backup; the primary is restarted, probed back to
healthy and the project failed back to it by hand; then a burst of produces."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mqgate.core.failure_detection import ClusterState, Outcome
from mqgate.errors import Unavailable
from tests.conftest import run_bounded
from tests.failover.conftest import FailoverRedis
from tests.failover.harness import in_process


def test_connections_opened_before_an_outage_do_not_fail_the_cluster_once_it_is_back(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url) as h:
            burst = await asyncio.gather(*(h.produce([f"a{i}"]) for i in range(30)))
            assert {r.status for rs in burst for r in rs} == {"stored"}
            primary.kill9()
            h.fail("p")
            await h.failover.coordinator.check()
            assert (h.active(), h.epoch()) == ("b", 2)

            primary.start()
            await h.rejoin("p")
            back = await h.failover.failback("shop")
            assert (back.active, back.epoch) == ("p", 3)
            burst = await asyncio.gather(*(h.produce([f"c{i}"]) for i in range(30)))
            await h.failover.coordinator.check()
            statuses = sorted({(r.status, r.broker) for rs in burst for r in rs})
            print(f"\nafter the fail-back: {statuses}, p {h.state('p')}, epoch {h.epoch()}")
            assert statuses == [("stored", "p")]
            assert h.state("p") is ClusterState.HEALTHY, h.pool.get("p").detector.reason
            assert (h.active(), h.epoch()) == ("p", 3)

    run_bounded(go(), 180)


def test_an_operation_that_started_before_a_rejoin_does_not_count_against_the_cluster(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """A call sent to the primary while it was failed (here: hung) ends, timed out, after the
    primary rejoined: it says nothing about the primary since then."""
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url, failover_send_timeout_s=1.0) as h:
            await h.quiet()
            h.fail("p")
            store = h.pool.get("p").backends.store
            started = asyncio.Event()

            async def append() -> int:
                started.set()
                return await store.append("orders", 0, [])

            primary.pause()
            call = asyncio.ensure_future(h.pool.guarded("p", append))
            await started.wait()
            for _ in range(3):  # rejoin_probes good answers (the probes' own connection)
                h.pool.observe("p", Outcome.OK)
            assert h.state("p") is ClusterState.HEALTHY
            with pytest.raises(Unavailable):
                await call  # timed out after the rejoin
            primary.resume()
            assert h.state("p") is ClusterState.HEALTHY, h.pool.get("p").detector.reason

    run_bounded(go(), 60)


def test_an_answer_to_a_call_sent_before_the_cluster_failed_does_not_bring_it_back(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """A stale answer (read from the socket after a kill -9, or a call that was slow) says
    nothing about the cluster since it failed: before, it moved a failed primary to RECOVERING
    and, with a few of them, back to HEALTHY, so the coordinator did not switch (CI, stop 35)."""
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url) as h:
            release = asyncio.Event()
            started = asyncio.Event()

            async def answered_late() -> int:
                started.set()
                await release.wait()
                return 1

            calls = [asyncio.ensure_future(h.pool.guarded("p", answered_late)) for _ in range(3)]
            await started.wait()
            h.fail("p")
            release.set()
            assert await asyncio.gather(*calls) == [1, 1, 1]
            assert h.state("p") is ClusterState.FAILED, h.pool.get("p").detector.reason
            await h.failover.coordinator.check()
            assert (h.active(), h.epoch()) == ("b", 2)

    run_bounded(go(), 60)
