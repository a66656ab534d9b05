"""mqgate.timeouts.wait_event: a cancellation is never swallowed, at whichever turn of the loop
it arrives relative to the event (CPython issue 86296: asyncio.wait_for on 3.11 returned
normally instead, and a background loop stopped then ran on: a trace indexer's close hung)."""

from __future__ import annotations

import asyncio

import pytest

from mqgate.timeouts import wait_event

TURNS = range(8)  # cancels at each of these turns of the loop after the event is set


async def cancelled_at(turns: int, set_event: bool) -> bool:
    """A loop waiting on an event (as the indexer's is) cancelled `turns` turns after the
    event is set (or, not set, around its time-out): whether it ended cancelled."""
    event = asyncio.Event()
    waiting = asyncio.Event()
    rounds = 0

    async def background() -> None:
        nonlocal rounds
        while True:
            waiting.set()
            await wait_event(event, 0.0 if not set_event else 60.0)
            event.clear()
            rounds += 1

    task = asyncio.create_task(background())
    await waiting.wait()
    if set_event:
        event.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    if not done:
        task.cancel()  # the swallowed one: stop it for good before the loop closes
        await asyncio.wait({task}, timeout=5)
        return False
    return task.cancelled()


@pytest.mark.parametrize("turns", TURNS)
def test_a_cancellation_as_the_event_is_set_stops_the_waiting_loop(turns: int) -> None:
    assert asyncio.run(cancelled_at(turns, set_event=True))


@pytest.mark.parametrize("turns", TURNS)
def test_a_cancellation_as_the_wait_times_out_stops_the_waiting_loop(turns: int) -> None:
    assert asyncio.run(cancelled_at(turns, set_event=False))


def test_the_answer_says_whether_the_event_was_set() -> None:
    async def go() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_event(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        woken = await wait_event(event, 60)
        already = await wait_event(event, 0)
        return timed_out, woken, already

    assert asyncio.run(go()) == (False, True, True)


def test_a_cancellation_a_librarys_wait_for_lost_stops_the_loop_at_its_next_wait() -> None:
    """`asyncio.wait_for` on 3.11 returns the inner result when the task is cancelled in the
    turn the inner future completes (redis-py sends each command within one): the loop goes on
    asked to stop; its next `wait_event` raises the cancellation."""

    async def go() -> tuple[bool, int]:
        sent = asyncio.get_running_loop().create_future()
        waiting = asyncio.Event()
        rounds = 0

        async def background() -> None:
            nonlocal rounds
            await asyncio.wait_for(sent, 60)  # a command's send, answered as the stop comes
            rounds += 1
            waiting.set()
            while True:
                await wait_event(asyncio.Event(), 60)
                rounds += 1

        task = asyncio.create_task(background())
        await asyncio.sleep(0)  # the task waits in wait_for
        sent.set_result(None)
        task.cancel()  # the same turn: wait_for swallows it on 3.11 (returns the result)
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=5)
        return bool(done) and task.cancelled(), rounds

    ended, rounds = asyncio.run(go())
    assert ended, "the loop went on waiting after its stop was lost"
    assert rounds <= 1
