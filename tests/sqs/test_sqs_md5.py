"""The MD5 digests SQS sends with each message, against AWS's documented algorithm.

botocore no longer checks them (it has no MD5OfMessageAttributes handler), so the reference here
is the algorithm written out byte by byte ("Calculating the MD5 message digest for message
attributes", SQS Developer Guide), with one digest worked out by hand from its bytes.
"""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from mqgate.sqs.md5 import md5_of_body, md5_of_message_attributes, md5_of_message_system_attributes


def test_body_digest_is_md5_of_utf8() -> None:
    assert md5_of_body("hello") == "5d41402abc4b2a76b9719d911017c592"
    assert md5_of_body("✓") == hashlib.md5("✓".encode()).hexdigest()


def test_attribute_digest_of_a_hand_built_buffer() -> None:
    attrs = {
        "b": {"DataType": "Binary", "BinaryValue": b"\x01\x02"},
        "a": {"DataType": "String", "StringValue": "hé"},
    }
    # Sorted by name: "a" then "b"; each of name, type, value as a 4-byte length and its bytes,
    # the transport byte (1 string, 2 binary) between type and value.
    buffer = (
        b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x06String" + b"\x01" + b"\x00\x00\x00\x03h\xc3\xa9"
        + b"\x00\x00\x00\x01b" + b"\x00\x00\x00\x06Binary" + b"\x02" + b"\x00\x00\x00\x02\x01\x02"
    )  # fmt: skip
    assert md5_of_message_attributes(attrs) == hashlib.md5(buffer).hexdigest()


def test_no_attributes_no_digest() -> None:
    assert md5_of_message_attributes({}) is None
    assert md5_of_message_attributes(None) is None
    assert md5_of_message_system_attributes({}) is None


def test_system_attributes_use_the_same_algorithm() -> None:
    trace = {
        "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793"}
    }
    assert md5_of_message_system_attributes(trace) == md5_of_message_attributes(trace)


def _reference(attrs: dict[str, dict[str, object]]) -> str:
    def field(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    out = b""
    for name in sorted(attrs):
        value = attrs[name]
        out += field(name.encode()) + field(str(value["DataType"]).encode())
        if "StringValue" in value:
            out += b"\x01" + field(str(value["StringValue"]).encode())
        else:
            blob = value["BinaryValue"]
            assert isinstance(blob, bytes)
            out += b"\x02" + field(blob)
    return hashlib.md5(out).hexdigest()


_TYPES = st.sampled_from(["String", "Number", "String.x"])
_VALUES = st.one_of(
    st.builds(lambda t, s: {"DataType": t, "StringValue": s}, _TYPES, st.text(min_size=1)),
    st.builds(lambda b: {"DataType": "Binary", "BinaryValue": b}, st.binary(min_size=1)),
)  # fmt: skip


@given(
    st.dictionaries(st.from_regex(r"[A-Za-z0-9_]{1,20}", fullmatch=True), _VALUES, min_size=1, max_size=10)
)
def test_matches_the_reference_algorithm(attrs: dict[str, dict[str, object]]) -> None:
    assert md5_of_message_attributes(attrs) == _reference(attrs)
