"""The micro-batch stages on Arrow batches: routing, the shuffle to tasks, the task input, reports.

The source batches are built by the mqgate source's own Arrow builder (mqgate.spark.arrow), so
the stages read exactly the columns Spark hands them.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import StructType

from mqgate.pipeline.config import parse_config
from mqgate.pipeline.dispatch import partition_tags, spread_of, task_of, worker_of
from mqgate.pipeline.executor import KIND_EVENTS, KIND_HOT, KIND_RETRY, TaskPlan, TaskReport
from mqgate.pipeline.hotkeys import REASON_LOAD, HotKey
from mqgate.pipeline.parsing import ParseFailure, SourceMessage, encode_internal, parse_message
from mqgate.pipeline.stages import (
    COLUMNS,
    ITEM_BATCH_SIZE,
    ITEM_PROGRESS,
    ROUTED_ARROW,
    ROUTED_SCHEMA,
    read_reports,
    report_batch,
    route_batches,
    run_batches,
    task_input,
)
from mqgate.spark.arrow import Record, to_batch
from mqgate.spark.schema import SCHEMA
from tests.spark.conftest import spark  # noqa: F401  (the one local Spark of the Spark tests)

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

CONFIG = parse_config(
    {
        "job": {"name": "vid", "gateway": "http://127.0.0.1:1", "admin_token": "t", "partitions": 16},
        "events": [
            {
                "type": "like",
                "topic": "likes",
                "key": "video.id",
                "table": "likes",
                "fields": {"user": "user"},
            },
            {"type": "view", "topic": "views", "format": "string", "table": "views"},
        ],
        "sink": {"url": "postgresql://postgres@127.0.0.1/db"},
    },
    {},
)
TS_MS = 1_700_000_000_000


def source_batch(
    queue: int, first: int, bodies: list[str], keys: tuple[str, ...] = (), topic: str = "likes"
) -> pa.RecordBatch:
    records = [Record(f"q{queue}-{first + i}", TS_MS, "p", body, keys) for i, body in enumerate(bodies)]
    return to_batch(topic, "b", queue, first, records).select(list(COLUMNS))


def like(video: str, user: str = "u") -> str:
    return json.dumps({"video": {"id": video}, "user": user})


def rows(batches: Iterator[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(list(batches))


def by_tag(table: pa.Table, tag: int) -> list[pa.RecordBatch]:
    """What the shuffle gives the task of `tag`."""
    return table.filter(pc.equal(table.column("tag"), tag)).to_batches()


def test_events_are_parsed_once_and_each_goes_to_its_workers_task() -> None:
    tags = partition_tags(4)
    batches = [
        source_batch(0, 7, [like("v1"), "oops", like("v2", "u2")]),
        source_batch(1, 3, [like(f"k{i}") for i in range(200)]),
    ]
    table = rows(route_batches(CONFIG, KIND_EVENTS, "like", tags, batches))
    inputs = [task_input(by_tag(table, tag)) for tag in tags]
    expected = []
    for b in batches:
        for r in b.to_pylist():
            message = SourceMessage(r["messageId"], r["body"], "likes", r["queue"], r["offset"], TS_MS)
            expected += parse_message(CONFIG.events[0], message)[0]
    got = {e.event_id: (worker, e) for t in inputs for worker, q in t.queues.items() for e in q}
    assert sorted(got) == sorted(e.event_id for e in expected)
    for e in expected:
        worker, event = got[e.event_id]
        assert event == e and worker == worker_of(e.key, 16)
    for task, t in enumerate(inputs):
        assert all(task_of(w, 4) == task for w in t.queues)
        assert t.batch_events == 202  # every task is told the batch's size
        # One queue's events keep their source order within a worker queue.
        for q in t.queues.values():
            offsets = [int(e.event_id.split("-")[1]) for e in q if e.event_id.startswith("q1-")]
            assert offsets == sorted(offsets)
    (failure,) = [f for t in inputs for f in t.failures]
    assert (failure.event_id, failure.payload, failure.source) == ("q0-8", "oops", "likes")
    assert "not JSON" in failure.error
    assert {q: n for t in inputs for q, n in t.ends.items()} == {0: 10, 1: 203}
    assert inputs[0].ends == {0: 10} and inputs[1].ends == {1: 203}


def test_message_keys_are_read_for_the_string_format() -> None:
    tags = partition_tags(2)
    batch = source_batch(0, 0, ["hello", "there"], keys=("v7", "x"), topic="views")
    table = rows(route_batches(CONFIG, KIND_EVENTS, "view", tags, [batch]))
    t = task_input(by_tag(table, tags[task_of(worker_of("v7", 16), 2)]))
    (events,) = t.queues.values()
    got = [(e.key, e.payload, e.fields, e.event_ms) for e in events]
    assert got == [("v7", "hello", {}, TS_MS), ("v7", "there", {}, TS_MS)]


def test_hot_and_retry_events_spread_and_keep_their_identity() -> None:
    message = SourceMessage("m1", like("hot"), "likes", 0, 0, TS_MS)
    (event,), _ = parse_message(CONFIG.events[0], message)
    items = []
    for i in range(1600):
        event.event_id = f"m{i}"
        items.append(encode_internal(event, attempts=2))
    records = [
        Record(f"x{i}", TS_MS, "p", m["message"], tuple(m["keys"]), (), m["properties"])
        for i, m in enumerate(items)
    ]
    batch = to_batch("vid-retry", "b", 0, 0, records).select(list(COLUMNS))
    tags = partition_tags(2)
    for kind, attempts in ((KIND_HOT, 2), (KIND_RETRY, 3)):
        table = rows(route_batches(CONFIG, kind, "", tags, [batch]))
        assert ITEM_BATCH_SIZE not in table.column("item").to_pylist()
        inputs = [task_input(by_tag(table, s)) for s in tags]
        events = [(w, e) for t in inputs for w, q in t.queues.items() for e in q]
        workers = Counter(w for w, _ in events)
        assert len(workers) == 16 and max(workers.values()) < 140
        assert all(w == spread_of(e.event_id, 16) for w, e in events)
        (e0,) = [e for _, e in events if e.event_id == "m0"]
        got = (e0.key, e0.fields, e0.attempts, e0.source, e0.origin)
        assert got == ("hot", {"user": "u"}, attempts, "vid-retry", "likes")


def test_a_task_report_survives_the_trip_to_the_driver() -> None:
    hot = [HotKey("k", 4, 2, REASON_LOAD)]
    report = TaskReport(
        events=5,
        applied=3,
        ends={0: 7, 3: 1},
        key_seconds={"k": 0.5},
        worker_seconds={2: 1.5},
        errors=["x"],
        hot=hot,
    )
    assert read_reports(pa.Table.from_batches([report_batch(report)])) == [report]


def test_a_task_without_events_reports_its_progress() -> None:
    tags = partition_tags(1)
    routed = list(route_batches(CONFIG, KIND_EVENTS, "like", tags, [source_batch(2, 0, [])]))
    # No rows at all: no progress either, and a report of nothing.
    assert sum(b.num_rows for b in routed) == 1 and routed[0].column("item").to_pylist() == [ITEM_BATCH_SIZE]
    plan = TaskPlan(CONFIG, KIND_EVENTS)
    row = {"tag": tags[0], "item": ITEM_PROGRESS, "queue": 2, "number": 9}
    progress = pa.RecordBatch.from_pylist([row], schema=ROUTED_ARROW)
    (report,) = read_reports(pa.Table.from_batches(list(run_batches(plan, [progress]))))
    assert report == TaskReport(ends={2: 9})


def _queue_ranges(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Source rows: 500 likes at offsets 0.. of each queue in the input's `id` column."""
    for batch in batches:
        for queue in batch.column("id").to_pylist():
            yield source_batch(queue, 0, [like(f"v{i % 97}") for i in range(500)])


