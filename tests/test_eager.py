"""Eagerly started coroutines (mqgate/eager.py): the first step at once, the rest when awaited,
in the awaiting task; gather_started as gather for short calls."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from mqgate.eager import gather_started, start


def in_a_loop(case: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(case)
    def run() -> None:
        asyncio.run(case())

    return run


async def _ends_at_once(log: list[str], value: int) -> int:
    log.append(f"ran {value}")
    return value


async def _waits(log: list[str], gate: asyncio.Future[int]) -> int:
    log.append("before")
    got = await gate
    log.append("after")
    return got * 2


async def _fails_at_once() -> int:
    raise ValueError("first step")


@in_a_loop
async def test_the_first_step_runs_before_start_returns_and_a_call_that_ends_in_it_needs_no_turn() -> None:
    log: list[str] = []
    started = start(_ends_at_once(log, 7))
    assert log == ["ran 7"] and started.ended
    assert await started == 7


@in_a_loop
async def test_the_rest_runs_when_awaited_with_what_the_call_waited_on() -> None:
    log: list[str] = []
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    started = start(_waits(log, gate))
    assert log == ["before"] and not started.ended
    asyncio.get_running_loop().call_soon(gate.set_result, 21)
    assert await started == 42
    assert log == ["before", "after"]


@in_a_loop
async def test_an_error_of_the_first_step_is_raised_where_it_is_awaited() -> None:
    started = start(_fails_at_once())
    assert started.ended
    with pytest.raises(ValueError, match="first step"):
        await started


@in_a_loop
async def test_a_cancel_reaches_the_call_and_its_finally_runs() -> None:
    cleaned = asyncio.Event()

    async def long() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    async def waiter() -> None:
        await start(long())

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


@in_a_loop
async def test_a_timeout_entered_in_the_first_step_belongs_to_the_awaiting_task() -> None:
    async def slow() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        return "no"

    assert await start(slow()) == "timed out"


@in_a_loop
async def test_gather_started_answers_in_order_and_overlaps_the_waits() -> None:
    log: list[str] = []
    loop = asyncio.get_running_loop()
    gates = [loop.create_future() for _ in range(2)]
    gathering = asyncio.ensure_future(
        gather_started(_waits(log, gates[0]), _ends_at_once(log, 5), _waits(log, gates[1]))
    )
    await asyncio.sleep(0)
    assert log == ["before", "ran 5", "before"]  # every call began before any was awaited
    gates[1].set_result(2)
    gates[0].set_result(1)
    assert await gathering == [2, 5, 4]


@in_a_loop
async def test_gather_started_raises_the_first_error_once_every_call_has_ended() -> None:
    log: list[str] = []
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(gate.set_result, 1)
    with pytest.raises(ValueError, match="first step"):
        await gather_started(_fails_at_once(), _waits(log, gate))
    assert log == ["before", "after"]
