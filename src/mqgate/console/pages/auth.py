"""Sign-in and sign-out pages."""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Final

from mqgate.console.app import SESSION_COOKIE, SIGNIN_COOKIE, Console, check_origin, now_ms, route
from mqgate.console.identity import IdentityProvider
from mqgate.errors import Forbidden, NotFound
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

log = logging.getLogger(__name__)
WRONG: Final = "Wrong user name or password."


class AuthPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    def _safe_next(self, v: Request) -> str:
        target = v.arg("next")
        mount = self.c.mount
        if target.startswith(mount + "/") and not target.startswith("//") and "\\" not in target:
            return target
        return self.c.url("/")

    def _form(self, v: Request, status: int = 200, error: str = "") -> Response:
        token = v.cookies.get(SIGNIN_COOKIE) or secrets.token_urlsafe(24)
        response = self.c.page(
            v,
            "signin.html",
            status,
            error=error,
            signin_token=token,
            next=self._safe_next(v),
            providers=self.c.providers,
        )
        response.set_cookie(SIGNIN_COOKIE, token, path=self.c.mount, secure=v.secure)
        return response

    async def signin_form(self, v: Request) -> Response:
        return self._form(v)

    async def signin(self, v: Request) -> Response:
        c = self.c
        check_origin(v)
        cookie = v.cookies.get(SIGNIN_COOKIE, "")
        sent = v.arg("signin_token")
        if not cookie or not hmac.compare_digest(cookie.encode(), sent.encode()):
            raise Forbidden("the sign-in form's token is missing or wrong: reload the page", field="csrf")
        name, password, ip = v.arg("name"), v.arg("password"), v.client_host
        # Counted before the password is checked, so concurrent guesses cannot all be checked.
        wait_ms = await c.db(c.throttle.attempt, name, ip, now_ms())
        if wait_ms > 0:
            minutes = max(1, -(-wait_ms // 60_000))
            response = self._form(v, 429, f"Too many sign-in attempts. Try again in {minutes} min.")
            response.headers.append((b"retry-after", str(-(-wait_ms // 1000)).encode()))
            return response
        user = await c.db(c.accounts.verify, name, password)
        if user is None:
            log.info("console: failed sign-in for %r from %s", name[:64], ip)
            return self._form(v, 401, WRONG)
        await c.db(c.throttle.succeeded, name, ip)
        return await self.open_session(v, user.name, self._safe_next(v))

    async def open_session(self, v: Request, user: str, target: str) -> Response:
        c = self.c
        value, _ = await c.db(c.sessions.create, user, now_ms())
        await c.db(c.audit.record, user, "user.signin", user, via="console")
        response = redirect(target)
        response.set_cookie(SESSION_COOKIE, value, path=c.mount, secure=v.secure)
        response.set_cookie(SIGNIN_COOKIE, "", path=c.mount, secure=v.secure, max_age_s=0)
        return response

    async def signout(self, v: Request) -> Response:
        await self.c.db(self.c.sessions.end, v.credential.value)
        response = redirect(self.c.url("/signin"))
        response.set_cookie(SESSION_COOKIE, "", path=self.c.mount, secure=v.secure, max_age_s=0)
        return response

    async def provider_start(self, v: Request) -> Response:
        provider = self._provider(v.params["provider"])
        state = secrets.token_urlsafe(24)
        callback = f"{self.c.url('/signin/')}{provider.name}/callback"
        response = redirect(provider.start_url(callback, state))
        response.set_cookie(SIGNIN_COOKIE, state, path=self.c.mount, secure=v.secure)
        return response

    async def provider_callback(self, v: Request) -> Response:
        provider = self._provider(v.params["provider"])
        state = v.cookies.get(SIGNIN_COOKIE, "")
        if not state or not hmac.compare_digest(state.encode(), v.arg("state").encode()):
            raise Forbidden("the sign-in state is missing or wrong: start again", field="state")
        name = await provider.finish(v, state)
        rows = await self.c.db(self.c.accounts.list, [name] if name else [])
        if not rows or rows[0].provider != provider.name:
            return self._form(v, 401, f"{provider.label} did not name a console user.")
        return await self.open_session(v, rows[0].name, self.c.url("/"))

    def _provider(self, name: str) -> IdentityProvider:
        for p in self.c.providers:
            if p.name == name:
                return p
        raise NotFound(f"no sign-in provider {name}", field="provider")

    def routes(self) -> list[Route]:
        return [
            route("GET", "/signin", self.signin_form, "public"),
            route("POST", "/signin", self.signin, "public"),
            route("POST", "/signout", self.signout),
            route("GET", "/signin/{provider}", self.provider_start, "public"),
            route("GET", "/signin/{provider}/callback", self.provider_callback, "public"),
        ]
