"""The seam for signing in elsewhere (OIDC, later).

Password sign-in is built in. Another provider sends the browser to its own sign-in page
(`start_url`) and comes back to `/console/signin/<name>/callback`, where `finish` reads the
callback and names the user it vouches for. That user must exist in the console with this
provider (`mqgate user add NAME --provider NAME`, roles as usual); the console then opens a
session exactly as after a password sign-in.
"""

from __future__ import annotations

from typing import Protocol

from mqgate.web.request import Request


class IdentityProvider(Protocol):
    @property
    def name(self) -> str:
        """Short name in URLs and on users (e.g. "oidc")."""

    @property
    def label(self) -> str:
        """What the sign-in button says."""

    def start_url(self, callback_url: str, state: str) -> str:
        """Where the browser goes to sign in; the provider returns to `callback_url` with `state`."""

    async def finish(self, request: Request, state: str) -> str | None:
        """The user name the provider vouches for in this callback, or None."""
