"""The HTTP protocol's answer writes (api/protocol.py: _HeadWithBody): a response's head goes
out with the first part of its body in one write; a head alone (a stream's) at the end of the
turn of the loop; nothing is reordered or lost when the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

from mqgate.api.protocol import _HeadWithBody


class _Recording(asyncio.Transport):
    """The transport under the wrapper: what was written, in order, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


def test_head_and_body_go_in_one_write_and_later_parts_as_they_come() -> None:
    async def case() -> list[bytes]:
        real = _Recording()
        t = _HeadWithBody(real, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b"body-1")
        t.write(b"body-2")
        await asyncio.sleep(0)
        return real.writes

    assert asyncio.run(case()) == [b"HTTP/1.1 200 OK\r\n\r\nbody-1", b"body-2"]


def test_a_head_without_a_body_in_the_same_turn_is_sent_at_its_end_and_not_again() -> None:
    async def case() -> list[list[bytes]]:
        real = _Recording()
        t = _HeadWithBody(real, asyncio.get_running_loop())
        t.write(b"head")
        seen = [list(real.writes)]
        await asyncio.sleep(0)
        seen.append(list(real.writes))
        t.write(b"event")
        await asyncio.sleep(0)
        seen.append(list(real.writes))
        return seen

    assert asyncio.run(case()) == [[], [b"head"], [b"head", b"event"]]


def test_close_sends_a_held_head_first_and_other_calls_reach_the_transport() -> None:
    async def case() -> tuple[list[bytes], bool, Any]:
        real = _Recording()
        t = _HeadWithBody(real, asyncio.get_running_loop())
        t.write(b"head")
        t.close()
        await asyncio.sleep(0)
        return real.writes, t.is_closing(), t.get_extra_info("peername")

    assert asyncio.run(case()) == ([b"head"], True, ("127.0.0.1", 1))
