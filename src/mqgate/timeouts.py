"""Waiting on an event with a time limit, cancellable at every instant.

`asyncio.wait_for(event.wait(), t)` on Python 3.11 swallows a cancellation that arrives in the
same turn of the loop as the event (or its time-out): CPython issue 86296, fixed by the rewrite
in 3.12. A background loop stopped at that moment keeps running and whoever awaits its task
hangs (a trace indexer's close, seen in the suite). `asyncio.timeout` counts the cancellations
it makes itself, so an outside one always propagates.

A library's `wait_for` loses a cancellation all the same (redis-py sends each command within
one): the task goes on, asked to stop (`Task.cancelling()`) but never told. `wait_event`, where
every background loop of the gateway waits between rounds, raises it then (a lag pass's Redis
call lost one and the suite's stop of the loop hung).
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether `event` was set within `timeout_s` (at once when it is set already)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("a cancellation a library's wait_for lost")
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(timeout_s, 0.0)):
            await event.wait()
    except TimeoutError:
        return False
    return True
