"""The Redis backends behind Sentinel: a primary, one replica and three Sentinels of the
test's own, addressed as redis+sentinel://host:port,.../SERVICE; the primary killed under load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusters import Load, Node, SentinelProcs, gateway_on, primary_lost_under_load
from tests.conftest import Client, Server, wait_until

pytestmark = pytest.mark.slow

LOAD_BEFORE = 300
LOAD_AFTER = 300


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelProcs]:
    s = SentinelProcs(tmp_path / "sentinel").start()
    yield s
    s.stop()


@pytest.fixture
def gateway(sentinels: SentinelProcs, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    yield from gateway_on(sentinels.url, tmp_path, getattr(request, "param", 0))


def test_a_gateway_finds_the_primary_through_the_sentinels(sentinels: SentinelProcs, gateway: Server) -> None:
    ptoken, ctoken = gateway.setup_topic("s", queues=2)
    client = Client(gateway, ptoken, ctoken)
    assert client.produce_batch("s-p", [{"message": f"m{i}"} for i in range(20)]).status_code == 200
    result = client.pull("s", "s-c", max=100).json()["result"]
    got = [m["message"] for m in result["msgList"]]
    result = client.pull("s", "s-c", max=100).json()["result"]
    got += [m["message"] for m in result["msgList"]]
    assert sorted(got) == sorted(f"m{i}" for i in range(20))
    assert sentinels.primary is not None and sentinels.replica is not None
    # The data went to the primary, and replication carried it to the replica.
    assert int(sentinels.primary.info("keyspace")["db0"].split("keys=")[1].split(",")[0]) > 0
    wait_until(lambda: "db0" in sentinels.replica.info("keyspace"), 10, "the replica to have the keys")
    client.close()


@pytest.mark.parametrize("gateway", [0, 1], ids=["no-wait", "wait-1-replica"], indirect=True)
def test_the_primary_killed_under_load(sentinels: SentinelProcs, gateway: Server) -> None:
    primary, replica = sentinels.primary, sentinels.replica
    assert primary is not None and replica is not None
    tokens = gateway.setup_topic("load", queues=4, consumer_args={"lockTimeoutS": 2})
    load = Load(gateway, "load", tokens, producers=3).start()
    wait_until(lambda: load.count() >= LOAD_BEFORE, 30, "load before", interval_s=0.05)

    def promoted() -> bool:
        return all(sentinels.primary_port(s) == replica.port for s in sentinels.sentinels)

    promoted_s = primary_lost_under_load(load, primary, replica, promoted)
    # The old primary comes back empty as the new primary's replica (WAIT can be met again).
    back = Node(
        primary.directory, primary.port, [*primary.args, "--replicaof", "127.0.0.1", str(replica.port)]
    )
    sentinels.primary = back.start()
    wait_until(lambda: replica.info("replication").get("connected_slaves") == "1", 20, "the new replica")
    n = load.count()
    wait_until(lambda: load.count() >= n + LOAD_AFTER, 60, "load after", interval_s=0.05)
    report = load.finish()
    waiting = gateway.env["MQGATE_REDIS_WAIT_REPLICAS"] != "0"
    print(f"\nsentinel: primary killed, promoted in {promoted_s:.1f}s, wait={waiting}: {report.summary()}")
    assert report.settled >= report.stored, report.summary()
    if waiting:
        assert not report.lost_produces, sorted(report.lost_produces)[:20]
        assert not report.delivered_again_after_ack, sorted(report.delivered_again_after_ack)[:20]
    else:
        assert report.lost_produces, report.summary()
