"""The `mqgate` Spark source against a real gateway and a real local Spark: batch reads,
offset options, streaming with Trigger.AvailableNow and restarts, direct Redis store reads."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

import mqgate.spark
from tests.conftest import Server
from tests.spark.conftest import produce, read_all, unique

pytestmark = pytest.mark.slow

COLUMNS = ("topic", "broker", "queue", "offset", "messageId", "keys", "tags", "properties", "body")
TIMES = ("timestamp", "deliverAt", "deadline")


def reader(spark: Any, server: Server, topic: str, **options: Any) -> Any:
    r = spark.read.format("mqgate").option("gateway", server.url).option("token", server.admin_token)
    for k, v in options.items():
        r = r.option(k, v)
    return r.option("topic", topic).load()


def rows(df: Any) -> list[dict[str, Any]]:
    """Every column, timestamps as epoch ms, sorted by (queue, offset)."""
    from pyspark.sql import functions as F

    cols = [*COLUMNS, "producer", "priority", *(F.unix_millis(c).alias(c) for c in TIMES)]
    out = [r.asDict(recursive=True) for r in df.select(*cols).collect()]
    return sorted(out, key=lambda r: (r["queue"], r["offset"]))


def expected(topic: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [
        {
            **{k: m[k] for k in COLUMNS if k not in ("topic", "body")},
            "topic": topic,
            "body": m["message"],
            "producer": m["producer"],
            "priority": m.get("priority"),
            **{k: m.get(k) for k in TIMES},
        }
        for m in items
    ]
    return sorted(out, key=lambda r: (r["queue"], r["offset"]))


def test_batch_read_returns_every_message_once_with_its_fields(spark: Any, gateway: Server) -> None:
    topic = unique("all")
    gateway.admin("POST", "/admin/topics", name=topic, queues=3, maxPriority=1)
    gateway.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)
    now = int(time.time() * 1000)
    sent: list[dict[str, Any]] = []
    for i in range(240):
        m: dict[str, Any] = {"message": f"m{i} ü" * (1 + i % 3), "keys": [f"k{i}"] if i % 2 else []}
        if i % 3 == 0:
            m["tags"] = ["a", f"t{i}"]
        if i % 5 == 0:
            m["properties"] = {"n": str(i), "x": "y"}
        if i % 7 == 0:
            m["priority"] = 1
        if i % 11 == 0:
            m["ttlMs"] = 3_600_000
        if i % 13 == 0:
            m["deliverAt"] = now - 1000  # due already: stored at once, deliverAt kept
        sent.append(m)
    receipts = produce(gateway, f"{topic}-p", sent)

    got = rows(reader(spark, gateway, topic, readBatchSize=7))
    assert got == expected(topic, read_all(gateway, topic))
    # Against what was produced, independently of /mq/read: one row per receipt, same fields.
    by_id = {r["messageId"]: r for r in got}
    assert len(by_id) == len(got) == len(sent)
    for m, receipt in zip(sent, receipts, strict=True):
        row = by_id[receipt["msgId"]]
        # One numbering: receipts, like the source and /mq/read, name store queues.
        assert (row["queue"], row["offset"]) == (receipt["queue"], receipt["offset"])
        assert row["body"] == m["message"] and row["keys"] == m["keys"]
        assert row["tags"] == m.get("tags", []) and row["properties"] == m.get("properties", {})
        assert row["priority"] == m.get("priority") and row["producer"] == f"{topic}-p"
        assert abs(row["timestamp"] - now) < 120_000
        assert (row["deadline"] is not None) == ("ttlMs" in m)
        assert row["deliverAt"] == m.get("deliverAt")
    assert {r["queue"] for r in got} == set(range(6))  # lane 1 is store queues 3..5


def test_starting_and_ending_offsets(spark: Any, gateway: Server) -> None:
    topic = unique("offs")
    gateway.setup_topic(topic, queues=3)
    produce(gateway, f"{topic}-p", [{"message": f"m{i}"} for i in range(30)])  # 10 per queue

    def positions(**options: Any) -> set[tuple[int, int]]:
        return {(r["queue"], r["offset"]) for r in rows(reader(spark, gateway, topic, **options))}

    assert positions(startingOffsets="earliest", endingOffsets="latest") == {
        (q, o) for q in range(3) for o in range(10)
    }
    # Unnamed queues: start earliest, end latest. -1 = latest.
    assert positions(startingOffsets='{"0": 4, "2": -1}', endingOffsets='{"0": 8, "1": 6}') == {
        (0, o) for o in range(4, 8)
    } | {(1, o) for o in range(6)}
    assert positions(startingOffsets="latest") == set()
    with pytest.raises(Exception, match="endingOffsets: offset 3 of queue 1 is before the starting offset 5"):
        positions(startingOffsets='{"1": 5}', endingOffsets='{"1": 3}')
    with pytest.raises(Exception, match="startingOffsets: queue 7 does not exist"):
        positions(startingOffsets='{"7": 0}')


def stream(spark: Any, server: Server, topic: str, token: str, consumer: str, per_trigger: int) -> Any:
    return (
        spark.readStream.format("mqgate")
        .option("gateway", server.url)
        .option("token", token)
        .option("consumer", consumer)
        .option("topic", topic)
        .option("maxMessagesPerTrigger", per_trigger)
        .load()
    )


def test_stream_available_now_bounded_batches_restart_and_new_messages(
    spark: Any, gateway: Server, tmp_path: Path
) -> None:
    """maxMessagesPerTrigger cuts exact batches; a failed batch is replayed with the same
    offsets after a restart; a later run picks up only what was produced since. foreachBatch
    commits progress with end_offsets/commit_progress, so the group's lag ends at 0."""
    topic = unique("stream")
    _, ctoken = gateway.setup_topic(topic, queues=3)
    job = f"spark-{topic}"
    gateway.admin("POST", "/admin/consumers", name=job, topic=topic)
    sent = [f"m{i}" for i in range(100)]
    produce(gateway, f"{topic}-p", [{"message": b} for b in sent])
    attempts: list[tuple[int, list[tuple[int, int, str]]]] = []
    failed: set[int] = set()

    def each(df: Any, batch_id: int) -> None:
        got = sorted(
            (r["queue"], r["offset"], r["body"]) for r in df.select("queue", "offset", "body").collect()
        )
        attempts.append((batch_id, got))
        if batch_id == 1 and not failed:
            failed.add(batch_id)
            raise RuntimeError("injected failure in batch 1")
        mqgate.spark.commit_progress(gateway.url, gateway.admin_token, job, mqgate.spark.end_offsets(df))

    def run() -> Any:
        q = (
            stream(spark, gateway, topic, ctoken, f"{topic}-c", 30)
            .writeStream.foreachBatch(each)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        return q

    q = run()
    with pytest.raises(Exception, match="injected failure"):
        q.awaitTermination(60)
    q = run()
    assert q.awaitTermination(60) is not False
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in q.recentProgress if p["numInputRows"] > 0]

    assert [b for b, _ in attempts] == [0, 1, 1, 2, 3]
    assert attempts[1][1] == attempts[2][1]  # the replay read exactly the same records
    final = [got for _, got in attempts[:1] + attempts[2:]]
    assert [len(g) for g in final] == [30, 30, 30, 10]
    everything = [r for g in final for r in g]
    assert sorted(b for _, _, b in everything) == sorted(sent)
    assert len(set(everything)) == 100
    assert len(ends) == 3  # batches 1 (replayed), 2 and 3 of the second run
    for earlier, later in itertools.pairwise(ends):
        assert list(earlier) == list(later) == ["0", "1", "2"]
        assert all(later[k] >= earlier[k] for k in earlier) and later != earlier
    assert gateway.admin("GET", f"/admin/consumers/{job}/progress")["lag"] == 0

    more = [f"n{i}" for i in range(25)]
    produce(gateway, f"{topic}-p", [{"message": b} for b in more])
    attempts.clear()
    q = run()
    assert q.awaitTermination(60) is not False
    assert [b for b, _ in attempts] == [4]
    assert sorted(b for _, _, b in attempts[0][1]) == sorted(more)
    assert gateway.admin("GET", f"/admin/consumers/{job}/progress")["lag"] == 0


