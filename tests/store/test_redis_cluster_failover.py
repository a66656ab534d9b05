"""A Redis Cluster changing under load: a topic's slot resharded, a master killed.

Each test starts its own 3-master + 3-replica cluster and one gateway process on it, runs
producers and a consumer through HTTP, and counts what was acknowledged and what is stored.
Printed figures (run with -s) are the ones in docs/CLUSTERS.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusters import Load, Node, RedisClusterProcs, gateway_on, primary_lost_under_load
from tests.conftest import Server, wait_until

pytestmark = pytest.mark.slow

LOAD_BEFORE = 300  # acknowledged produces before the change
LOAD_AFTER = 300  # and after it


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterProcs]:
    c = RedisClusterProcs(tmp_path / "cluster").start()
    yield c
    c.stop()


@pytest.fixture
def gateway(cluster: RedisClusterProcs, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    yield from gateway_on(cluster.url, tmp_path, getattr(request, "param", 0))


def names_on_one_master(cluster: RedisClusterProcs) -> tuple[str, Node]:
    """A topic name whose topic slot and consumer-group slot have the same master."""
    for i in range(200):
        topic = f"load{i}"
        master = cluster.master_of_slot(cluster.keyslot(f"t:{topic}"))
        if master is not None and master is cluster.master_of_slot(cluster.keyslot(f"g:{topic}-c")):
            return topic, master
    raise AssertionError("no topic with both slots on one master")


def run_until(load: Load, count: int, timeout_s: float = 30) -> None:
    wait_until(lambda: load.count() >= count, timeout_s, f"{count} acknowledged produces", interval_s=0.05)


def test_a_topic_and_its_group_resharded_under_load_lose_and_fail_nothing(
    cluster: RedisClusterProcs, gateway: Server
) -> None:
    topic, source = names_on_one_master(cluster)
    tokens = gateway.setup_topic(topic, queues=4, consumer_args={"lockTimeoutS": 2})
    target = next(
        n for n in cluster.nodes if n.alive and n is not source and n.info("replication")["role"] == "master"
    )
    load = Load(gateway, topic, tokens).start()
    run_until(load, LOAD_BEFORE)
    moved = 0
    for tag in (f"t:{topic}", f"g:{topic}-c"):
        slot = cluster.keyslot(tag)
        moved += cluster.move_slot(slot, target, batch=2)  # small batches: a long migration window
        assert cluster.master_of_slot(slot) is target
    run_until(load, load.count() + LOAD_AFTER)
    report = load.finish()
    print(f"\nreshard ({moved} keys moved): {report.summary()}")
    assert moved >= 6  # meta + 4 streams + the group's table and clients
    # redis-py follows MOVED and ASK (and retries TRYAGAIN): nothing lost, every stored
    # message delivered and acked, and (almost) no call failed.
    assert not report.lost_produces and report.acked == report.stored, report.summary()
    assert report.produce_failures + report.ack_failures + report.pull_failures <= 2, report.summary()
    assert report.stored_records == len(report.stored), report.summary()  # none stored twice


@pytest.mark.parametrize("gateway", [0, 1], ids=["no-wait", "wait-1-replica"], indirect=True)
def test_a_master_killed_under_load(cluster: RedisClusterProcs, gateway: Server) -> None:
    topic, master = names_on_one_master(cluster)
    tokens = gateway.setup_topic(topic, queues=4, consumer_args={"lockTimeoutS": 2})
    replica = cluster.replica_of(master)
    load = Load(gateway, topic, tokens, producers=3).start()
    run_until(load, LOAD_BEFORE)
    promoted_s = primary_lost_under_load(
        load, master, replica, lambda: "master" in replica.info("replication").get("role", "")
    )
    # The old master comes back empty and becomes the new master's replica: WAIT can be met again.
    master.start()
    wait_until(cluster.healthy, 30, "the cluster to be whole again", interval_s=0.1)
    run_until(load, load.count() + LOAD_AFTER, timeout_s=60)
    report = load.finish()
    waiting = gateway.env["MQGATE_REDIS_WAIT_REPLICAS"] != "0"
    print(f"\nmaster killed, replica promoted in {promoted_s:.1f}s, wait={waiting}: {report.summary()}")
    # Service came back by itself, and everything stored was delivered and acked.
    assert report.settled >= report.stored, report.summary()
    if waiting:
        # An acknowledged write was on the replica before the answer: nothing acknowledged lost.
        assert not report.lost_produces, sorted(report.lost_produces)[:20]
        assert not report.delivered_again_after_ack, sorted(report.delivered_again_after_ack)[:20]
    else:
        # Asynchronous replication: what the replica had not received when it took over is
        # gone, although the gateway answered 200 for it.
        assert report.lost_produces, report.summary()
