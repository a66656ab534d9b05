"""A held message is encoded once: delivering it appends its destination's QoS fields to the
bytes the scheduler holds, and the result is what encoding the whole message gives."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from mqgate.model import StoredMessage
from mqgate.scheduler.interface import Destination
from mqgate.services.qos import delivered_form, held_payload

text = st.text(max_size=20)
messages = st.builds(
    StoredMessage,
    msg_id=text,
    timestamp_ms=st.integers(0, 2**47),
    producer=text,
    body=text,
    keys=st.lists(text, max_size=3),
    tags=st.lists(text, max_size=3),
    properties=st.dictionaries(text, text, max_size=3),
    priority=st.one_of(st.none(), st.integers(1, 9)),  # a redelivered message carries its QoS
    deliver_at_ms=st.one_of(st.none(), st.integers(0, 2**47)),
    deadline_ms=st.one_of(st.none(), st.integers(1, 2**47)),
)
destinations = st.builds(
    Destination,
    target=st.just("t:x"),
    deliver_at_ms=st.integers(0, 2**47),
    deadline_ms=st.integers(0, 2**47),
    priority=st.integers(0, 9),
)


@given(messages, destinations, st.one_of(st.none(), text.filter(bool)))
def test_delivered_bytes_equal_encoding_the_whole_message(
    m: StoredMessage, d: Destination, order_key: str | None
) -> None:
    (timestamp_ms, payload), key = delivered_form(held_payload(m, order_key), d)
    whole = msgspec.structs.replace(
        m, priority=d.priority or None, deliver_at_ms=d.deliver_at_ms, deadline_ms=d.deadline_ms or None
    )
    assert payload == msgspec.json.encode(whole)
    assert timestamp_ms == m.timestamp_ms and key == order_key
    assert msgspec.json.decode(payload, type=StoredMessage) == whole


@given(messages, destinations)
def test_payloads_held_by_the_previous_version_still_deliver(m: StoredMessage, d: Destination) -> None:
    old = msgspec.msgpack.encode((msgspec.json.encode(m), "k"))  # (stored JSON, order key)
    (timestamp_ms, payload), key = delivered_form(old, d)
    whole = msgspec.structs.replace(
        m, priority=d.priority or None, deliver_at_ms=d.deliver_at_ms, deadline_ms=d.deadline_ms or None
    )
    assert payload == msgspec.json.encode(whole) and timestamp_ms == m.timestamp_ms and key == "k"