def _check_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stands in for run_batches inside Spark: what did this partition get?"""
    table = pa.Table.from_batches(list(batches), schema=ROUTED_ARROW)
    got = task_input(table.to_batches())
    seen = sorted(set(table.column("tag").to_pylist()))
    # Within a worker queue, each source queue's events in offset order (ids are q<queue>-<offset>).
    positions = [[tuple(map(int, e.event_id[1:].split("-"))) for e in q] for q in got.queues.values()]
    in_order = all([o for q, o in p if q == queue] == sorted(o for q, o in p if q == queue)
                   for p in positions for queue in range(3))  # fmt: skip
    summary = {
        "in_order": in_order,
        "tags": seen,
        "workers": sorted(got.queues),
        "events": sum(map(len, got.queues.values())),
        "batch_events": got.batch_events,
        "ends": sorted(got.ends.items()),
    }
    yield pa.RecordBatch.from_pylist([{"summary": json.dumps(summary)}])


def test_the_shuffle_gives_each_spark_task_exactly_its_worker_queues(spark: Any) -> None:  # noqa: F811
    tasks = 4
    tags = partition_tags(tasks)
    # One partition per source queue range, as the mqgate source reads them.
    schema = StructType([SCHEMA[name] for name in COLUMNS])
    source = spark.range(0, 3, numPartitions=3).mapInArrow(_queue_ranges, schema)
    routed = source.mapInArrow(
        functools.partial(route_batches, CONFIG, KIND_EVENTS, "like", tags), ROUTED_SCHEMA
    )
    answers = (
        routed.repartition(tasks, "tag")
        .mapInArrow(_check_task, "summary string")
        .toArrow()
        .column("summary")
        .to_pylist()
    )
    summaries = sorted((json.loads(a) for a in answers), key=lambda s: s["tags"])
    assert sorted(s["tags"][0] for s in summaries) == sorted(tags)
    assert all(len(s["tags"]) == 1 for s in summaries)  # one task per partition, none shares one
    for s in summaries:
        task = tags.index(s["tags"][0])
        assert s["workers"] and all(task_of(w, tasks) == task for w in s["workers"])
        assert s["batch_events"] == 1500
        assert s["in_order"]
    assert sum(s["events"] for s in summaries) == 1500
    assert sorted(e for s in summaries for e in map(tuple, s["ends"])) == [(0, 500), (1, 500), (2, 500)]


def test_parse_failure_rows_are_failures() -> None:
    tags = partition_tags(1)
    table = rows(route_batches(CONFIG, KIND_EVENTS, "like", tags, [source_batch(0, 0, ["[1]"])]))
    assert task_input(table.to_batches()).failures == [
        ParseFailure("q0-0", "like", "[1]", "parse: expected a JSON object, got list", "likes")
    ]
