"""Cluster pool against real Redis servers: detection of a kill -9, a hung server (SIGSTOP) and
a server refusing writes (OOM), the way back, and the cluster definitions' errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mqgate.core.failure_detection import ClusterState, DetectionRules
from mqgate.errors import AlreadyExists, BadRequest, MqgateError, NotFound, Unavailable
from mqgate.failover.pool import ClusterPool, ClusterSpec
from mqgate.model import StoredMessage
from mqgate.settings import Settings
from mqgate.store.interface import TopicConfig
from tests.conftest import free_port
from tests.failover.conftest import FailoverRedis

PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 0.5
RULES = DetectionRules(send_timeout_s=1.0, fail_after=2, rejoin_probes=3, min_samples=10, error_rate=0.5)


def new_pool(tmp_path: Path, rules: DetectionRules = RULES) -> ClusterPool:
    base = Settings(data_dir=tmp_path / "gw", redis_prefix="fo")
    return ClusterPool(base, rules, probe_interval_s=PROBE_INTERVAL_S, probe_timeout_s=PROBE_TIMEOUT_S)


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll until `predicate` holds; the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def message(i: int, size: int = 10) -> StoredMessage:
    return StoredMessage(f"m{i}", 0, "p", "x" * size, [], [], {})


def test_kill9_is_detected_and_a_restarted_server_rejoins(tmp_path: Path) -> None:
    redis = FailoverRedis(tmp_path / "r").start()

    async def go() -> None:
        pool = new_pool(tmp_path)
        changes: list[tuple[str, str]] = []
        pool.listen(lambda t: changes.append((t.before.value, t.after.value)))
        await pool.add(ClusterSpec("a", redis.url, "pool1"))
        await pool.start()
        try:
            await until(lambda: pool.get("a").probes >= 2, 5, "probes")
            assert pool.get("a").state is ClusterState.HEALTHY and pool.get("a").opened
            redis.kill9()
            took = await until(lambda: pool.get("a").state is ClusterState.FAILED, 5, "FAILED")
            status = pool.statuses()[0]
            assert status.state == "failed" and "connect_failed" in status.reason, status
            print(f"\nkill -9 detected in {took:.2f}s ({status.reason})")
            assert took < PROBE_INTERVAL_S * RULES.fail_after + PROBE_TIMEOUT_S + 2  # + a loaded machine
            redis.start()  # same port, same files
            back = await until(lambda: pool.get("a").state is ClusterState.HEALTHY, 10, "HEALTHY")
            print(f"rejoined {back:.2f}s after the restart")
            assert ("failed", "recovering") in changes and changes[-1] == ("recovering", "healthy")
            # Rejoined only after rejoin_probes good answers in a row.
            assert back >= (RULES.rejoin_probes - 1) * PROBE_INTERVAL_S
        finally:
            await pool.stop()

    try:
        asyncio.run(go())
    finally:
        redis.stop()


def test_a_hung_server_is_detected_by_time_outs(tmp_path: Path) -> None:
    redis = FailoverRedis(tmp_path / "r").start()

    async def go() -> None:
        pool = new_pool(tmp_path)
        await pool.add(ClusterSpec("a", redis.url))
        await pool.start()
        try:
            cluster = pool.get("a")
            await cluster.store.create_topic(TopicConfig("t", 2, 60_000))
            redis.pause()
            paused = time.monotonic()
            # The data path: a send that does not answer within the send time-out...
            send = asyncio.ensure_future(
                pool.guarded("a", lambda: cluster.store.append("t", 0, [message(1)]))
            )
            # ...while the probes time out (0.5 s each).
            took = await until(lambda: cluster.state is ClusterState.FAILED, 5, "FAILED")
            print(f"\nSIGSTOP detected in {took:.2f}s ({cluster.detector.reason})")
            assert "timed_out" in cluster.detector.reason
            assert took < RULES.fail_after * (PROBE_TIMEOUT_S + PROBE_INTERVAL_S) + 2  # + a loaded machine
            with pytest.raises(Unavailable, match="send timeout"):
                await send
            waited = time.monotonic() - paused
            assert RULES.send_timeout_s <= waited < RULES.send_timeout_s + 0.5
            redis.resume()
            await until(lambda: cluster.state is ClusterState.HEALTHY, 10, "HEALTHY")
            # The hung send's connection is dropped; the next one works.
            offset = await pool.guarded("a", lambda: cluster.store.append("t", 0, [message(2)]))
            assert offset >= 0
        finally:
            await pool.stop()

    try:
        asyncio.run(go())
    finally:
        redis.stop()


def test_a_server_refusing_writes_fails_by_error_rate(tmp_path: Path) -> None:
    """Out of memory with noeviction: the server answers, but refuses every write."""
    import redis as redis_py

    redis = FailoverRedis(tmp_path / "r").start()
    admin = redis_py.Redis.from_url(redis.url)

    async def go() -> None:
        pool = new_pool(tmp_path)
        await pool.add(ClusterSpec("a", redis.url))
        await pool.start()
        try:
            cluster = pool.get("a")
            await cluster.store.create_topic(TopicConfig("t", 1, 3_600_000))
            await cluster.store.append("t", 0, [message(i, 20_000) for i in range(100)])  # 2 MB
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1mb")
            errors = 0
            start = time.monotonic()
            while cluster.state is not ClusterState.FAILED:
                assert time.monotonic() - start < 20, "never failed"
                with pytest.raises(MqgateError, match="maxmemory"):
                    await pool.guarded("a", lambda: cluster.store.append("t", 0, [message(0)]))
                errors += 1
            assert cluster.detector.reason.startswith("error rate"), cluster.detector.reason
            assert errors <= RULES.min_samples
            # The write probe sees the refusal too: it does not rejoin while memory is full...
            probes = cluster.probes
            await until(lambda: cluster.probes >= probes + RULES.rejoin_probes + 1, 5, "more probes")
            assert cluster.state is ClusterState.FAILED and cluster.last_outcome == "error"
            # ...and does once writes are taken again.
            admin.config_set("maxmemory", "0")
            await until(lambda: cluster.state is ClusterState.HEALTHY, 5, "HEALTHY")
        finally:
            await pool.stop()

    try:
        asyncio.run(go())
    finally:
        admin.close()
        redis.stop()


def test_a_cluster_down_at_start_is_opened_when_it_answers(tmp_path: Path) -> None:
    redis = FailoverRedis(tmp_path / "r", port=free_port())

    async def go() -> None:
        pool = new_pool(tmp_path)
        await pool.add(ClusterSpec("late", redis.url))
        await pool.start()
        try:
            cluster = pool.get("late")
            await until(lambda: cluster.state is ClusterState.FAILED, 5, "FAILED")
            assert not cluster.opened
            redis.start()
            await until(lambda: cluster.state is ClusterState.HEALTHY, 10, "HEALTHY")
            assert cluster.opened
            await cluster.store.create_topic(TopicConfig("t", 1, 60_000))
        finally:
            await pool.stop()

    try:
        asyncio.run(go())
    finally:
        redis.stop()


def test_embedded_cluster_and_definition_errors(tmp_path: Path) -> None:
    async def go() -> None:
        pool = new_pool(tmp_path)
        data = tmp_path / "emb"
        data.mkdir()
        await pool.add(ClusterSpec("e", f"embedded:{data}", "local"))
        for bad, field in (
            (ClusterSpec("x", "http://nowhere"), "url"),
            (ClusterSpec("x", "embedded:"), "url"),
            (ClusterSpec("bad name", "redis://127.0.0.1:1/0"), "name"),
            (ClusterSpec("x", "redis://127.0.0.1:1/0", pool="a/b"), "pool"),
        ):
            with pytest.raises(BadRequest) as caught:
                await pool.add(bad)
            assert caught.value.field == field
        with pytest.raises(AlreadyExists):
            await pool.add(ClusterSpec("e", f"embedded:{data}"))
        with pytest.raises(NotFound) as missing:
            pool.get("nope")
        assert missing.value.field == "cluster"
        await pool.start()
        try:
            cluster = pool.get("e")
            await until(lambda: cluster.probes >= 2, 5, "probes")
            assert cluster.state is ClusterState.HEALTHY and cluster.settings.broker_name == "e"
            await cluster.store.create_topic(TopicConfig("t", 1, 60_000))
            assert await cluster.store.append("t", 0, [message(1)]) == 0
            assert pool.names("local") == ["e"] and pool.names("other") == []
            # The data directory goes away (an unmounted disk): failed.
            data.rename(tmp_path / "gone")
            await until(lambda: cluster.state is ClusterState.FAILED, 5, "FAILED")
        finally:
            await pool.stop()

    asyncio.run(go())


def test_a_stop_ends_a_probe_whose_client_swallowed_the_cancellation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped while probing, a client that turns the cancellation into an error (redis-py may)
    left the probe loop sleeping on: the stop waited for it forever (a CI hang, 120 s)."""
    from mqgate.core.failure_detection import Outcome
    from mqgate.failover.pool import Cluster

    probing = asyncio.Event()
    swallowed: list[bool] = []

    async def swallowing_probe(self: Cluster) -> tuple[Outcome, str]:
        probing.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if swallowed:  # once only: the loop's own shutdown ends it, should the stop not
                raise
            swallowed.append(True)
            return Outcome.ERROR, "ConnectionError: the cancellation, turned into an error"
        return Outcome.OK, ""

    async def go() -> None:
        pool = new_pool(tmp_path)
        await pool.add(ClusterSpec("e", f"embedded:{tmp_path / 'e'}", "pool1"))
        monkeypatch.setattr(Cluster, "probe_once", swallowing_probe)
        await pool.start()
        await asyncio.wait_for(probing.wait(), 10)
        stopping = asyncio.ensure_future(pool.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)  # a bound on a hang, not a timing
        assert done, "the stop hung on a probe whose cancellation was swallowed"
        assert swallowed

    asyncio.run(go())