def test_a_consumer_token_for_another_topic_is_refused(spark: Any, gateway: Server) -> None:
    topic = unique("mine")
    other = unique("theirs")
    _, ctoken = gateway.setup_topic(topic, queues=1)
    gateway.setup_topic(other, queues=1)
    df = (
        spark.read.format("mqgate")
        .option("gateway", gateway.url)
        .option("token", ctoken)
        .option("consumer", f"{topic}-c")
        .option("topic", other)
        .load()
    )
    with pytest.raises(Exception, match=r"HTTP 403: consumer \S+ reads topic"):
        df.collect()


def test_bad_options_fail_naming_the_option(spark: Any, gateway: Server) -> None:
    with pytest.raises(Exception, match="startingOffsets must be 'earliest' or 'latest' or a JSON"):
        reader(spark, gateway, "t", startingOffsets="yesterday").collect()
    q = stream(spark, gateway, "t", "x", "c", 0).writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match="option maxMessagesPerTrigger must be at least 1"):
            q.awaitTermination(30)
    finally:
        q.stop()


def test_store_read_equals_gateway_read(spark: Any, redis_gateway: Server) -> None:
    srv = redis_gateway
    topic = unique("redis")
    srv.setup_topic(topic, queues=4)
    produce(srv, f"{topic}-p", [{"message": f"m{i}", "keys": [str(i)], "tags": ["t"]} for i in range(500)])
    via_gateway = rows(reader(spark, srv, topic, readBatchSize=64))
    direct = (
        spark.read.format("mqgate")
        .option("store", "redis://127.0.0.1:6379/0")
        .option("redisPrefix", srv.env["MQGATE_REDIS_PREFIX"])
        .option("topic", topic)
        .option("readBatchSize", 64)
        .option("startingOffsets", '{"1": 3}')
        .load()
    )
    assert len(via_gateway) == 500
    assert rows(direct) == [r for r in via_gateway if r["queue"] != 1 or r["offset"] >= 3]
