"""One web layer under every door (issue 26 item 4): the API and the console are the same
request pipeline (mqgate.web.app.WebApp) over the same Route, Request and Response, each door
supplying its guard, decoding, errors and encoding."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mqgate.app import build_site
from mqgate.errors import MqgateError, TooManyRequests, Unauthorized
from mqgate.preparation import prepare
from mqgate.settings import load_settings
from mqgate.web.app import Headers, WebApp
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


async def _ok(request: Request) -> Response:
    return Response("ok")


class _Door:
    """The smallest door: one role, bodies as they are, errors as their status."""

    roles = frozenset({"anyone"})
    max_body_bytes = 10

    async def admit(self, route: Route, request: Request) -> None:
        request.credential = "seen"

    def decode(self, route: Route, request: Request, body: bytes) -> None:
        request.input = body

    async def authorize(self, route: Route, request: Request) -> None:
        request.caller = "someone"

    def failed(self, request: Request, error: MqgateError) -> Response:
        return Response(status=error.http_status, body=error.message.encode(), content_type=b"text/plain")

    def encode(self, response: Response) -> tuple[Headers, bytes]:
        return [(b"content-type", response.content_type)], response.body or str(response.result).encode()


Answer = tuple[int, dict[bytes, bytes], bytes, int]


def call(app: Any, method: str, path: str, body: bytes = b"", headers: Headers = ()) -> Answer:
    """One request through an ASGI app: (status, headers, body, body messages the app read)."""
    return asyncio.run(acall(app, method, path, body, headers))


async def acall(app: Any, method: str, path: str, body: bytes = b"", headers: Headers = ()) -> Answer:
    sent: list[dict[str, Any]] = []
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode()), *headers],
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
    }
    await app(scope, receive, send)
    start, done = sent
    return start["status"], dict(start["headers"]), done["body"], reads


def test_a_door_refuses_to_start_with_a_route_whose_role_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="GET /x: admin"):
        WebApp(_Door(), [Route("GET", "/x", _ok, "admin")])


def test_the_pipeline_runs_the_door_steps_and_its_body_limit() -> None:
    app = WebApp(_Door(), [Route("POST", "/x", _ok, "anyone")])
    assert call(app, "POST", "/x", b"12345")[:3] == (200, {b"content-type": b"application/json"}, b"ok")
    status, _, body, _ = call(app, "POST", "/x", b"x" * 11)
    assert (status, body) == (413, b"request body is over the 10-byte limit")
    assert call(app, "GET", "/x")[0] == 405
    assert call(app, "GET", "/nowhere")[:3:2] == (404, b"no route /nowhere")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    data_dir: Path = tmp_path_factory.mktemp("doors")
    settings = load_settings(env={}, data_dir=data_dir, admin_token="t" * 32)
    prepare(settings)
    return build_site(settings)


def test_the_api_and_the_console_are_the_same_pipeline_over_the_same_routes(built: Any) -> None:
    assert type(built.api) is WebApp and type(built.console) is WebApp
    for door in (built.api, built.console):
        assert door.router.routes and all(type(r) is Route for r in door.router.routes)
    assert {r.role for r in built.console.router.routes} == {"public", "signed_in", "fragment"}


def test_the_console_refuses_a_form_without_a_session_before_reading_its_body(built: Any) -> None:
    """Who calls is checked before the body is read, on the console as on the API: a 2 MiB form
    from nobody is 403 (it was 413: the console read the form, then asked who sent it)."""
    status, headers, _, reads = call(built.site, "POST", "/console/topics", b"x" * (2 * 1024 * 1024),
                                     [(b"content-type", b"application/x-www-form-urlencoded")])  # fmt: skip
    assert (status, reads) == (403, 0)
    assert headers[b"x-frame-options"] == b"DENY"  # the console's answer, with its headers
    status, headers, _, reads = call(built.site, "GET", "/console/topics")
    assert status == 303 and headers[b"location"] == b"/console/signin?next=/console/topics"


def test_the_site_sends_home_to_the_console_and_the_rest_to_the_api(built: Any) -> None:
    status, headers, _, _ = call(built.site, "GET", "/")
    assert (status, headers[b"location"]) == (303, b"/console/")
    status, _, body, _ = call(built.site, "POST", "/admin/topics", b"{}")
    assert status == 401 and b'"field":"Authorization"' in body


class _Picky(_Door):
    """Only a request with a credential header is admitted."""

    async def admit(self, route: Route, request: Request) -> None:
        if b"x-credential" not in request.headers:
            raise Unauthorized("no credential", field="x-credential")


def test_a_role_has_a_budget_of_requests_in_progress_counted_after_the_credential() -> None:
    """No role can take the process down: past its budget a request is 429 at once (nothing
    read), and a request without a credential neither counts nor is kept waiting."""
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return Response("done")

    app = WebApp(_Picky(), [Route("POST", "/slow", slow, "anyone")], role_limits={"anyone": 2})
    ok = [(b"x-credential", b"1")]

    async def scenario() -> list[tuple[int, bytes]]:  # (status, body) of each
        held = [asyncio.create_task(acall(app, "POST", "/slow", b"x", ok)) for _ in range(2)]
        await asyncio.sleep(0)  # both are in their handler, waiting
        while app._busy["anyone"] < 2:
            await asyncio.sleep(0)
        refused = await acall(app, "POST", "/slow", b"x", ok)
        anonymous = await acall(app, "POST", "/slow", b"x")
        release.set()
        done = await asyncio.gather(*held)
        after = await acall(app, "POST", "/slow", b"x", ok)
        return [(r[0], r[2]) for r in (refused, anonymous, *done, after)] + [(refused[3], b"reads")]

    refused, anonymous, first, second, after, reads = asyncio.run(scenario())
    assert refused == (429, b"2 anyone requests are in progress, the most at once: try again")
    assert reads == (0, b"reads")  # refused before its body was read
    assert anonymous[0] == 401
    assert first == second == after == (200, b"done")


def test_the_gateways_doors_take_their_budgets_from_the_settings(tmp_path: Path) -> None:
    settings = load_settings(env={}, data_dir=tmp_path, admin_token="t" * 32, max_concurrent_admin_requests=3,
                             max_concurrent_read_requests=0, console_max_concurrent_requests=5)  # fmt: skip
    prepare(settings)
    built = build_site(settings)
    assert built.api.role_limits == {"admin": 3}
    assert built.console.role_limits == {"signed_in": 5, "fragment": 5}
    answer = built.api.door.failed(Request("GET", "/", {}, ""), TooManyRequests("busy", field="role"))
    assert (answer.status, dict(answer.headers)[b"retry-after"]) == (429, b"1")
