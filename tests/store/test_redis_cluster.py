"""The Redis backends on a real Redis Cluster (3 masters + 3 replicas of the test's own).

The three backend contract suites run unchanged against the cluster (every script, through
redis-py's cluster client); then two gateway processes share the cluster. Resharding and
failover are in test_redis_cluster_failover.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.connection import Connection

import tests.offsets.test_message_mode_contract as message_contract
import tests.offsets.test_offset_store_contract as offsets_contract
import tests.scheduler.test_scheduler_contract as scheduler_contract
import tests.store.test_message_store_contract as store_contract
from mqgate import redisio
from mqgate.model import StoredMessage
from mqgate.offsets.backends.redis import RedisOffsetStore
from mqgate.offsets.interface import OffsetStore
from mqgate.store.backends.redis import RedisStore
from mqgate.store.interface import TopicConfig
from tests.clusters import RedisClusterProcs, command
from tests.conftest import Client, Server, wait_until

REFRESH_S = 0.5
ADMIN = "mqa_test_cluster_admin"
WAKE_BUDGET_S = 0.05


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    cluster = RedisClusterProcs(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


def _contract_tests(module: Any, params: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(fn, id=name)
        for name, fn in sorted(vars(module).items())
        if name.startswith("test_") and tuple(inspect.signature(fn).parameters) == params
    ]


# --- the backend contracts, every script on the cluster ---------------------------------------


@pytest.mark.parametrize("case", _contract_tests(store_contract, ("kind", "tmp_path")))
def test_message_store_contract_on_a_cluster(
    case: Any, redis_cluster: RedisClusterProcs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_contract, "REDIS_URL", redis_cluster.url)
    case("redis", tmp_path)


@pytest.mark.parametrize(
    "case",
    _contract_tests(offsets_contract, ("backend", "tmp_path"))
    + _contract_tests(message_contract, ("backend", "tmp_path")),
)
def test_offset_store_contract_on_a_cluster(
    case: Any, redis_cluster: RedisClusterProcs, tmp_path: Path
) -> None:
    prefix = "mqtest-" + secrets.token_hex(6)  # one per test; a reopened store finds its keys

    async def backend(path: Path) -> tuple[OffsetStore, Callable[[], Awaitable[None]]]:
        client = redisio.connect(redis_cluster.url)
        store = RedisOffsetStore(client, broker="local", prefix=prefix)
        await store.open()

        async def close() -> None:
            await store.close()
            await client.aclose()

        return store, close

    case(backend, tmp_path)


@pytest.mark.parametrize("case", _contract_tests(scheduler_contract, ("run",)))
def test_scheduler_contract_on_a_cluster(
    case: Any, redis_cluster: RedisClusterProcs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_contract, "REDIS_URL", redis_cluster.url)

    def go(body: Callable[[Any], Awaitable[None]]) -> None:
        async def main() -> None:
            async with scheduler_contract.redis_backend(tmp_path) as harness:
                await body(harness)

        asyncio.run(main())

    case(go)


def test_every_script_was_loaded_by_the_suites(redis_cluster: RedisClusterProcs) -> None:
    """A script is loaded on a node when a call first finds it missing there: each of them
    ran through the cluster client (the suites above ran first, in this module's order)."""
    masters = [n for n in redis_cluster.nodes if n.alive and n.info("replication")["role"] == "master"]
    missing = []
    for package in (
        "mqgate.store.backends.redis",
        "mqgate.offsets.backends.redis",
        "mqgate.scheduler.backends.redis",
    ):
        files = [e for e in resources.files(package).iterdir() if e.name.endswith(".lua")]
        included = {
            line[len(redisio.INCLUDE) :].strip()
            for e in files
            for line in e.read_text().splitlines()
            if line.startswith(redisio.INCLUDE)
        }
        for entry in files:
            if entry.name not in included:
                sha = hashlib.sha1(redisio.script_source(package, entry.name).encode()).hexdigest()
                if not any(command(m.port, "SCRIPT", "EXISTS", sha) == "1" for m in masters):
                    missing.append(f"{package}/{entry.name}")
    assert not missing, missing


def test_each_topic_and_group_lives_in_one_slot_and_topics_spread_over_masters(
    redis_cluster: RedisClusterProcs,
) -> None:
    prefix = "mqtest-" + secrets.token_hex(6)

    async def main() -> set[int]:
        client = redisio.connect(redis_cluster.url)
        store = RedisStore(client, broker="b", prefix=prefix)
        offsets = RedisOffsetStore(client, broker="b", prefix=prefix)
        await store.open()
        await offsets.open()
        try:
            for i in range(12):
                await store.create_topic(TopicConfig(f"t{i}", 4, 0, None))
                await store.append_many(f"t{i}", {q: [_msg(q)] for q in range(4)})
                await offsets.ensure_table(f"g{i}", "", [0, 0, 0, 0], 1)
                await offsets.ensure_table(f"g{i}", "client-x", [0, 0, 0, 0], 1)
            keys = [k.decode() async for k in client.scan_iter(match=prefix + ":*")]
        finally:
            await store.close()
            await client.aclose()
        by_tag: dict[str, set[int]] = {}
        assert f"{prefix}:topics" in keys  # the one untagged key: the topic list, a plain SET
        for key in keys:
            if key == f"{prefix}:topics":
                continue
            tag = key[key.index("{") : key.index("}") + 1]
            by_tag.setdefault(tag, set()).add(redis_cluster.keyslot(key))
        assert all(len(slots) == 1 for slots in by_tag.values()), by_tag
        assert len(by_tag) == 24  # 12 topics + 12 groups
        return {redis_cluster.master_of_slot(s.pop()).port for s in by_tag.values()}  # type: ignore[union-attr]

    assert len(asyncio.run(main())) == 3


def test_every_node_of_a_cluster_packs_commands_by_hiredis(redis_cluster: RedisClusterProcs) -> None:
    """As a standalone client's (tests/test_redisio.py): the startup nodes and the nodes the
    client found later make connections of the packing class."""

    async def main() -> None:
        client = redisio.connect(redis_cluster.url)
        try:
            for i in range(30):  # keys on every master
                await client.set(f"mqtest-pack-{i}", b"v", ex=60)
            nodes = client.get_nodes()
            assert len(nodes) >= 3  # the masters, and the replicas once the cluster has them
            for node in nodes:
                assert node.connection_class.pack_command is not Connection.pack_command, node
        finally:
            await client.aclose()

    asyncio.run(main())


def _msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i}", 1_000, "p", f"m{i}", [], [], {})


