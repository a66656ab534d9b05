"""The FOUND answer is assembled from stored bytes (api/routes_data.py: found_body): it must be
the JSON a decoder reads back, whatever the names hold (a retry queue's `%RETRY%` source)."""

from __future__ import annotations

import msgspec

from mqgate.api.routes_data import found_body
from mqgate.model import StoredMessage, encode_stored
from mqgate.services.consume import FOUND, PullResult


def _stored(i: int) -> bytes:
    return encode_stored(StoredMessage(f"id-{i}", 1_700_000_000_000 + i, "p", f"body %d {i}", [], [], {}))


def test_every_message_gets_its_delivery_fields_and_names_with_percent_stay_as_they_are() -> None:
    result = PullResult(
        FOUND,
        request_id="tok",
        queue=3,
        source="%RETRY%c%s",
        messages=[(10, _stored(1)), (11, _stored(2))],
        reconsume_times=2,
        pop_time_ms=1234,
        ack="ok",
    )
    answer = msgspec.json.decode(found_body(result, "broker-%d"))
    assert answer["result"]["requestId"] == "tok" and answer["result"]["ack"] == "ok"
    got = answer["result"]["msgList"]
    assert [m["offset"] for m in got] == [10, 11]
    assert [m["message"] for m in got] == ["body %d 1", "body %d 2"]
    for m in got:
        assert (m["broker"], m["source"], m["queue"]) == ("broker-%d", "%RETRY%c%s", 3)
        assert (m["reconsumeTimes"], m["popTime"]) == (2, 1234)


def test_a_message_of_the_consumers_topic_has_no_source_and_no_ack_without_one() -> None:
    result = PullResult(FOUND, request_id="t", queue=0, messages=[(0, _stored(0))])
    answer = msgspec.json.decode(found_body(result, "b"))["result"]
    (m,) = answer["msgList"]
    assert "source" not in m and m["offset"] == 0 and "ack" not in answer
