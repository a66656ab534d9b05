"""A query string's fields (api/decoding.py: query_fields): its path without unquoting gives
what `dict(parse_qsl(...))` gives, on any text; invalid UTF-8 is a 400 naming the query."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqgate.api.decoding import query_fields
from mqgate.errors import BadRequest


def reference(query: bytes) -> dict[str, str] | str:
    try:
        return dict(parse_qsl(query.decode("utf-8"), errors="strict"))
    except UnicodeDecodeError:
        return "refused"


def ours(query: bytes) -> dict[str, str] | str:
    try:
        return query_fields(query)
    except BadRequest as exc:
        assert exc.field == "query"
        return "refused"


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ab=&%+2F0xé;", max_size=24))
def test_the_fields_are_parse_qsls_on_any_text(text: str) -> None:
    assert ours(text.encode()) == reference(text.encode())


@pytest.mark.parametrize(
    "query",
    [
        b"topic=t&consumer=c&max=100&requestId=AbC-_9",
        b"a=1&a=2&b=&c&=x&&",
        b"name=%C3%A9t%C3%A9&x=a+b",
        b"bad=%FF",
        b"\xff=1",
    ],
)
def test_the_usual_and_the_odd_queries(query: bytes) -> None:
    assert ours(query) == reference(query)
