"""The request scope of per-project routing (clusters/routing.py): which cluster each project
of the current request was served by. Kept apart so the services can open a scope without
importing the cluster machinery."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

# project -> cluster pinned in the current request scope (None: not in a scope).
pins: ContextVar[dict[str, str] | None] = ContextVar("mqgate_cluster_pins", default=None)


@contextlib.contextmanager
def request_scope() -> Iterator[None]:
    """Pin each project's cluster at its first routed call until the block ends."""
    token = pins.set({})
    try:
        yield
    finally:
        pins.reset(token)
