"""Coroutines started eagerly: the first step runs at once, in the caller, as Python 3.12's
eager tasks do, without a task or a turn of the loop for a call that ends in it.

Why: on the embedded store most backend calls (a queue's bounds, a lease) finish without ever
waiting, and `asyncio.gather` would make a task, and a turn of the loop, for each. And a call
whose effect is applied in its first step (an ack on the embedded or remote offset store) can
go on waiting for its fsync while the caller does other work, in the order it was called.

Nothing here makes a task: the rest of a started coroutine runs when it is awaited, in the
awaiting task, as `await coro` would have run it.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Started(Generic[T]):
    """A coroutine whose first step has run: awaiting it (once) runs the rest."""

    __slots__ = ("_coro", "_ended", "_error", "_value", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro: Coroutine[Any, Any, T] | None = coro
        self._yielded: Any = None
        self._value: T | None = None
        self._error: BaseException | None = None
        self._ended = False
        try:
            self._yielded = coro.send(None)
        except StopIteration as done:
            self._value, self._ended, self._coro = done.value, True, None
        except BaseException as exc:  # raised where it is awaited, as `await coro` would
            self._error, self._ended, self._coro = exc, True, None

    @property
    def ended(self) -> bool:
        """Whether the first step was the whole call (awaiting it then never waits)."""
        return self._ended

    def __await__(self) -> Generator[Any, Any, T]:
        if self._ended:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            return self._value  # type: ignore[return-value]
        coro = self._coro
        assert coro is not None, "a started coroutine is awaited once"
        self._coro = None
        yielded = self._yielded
        # What `yield from coro` does, from where the first step stopped: the awaiting task
        # waits on what the coroutine waits on, and passes back what it is given or thrown.
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Never to be awaited: the coroutine is closed (its `finally` blocks run)."""
        if self._coro is not None:
            self._coro.close()
            self._coro = None


def start(coro: Coroutine[Any, Any, T]) -> Started[T]:
    """`coro` with its first step run now; await the result for the rest."""
    return Started(coro)


async def gather_started(*coros: Coroutine[Any, Any, Any]) -> list[Any]:
    """`asyncio.gather` for short calls that mostly end in their first step: each is started
    in turn (a network call has sent its request), then each awaited in order, in this task
    (a timeout a call entered stays in the task it began in). No task, no turn of the loop
    when each ended in its first step. An error, the first, is raised once all have ended."""
    started = [Started(c) for c in coros]
    out: list[Any] = []
    error: BaseException | None = None
    for s in started:
        try:
            out.append(await s)
        except BaseException as exc:  # the others still end, as gather lets them
            if error is None:
                error = exc
    if error is not None:
        raise error
    return out
