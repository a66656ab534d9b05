"""The request scope of per-project routing (failover/routing.py): which cluster each project
of the current request was served by. Kept apart so the services can open a scope without
importing the cluster machinery."""

from __future__ import annotations

from contextvars import ContextVar, Token

# project -> cluster pinned in the current request scope (None: not in a scope).
pins: ContextVar[dict[str, str] | None] = ContextVar("mqgate_cluster_pins", default=None)


class request_scope:
    """Pin each project's cluster at its first routed call until the block ends. A class, not
    a generator: it is on every produce and pull."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token: Token[dict[str, str] | None] = pins.set({})

    def __exit__(self, *exc: object) -> None:
        pins.reset(self._token)
