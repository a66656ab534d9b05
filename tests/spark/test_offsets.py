"""Offset planning, options and Arrow conversion of the Spark source: pure, no Spark, no server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqgate.model import StoredMessage
from mqgate.spark import offsets as off
from mqgate.spark.arrow import ARROW_SCHEMA, Record, decode_read, decode_stored, to_batch
from mqgate.spark.offsets import Bounds, OptionError
from mqgate.spark.options import read_options, write_options
from mqgate.spark.sink import encode_rows

pytestmark = pytest.mark.slow

BOUNDS = [Bounds(0, 0, 10), Bounds(1, 5, 25), Bounds(2, 0, 0)]


def test_spark_offsets_keep_ascending_numeric_key_order() -> None:
    encoded = off.to_json({10: 1, 2: 5, 0: 7})
    assert json.dumps(encoded) == '{"0": 7, "2": 5, "10": 1}'
    assert off.from_json({"10": 1, "2": 5}) == {10: 1, 2: 5}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"x": 1}, "queue 'x' is not a number"),
        ({"-1": 1}, "not a queue number"),
        ({"0": "5"}, "must be an integer"),
        ({"0": True}, "must be an integer"),
        ({"0": -3}, "must be >= 0"),
    ],
)
def test_bad_json_offsets_name_the_option(value: dict[str, Any], fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment) as err:
        off.from_json(value, "startingOffsets")
    assert err.value.field == "startingOffsets" and "startingOffsets" in err.value.message


def test_resolve_earliest_latest_and_json_with_marks() -> None:
    assert off.resolve("earliest", BOUNDS, "s", off.EARLIEST) == {0: 0, 1: 5, 2: 0}
    assert off.resolve("latest", BOUNDS, "s", off.EARLIEST) == {0: 10, 1: 25, 2: 0}
    # Unnamed queues take `missing`; -2/-1 are earliest/latest; below min means min.
    assert off.resolve({0: -1, 1: 2}, BOUNDS, "s", off.EARLIEST) == {0: 10, 1: 5, 2: 0}
    assert off.resolve({1: -2}, BOUNDS, "e", off.LATEST) == {0: 10, 1: 5, 2: 0}
    with pytest.raises(OptionError, match="queue 3 does not exist"):
        off.resolve({3: 0}, BOUNDS, "startingOffsets", off.EARLIEST)
    with pytest.raises(OptionError, match="beyond its end 10"):
        off.resolve({0: 11}, BOUNDS, "endingOffsets", off.LATEST)
    with pytest.raises(OptionError, match="before the starting offset 7"):
        off.check_ordered({0: 7}, {0: 6}, "endingOffsets")


def test_parse_spec_words_and_errors() -> None:
    assert off.parse_spec(None, "startingOffsets", "earliest", ("earliest", "latest")) == "earliest"
    assert off.parse_spec(" LATEST ", "startingOffsets", "earliest", ("earliest", "latest")) == "latest"
    assert off.parse_spec('{"1": 4}', "startingOffsets", "earliest", ("earliest",)) == {1: 4}
    with pytest.raises(OptionError, match="endingOffsets must be 'latest' or a JSON object"):
        off.parse_spec("earliest", "endingOffsets", "latest", ("latest",))
    with pytest.raises(OptionError, match="endingOffsets is not valid JSON"):
        off.parse_spec("{1: 4}", "endingOffsets", "latest", ("latest",))


def test_ranges_skip_empty_queues_and_start_new_queues_at_zero() -> None:
    assert off.ranges({0: 3, 1: 5}, {0: 3, 1: 9, 2: 4}) == [off.QueueRange(1, 5, 9), off.QueueRange(2, 0, 4)]


def test_advance_takes_everything_without_a_limit_and_stops_at_the_target() -> None:
    start = {0: 0, 1: 5, 2: 0}
    assert off.advance(start, BOUNDS, None) == {0: 10, 1: 25, 2: 0}
    assert off.advance(start, BOUNDS, None, cap={0: 4, 1: 30, 2: 0}) == {0: 4, 1: 25, 2: 0}
    done = {0: 10, 1: 25, 2: 0}
    assert off.advance(done, BOUNDS, 7) == done  # nothing new: the same offset, so Spark stops


@settings(deadline=None, max_examples=200)
@given(
    backlogs=st.lists(st.integers(0, 500), min_size=1, max_size=12),
    mins=st.lists(st.integers(0, 50), min_size=12, max_size=12),
    limit=st.integers(1, 300),
)
def test_advance_reads_exactly_the_limit_in_ever_advancing_batches(
    backlogs: list[int], mins: list[int], limit: int
) -> None:
    bounds = [Bounds(q, mins[q], mins[q] + n) for q, n in enumerate(backlogs)]
    start: dict[int, int] = {q: 0 for q in range(len(bounds))}  # below min: retention removed them
    total = sum(backlogs)
    taken = 0
    batches = 0
    while True:
        end = off.advance(start, bounds, limit)
        assert list(end) == sorted(end)
        assert all(end[q] >= start[q] for q in start)
        n = sum(end[b.queue] - max(start[b.queue], b.min) for b in bounds if end[b.queue] > start[b.queue])
        if end == start:
            break
        assert n == min(limit, total - taken)
        taken += n
        start = end
        batches += 1
        assert batches <= total // limit + 2
    assert taken == total
    assert start == {b.queue: b.max for b in bounds}


def test_end_offsets_are_one_past_the_last_offset_per_queue() -> None:
    assert off.end_offsets([(0, 4), (1, 9), (0, 7), (0, 2)]) == {0: 8, 1: 10}


def test_reader_options_are_checked_with_the_option_named() -> None:
    base = {"gateway": "http://h:1", "token": "t", "topic": "orders"}
    ok = read_options(base, streaming=True)
    assert ok.read_batch == 10_000 and ok.starting == "earliest" and ok.ending is None
    cases: list[tuple[dict[str, str], bool, str]] = [
        ({"gateway": "http://h:1", "token": "t"}, False, "topic"),
        ({**base, "topic": "a b"}, False, "topic"),
        ({**base, "store": "redis://h"}, False, "gateway"),
        ({"topic": "x", "token": "t"}, False, "gateway"),
        ({**base, "gateway": "ftp://h"}, False, "gateway"),
        ({"store": "http://h", "topic": "x"}, False, "store"),
        ({"gateway": "http://h", "topic": "x"}, False, "token"),
        ({**base, "startingOffsets": "first"}, False, "startingOffsets"),
        ({**base, "endingOffsets": "latest"}, True, "endingOffsets"),
        ({**base, "maxMessagesPerTrigger": "0"}, True, "maxMessagesPerTrigger"),
        ({**base, "maxMessagesPerTrigger": "5"}, False, "maxMessagesPerTrigger"),
        ({**base, "readBatchSize": "20000"}, False, "readBatchSize"),
        ({**base, "readBatchSize": "many"}, False, "readBatchSize"),
        ({**base, "startingOffset": "latest"}, False, "startingOffset"),
    ]
    for options, streaming, name in cases:
        with pytest.raises(OptionError) as err:
            read_options(options, streaming)
        assert err.value.field == name and name in err.value.message, (options, err.value.message)


def test_writer_options_are_checked_with_the_option_named() -> None:
    base = {"gateway": "http://h:1", "token": "t", "producer": "p"}
    ok = write_options({**base, "progressConsumer": "spark-job", "checkpointLocation": "/ck"})
    assert ok.progress_token == "t" and ok.progress_gateway == "http://h:1"
    for options, name in (
        ({"token": "t", "producer": "p"}, "gateway"),
        ({"gateway": "http://h", "producer": "p"}, "token"),
        ({"gateway": "http://h", "token": "t"}, "producer"),
        ({**base, "progressConsumer": "no/slash"}, "progressConsumer"),
        ({**base, "produce": "x"}, "produce"),
    ):
        with pytest.raises(OptionError) as err:
            write_options(options)
        assert err.value.field == name and name in err.value.message


def _stored(i: int, **extra: Any) -> Record:
    return Record(f"id{i}", 1_700_000_000_000 + i, "p", f"body {i} é", (), (), {}, **extra)


def test_arrow_batches_match_the_spark_schema_and_the_records() -> None:
    msgs = [
        _stored(0),
        Record("id1", 5, "q", "x", ("k1", "k2"), ("t",), {"a": "1", "b": "2"}, priority=3),
        _stored(2, deadline_ms=99, deliver_at_ms=7),
    ]
    batch = to_batch("orders", "local", 4, 17, msgs)
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [17, 18, 19]
    assert {r["topic"] for r in rows} == {"orders"} and {r["queue"] for r in rows} == {4}
    assert rows[1]["keys"] == ["k1", "k2"] and rows[1]["tags"] == ["t"]
    assert rows[1]["properties"] == [("a", "1"), ("b", "2")] and rows[0]["properties"] == []
    assert [r["priority"] for r in rows] == [None, 3, None]
    assert rows[0]["body"] == "body 0 é" and rows[1]["producer"] == "q"
    ts = batch.column("timestamp").cast("int64").to_pylist()
    assert ts == [1_700_000_000_000_000, 5000, 1_700_000_000_002_000]
    assert batch.column("deadline").cast("int64").to_pylist() == [None, None, 99_000]
    assert batch.column("deliverAt").cast("int64").to_pylist() == [None, None, 7_000]
    assert to_batch("orders", "local", 0, 0, []).num_rows == 0


def test_read_answers_and_stored_records_decode_alike() -> None:
    import msgspec

    msgs = [_stored(0), Record("id1", 7, "p", "b", ("k",), (), {"a": "b"}, priority=2, deadline_ms=9)]
    # What the store keeps: StoredMessage's JSON, defaults omitted.
    payloads = [msgspec.json.encode(StoredMessage(**msgspec.structs.asdict(m))) for m in msgs]
    assert b"priority" not in payloads[0] and b'"deadline":9' in payloads[1]
    items = b",".join(
        p[:-1] + b',"broker":"local","queue":0,"offset":%d}' % (5 + i) for i, p in enumerate(payloads)
    )
    body = b'{"status":200,"message":"ok","result":{"offset":5,"next":7,"msgList":[' + items + b"]}}"
    assert decode_read(body) == (5, 7, msgs)
    assert decode_stored(payloads) == msgs


def test_sink_rows_become_produce_messages() -> None:
    import pyarrow as pa

    batch = pa.RecordBatch.from_pylist(
        [
            {
                "body": "a",
                "keys": ["k"],
                "tags": [],
                "properties": [("p", "v")],
                "orderKey": "o",
                "delayMs": 0,
            },
            {"body": "b", "keys": None, "tags": ["t"], "properties": [], "orderKey": None, "delayMs": 50},
        ],
        schema=pa.schema(
            [
                ("body", pa.string()),
                ("keys", pa.list_(pa.string())),
                ("tags", pa.list_(pa.string())),
                ("properties", pa.map_(pa.string(), pa.string())),
                ("orderKey", pa.string()),
                ("delayMs", pa.int64()),
            ]
        ),
    )
    encoded = [json.loads(m) for m in encode_rows(batch, "body")]
    assert encoded == [
        {"message": "a", "keys": ["k"], "properties": {"p": "v"}, "orderKey": "o", "delayMs": 0},
        {"message": "b", "tags": ["t"], "delayMs": 50},
    ]
