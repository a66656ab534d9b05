"""The `mqgate` Spark sink against a real gateway: batch and streaming writes read back
exactly, and the streaming sink's progress commit for a consumer group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mqgate.spark
from mqgate.spark.sink import MqgateStreamWriter, WriteCommit
from tests.conftest import Server
from tests.spark.conftest import produce, read_all, unique

pytestmark = pytest.mark.slow


def progress(server: Server, consumer: str) -> dict[str, Any]:
    return server.admin("GET", f"/admin/consumers/{consumer}/progress")  # type: ignore[no-any-return]


def test_batch_writer_produces_every_row(spark: Any, gateway: Server) -> None:
    topic = unique("out")
    gateway.setup_topic(topic, queues=4)
    data = [
        (f"row {i}", [f"k{i}"], ["t"] if i % 2 else [], {"i": str(i)} if i % 3 else {}, f"o{i % 5}")
        for i in range(2500)
    ]
    df = spark.createDataFrame(
        data,
        "body string, keys array<string>, tags array<string>, properties map<string,string>, orderKey string",
    ).repartition(3)
    (
        df.write.format("mqgate")
        .option("gateway", gateway.url)
        .option("producer", f"{topic}-p")
        .option("token", gateway.admin_token)
        .mode("append")
        .save()
    )
    stored = read_all(gateway, topic)
    got = sorted((m["message"], m["keys"], m["tags"], m["properties"]) for m in stored)
    assert got == sorted((b, k, t, p) for b, k, t, p, _ in data)
    # One order key, one queue, in the order each Spark partition wrote them.
    queues: dict[str, set[int]] = {}
    for m in stored:
        queues.setdefault(f"o{int(m['message'].split()[1]) % 5}", set()).add(m["queue"])
    assert all(len(qs) == 1 for qs in queues.values())


def test_batch_writer_needs_a_body_column(spark: Any, gateway: Server) -> None:
    df = spark.createDataFrame([("x",)], "text string")
    writer = (
        df.write.format("mqgate").option("gateway", gateway.url).option("token", "t").option("producer", "p")
    )
    with pytest.raises(Exception, match="needs a string column body"):
        writer.mode("append").save()


def test_stream_copy_with_progress_commit_is_exact_and_never_goes_back(
    spark: Any, gateway: Server, tmp_path: Path
) -> None:
    source = unique("src")
    target = unique("dst")
    gateway.setup_topic(source, queues=2)
    gateway.setup_topic(target, queues=3)
    job = f"spark-{source}"
    ctoken = gateway.admin("POST", "/admin/consumers", name=job, topic=source)["token"]
    sent = [f"m{i}" for i in range(60)]
    produce(gateway, f"{source}-p", [{"message": b, "tags": ["x"]} for b in sent])
    assert progress(gateway, job)["lag"] == 60
    state = tmp_path / "progress"

    def run() -> Any:
        return (
            spark.readStream.format("mqgate")
            .option("gateway", gateway.url)
            .option("token", ctoken)
            .option("consumer", job)
            .option("topic", source)
            .option("maxMessagesPerTrigger", 25)
            .load()
            .writeStream.format("mqgate")
            .option("gateway", gateway.url)
            .option("producer", f"{target}-p")
            .option("token", gateway.admin_token)
            .option("progressConsumer", job)
            .option("progressStateDir", str(state))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )

    q = run()
    assert q.awaitTermination(60) is not False
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [25, 25, 10]
    copied = read_all(gateway, target)
    assert sorted(m["message"] for m in copied) == sorted(sent) and all(m["tags"] == ["x"] for m in copied)
    before = progress(gateway, job)
    assert before["lag"] == 0 and sum(q["committed"] for q in before["queues"]) == 60

    # The sink remembered the last batch it committed, per query.
    (log,) = state.glob(f"{job}-*.json")
    assert json.loads(log.read_text()) == {"batchId": 2}
    writer = MqgateStreamWriter(
        {
            "gateway": gateway.url,
            "producer": f"{target}-p",
            "token": gateway.admin_token,
            "progressConsumer": job,
            "progressStateDir": str(state),
        },
        spark.createDataFrame([("x",)], "body string").schema,
    )
    query_id = str(q.id)
    # A replayed batch id is skipped; a newer batch with lower offsets cannot lower them either.
    writer.commit([WriteCommit(5, {0: 1, 1: 1}, query_id)], 1)
    assert json.loads(log.read_text()) == {"batchId": 2}
    writer.commit([WriteCommit(5, {0: 1, 1: 1}, "another-query")], 0)
    assert len(list(state.glob(f"{job}-*.json"))) == 2
    assert mqgate.spark.commit_progress(gateway.url, gateway.admin_token, job, {0: 2}) == {0: 30}
    assert progress(gateway, job)["queues"] == before["queues"]

    # New messages since: a second run copies them only and commits them.
    produce(gateway, f"{source}-p", [{"message": f"n{i}"} for i in range(7)])
    q = run()
    assert q.awaitTermination(60) is not False
    assert sorted(m["message"] for m in read_all(gateway, target)) == sorted(
        sent + [f"n{i}" for i in range(7)]
    )
    assert progress(gateway, job)["lag"] == 0
