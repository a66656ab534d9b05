"""An ASGI app made at its first request."""

from __future__ import annotations

from collections.abc import Callable

from mqgate.web.asgi import ASGIApp, Receive, Scope, Send


class MadeOnFirstRequest:
    """A door most gateways never open (the SQS and Aliyun edges), or one no first request needs
    (the console), is built, its modules imported, when its first request comes: a start does
    only what the data path needs."""

    __slots__ = ("_app", "_make")

    def __init__(self, make: Callable[[], ASGIApp]) -> None:
        self._make = make
        self._app: ASGIApp | None = None

    @property
    def made(self) -> bool:
        return self._app is not None

    @property
    def app(self) -> ASGIApp:
        """The app, made now if no request made it yet."""
        if self._app is None:
            self._app = self._make()
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await (self._app or self.app)(scope, receive, send)
