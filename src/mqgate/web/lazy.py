"""An ASGI app made at its first request."""

from __future__ import annotations

from collections.abc import Callable

from mqgate.web.asgi import ASGIApp, Receive, Scope, Send


class MadeOnFirstRequest:
    """A door most gateways never open (the SQS and Aliyun edges) is built, its modules
    imported, when its first request comes: a start imports only what every gateway serves."""

    __slots__ = ("_app", "_make")

    def __init__(self, make: Callable[[], ASGIApp]) -> None:
        self._make = make
        self._app: ASGIApp | None = None

    @property
    def made(self) -> bool:
        return self._app is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        if app is None:
            app = self._app = self._make()
        await app(scope, receive, send)