def test_an_append_wakes_a_wait_on_another_client_whatever_node_holds_the_topic(
    redis_cluster: RedisClusterProcs,
) -> None:
    prefix = "mqtest-" + secrets.token_hex(6)

    async def main() -> list[float]:
        a, b = redisio.connect(redis_cluster.url), redisio.connect(redis_cluster.url)
        writer, reader = RedisStore(a, broker="x", prefix=prefix), RedisStore(b, broker="x", prefix=prefix)
        await writer.open()
        await reader.open()
        try:
            await asyncio.wait_for(reader.listening.wait(), 10)
            latencies = []
            for i in range(9):  # 9 topics: every master holds some
                topic = f"w{i}"
                await writer.create_topic(TopicConfig(topic, 1, 0, None))
                await reader.create_topic(TopicConfig(topic, 1, 0, None))
                waiter = asyncio.create_task(reader.wait_for_data(topic, 5))
                await asyncio.sleep(0.01)  # let it register
                started = time.perf_counter()
                await writer.append(topic, 0, [_msg(i)])
                await asyncio.wait_for(waiter, 5)
                latencies.append(time.perf_counter() - started)
            return latencies
        finally:
            await writer.close()
            await reader.close()
            await a.aclose()
            await b.aclose()

    latencies = asyncio.run(main())
    assert max(latencies) < WAKE_BUDGET_S, latencies


# --- two gateway processes on the cluster -----------------------------------------------------


@pytest.fixture
def cluster_gateways(
    redis_cluster: RedisClusterProcs, pg_url: str, tmp_path: Path
) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []
    prefix = "mqgw" + secrets.token_hex(4)

    def start(*extra: str) -> Server:
        srv = Server(
            tmp_path / f"gw{len(started)}" / "data",
            admin_token=ADMIN,
            extra_args=["--store", redis_cluster.url, "--registry", pg_url, *extra],
            env={"MQGATE_REGISTRY_REFRESH_S": str(REFRESH_S), "MQGATE_REDIS_PREFIX": prefix},
        )
        srv.data_dir.parent.mkdir(parents=True, exist_ok=True)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


def test_two_gateways_produce_consume_ack_and_qos_on_a_cluster(cluster_gateways: Any) -> None:
    a, b = cluster_gateways(), cluster_gateways()
    a.admin("POST", "/admin/topics", name="orders", queues=6, maxPriority=3)
    ptoken = a.admin("POST", "/admin/producers", name="orders-p", topic="orders")["token"]
    ctoken = a.admin("POST", "/admin/consumers", name="orders-c", topic="orders")["token"]
    on_a, on_b = Client(a, ptoken, ctoken), Client(b, ptoken, ctoken)
    wait_until(lambda: on_b.produce("orders-p", "m0").status_code == 200, 3 * REFRESH_S + 2, "B to know")
    for i in range(1, 60):
        assert (on_a if i % 2 else on_b).produce("orders-p", f"m{i}", keys=[f"k{i}"]).status_code == 200
    # QoS: a delayed message and a high-priority one go through the scheduler on the cluster.
    now_ms = int(time.time() * 1000)
    r = on_a.produce("orders-p", "later", deliverAt=now_ms + 1500)
    assert r.status_code == 200, r.text
    assert on_b.produce("orders-p", "urgent", priority=3, deliverAt=now_ms + 300).status_code == 200
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while len(seen) < 62 and time.monotonic() < deadline:
        r = (on_a if len(seen) % 2 else on_b).pull("orders", "orders-c", max=7, wait=2)
        result = r.json()["result"]
        if result["status"] != "FOUND":
            continue
        seen += [m["message"] for m in result["msgList"]]
        # Acked through the other gateway: the token and the offsets live in the cluster.
        other = on_a if len(seen) % 2 == 0 else on_b
        assert other.call("/mq/ack", consumer="orders-c", requestId=result["requestId"]).status_code == 200
    assert sorted(seen) == sorted([f"m{i}" for i in range(60)] + ["later", "urgent"])
    assert seen.index("urgent") < seen.index("later")
    progress = b.admin("GET", "/admin/consumers/orders-c/progress")
    assert progress["lag"] == 0 and sum(q["committed"] for q in progress["queues"]) == 62
    on_a.close()
    on_b.close()
