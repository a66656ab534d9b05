"""401 or 403 on every route that needs a token (docs/PROTOCOL.md, "Authentication"): a token
that is no one's is 401 on every role's route, before the body is read; a known token without
the route's role is 403; and neither answer tells whether a named producer or consumer exists."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Server

GARBAGE = "mqp_" + "0" * 43  # shaped like a token, but no one's


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("auth") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tokens(gateway: Server) -> dict[str, str]:
    """Topics `a` and `b`, each with its producer and consumer; the tokens of `a`'s."""
    ptoken, ctoken = gateway.setup_topic("a", queues=1)
    gateway.setup_topic("b", queues=1)
    return {"producer": ptoken, "consumer": ctoken}


def routes(gateway: Server) -> list[tuple[str, str, str]]:
    """(method, path, role) of every route that needs a token, names in paths filled in."""
    doc = httpx.get(gateway.url + "/openapi.json", timeout=30).json()
    return [
        (method.upper(), path.replace("{name}", "a-c").replace("{id}", "x"), op["x-role"])
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if op["x-role"] != "none"
    ]


def call(gateway: Server, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(
        method, gateway.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30, **kwargs
    )


def test_a_token_that_is_no_ones_is_401_on_every_route_before_the_body_is_read(gateway: Server) -> None:
    found = routes(gateway)
    assert {role for _, _, role in found} == {"admin", "producer", "consumer", "token", "reader", "stream"}
    wrong = {}
    for method, path, role in found:
        r = httpx.request(
            method,
            gateway.url + path,
            content=b"{not json" if method != "GET" else None,
            headers={"Authorization": f"Bearer {GARBAGE}", "Content-Type": "application/json"},
            timeout=30,
        )
        if r.status_code != 401 or r.json()["result"]["field"] != "Authorization":
            wrong[(method, path, role)] = (r.status_code, r.json()["message"])
    assert wrong == {}


def test_the_calls_that_name_who_they_are_for_are_401_with_a_token_that_is_no_ones(
    gateway: Server, tokens: dict[str, str]
) -> None:
    # Well-formed calls, each failing only on the token: still 401, whatever else is wrong.
    forged_request_id = "v1.forged.request-id"
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/mq/read", {"params": {"topic": "a", "queue": 0, "offset": 0}}),  # no consumer named
        ("GET", "/mq/browse", {"params": {"topic": "a", "queue": 0}}),
        ("POST", "/mq/commit", {"json": {"consumer": "a-c", "offsets": {"0": 0}}}),
        ("POST", "/mq/ack", {"json": {"requestId": forged_request_id}}),  # an ack token no one signed
        ("POST", "/mq/release", {"json": {"requestId": forged_request_id}}),
        ("GET", "/mq/message", {"params": {"topic": "a", "consumer": "a-c"}}),
        ("POST", "/mq/produce", {"json": {"producer": "a-p", "message": "x"}}),
    ]
    for method, path, kwargs in calls:
        r = call(gateway, method, path, GARBAGE, **kwargs)
        assert (r.status_code, r.json()["result"]["field"]) == (401, "Authorization"), (path, r.text)


def test_a_known_token_without_the_admin_role_is_403(gateway: Server, tokens: dict[str, str]) -> None:
    wrong = {}
    for method, path, role in routes(gateway):
        if role != "admin":
            continue
        for kind in ("producer", "consumer"):
            r = call(gateway, method, path, tokens[kind], json={} if method != "GET" else None)
            if r.status_code != 403 or r.json()["result"]["field"] != "Authorization":
                wrong[(method, path, kind)] = (r.status_code, r.json()["message"])
    assert wrong == {}
    # The admin token itself is let through.
    assert call(gateway, "GET", "/admin/topics", gateway.admin_token).status_code == 200


def test_neither_answer_tells_whether_a_named_producer_or_consumer_exists(
    gateway: Server, tokens: dict[str, str]
) -> None:
    ghost = "ghost-" + uuid.uuid4().hex[:8]

    def answers(token: str, producer: str, consumer: str) -> list[tuple[int, str]]:
        out = []
        calls: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/mq/produce", {"json": {"producer": producer, "message": "x"}}),
            ("GET", "/mq/message", {"params": {"topic": "b", "consumer": consumer}}),
            ("GET", "/mq/read", {"params": {"topic": "b", "consumer": consumer, "queue": 0, "offset": 0}}),
        ]
        for method, path, kwargs in calls:
            r = call(gateway, method, path, token, **kwargs)
            message = r.json()["message"].replace(producer, "<name>").replace(consumer, "<name>")
            out.append((r.status_code, message))
        return out

    for token, status in [(GARBAGE, 401), (tokens["producer"], 403), (tokens["consumer"], 403)]:
        real, missing = answers(token, "b-p", "b-c"), answers(token, ghost, ghost)
        assert real == missing, (token, real, missing)
        assert {s for s, _ in real} == {status}
