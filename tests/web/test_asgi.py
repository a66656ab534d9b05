"""Reading a request's body within its limit (mqgate.web.asgi)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mqgate.errors import PayloadTooLarge
from mqgate.web.asgi import read_body

MIB = 1024 * 1024


def chunks(*sizes: int) -> Any:
    """An ASGI receive that hands out body chunks of these sizes, the last without more_body,
    and fails the test if it is asked for anything after the last one (a real server would
    wait there for the client's disconnect: the request would hang)."""
    messages = [
        {"type": "http.request", "body": b"x" * size, "more_body": i < len(sizes) - 1}
        for i, size in enumerate(sizes)
    ]

    async def receive() -> dict[str, Any]:
        assert messages, "read past the body's last chunk"
        return messages.pop(0)

    return receive


def test_a_body_whose_last_chunk_crosses_the_limit_is_refused_at_once() -> None:
    with pytest.raises(PayloadTooLarge) as refused:
        asyncio.run(read_body(chunks(4 * MIB, 2 * MIB), {}, 5 * MIB))
    assert refused.value.field == "body" and "5242880-byte limit" in refused.value.message


def test_a_body_crossing_the_limit_early_is_drained_then_refused() -> None:
    receive = chunks(3 * MIB, 3 * MIB, 3 * MIB, 1)
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_body(receive, {}, 5 * MIB))
    with pytest.raises(AssertionError, match="past the body's last chunk"):
        asyncio.run(receive())  # every chunk was read: the client can read the 413


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_body(chunks(10), {b"content-length": b"6000000"}, 5 * MIB))


def test_a_body_within_the_limit_is_read_whole() -> None:
    assert asyncio.run(read_body(chunks(MIB, MIB, 0), {}, 5 * MIB)) == b"x" * (2 * MIB)
