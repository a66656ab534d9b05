"""An answer's byte budget (`max_answer_bytes`): the first items that fit, at least one.

One rule for every answer that could grow without bound: a pull's messages
(`services/consume.py: fitting`), and each page of the admin API's lists (`api/paging.py`). An
item larger than the budget on its own is still answered, alone, so the caller always moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def within_budget(
    items: Iterable[T], budget: int, size: Callable[[T], int], limit: int | None = None
) -> tuple[list[T], bool]:
    """The first of `items` (at most `limit`) whose sizes add up to at most `budget`, at least
    one; and whether any item was left over (the answer stopped before the end). `items` is read
    lazily: at most one item past those taken."""
    taken: list[T] = []
    total = 0
    for item in items:
        if limit is not None and len(taken) >= limit:
            return taken, True
        total += size(item)
        if taken and total > budget:
            return taken, True
        taken.append(item)
    return taken, False
