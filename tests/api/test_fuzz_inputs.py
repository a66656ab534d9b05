"""Random input to every route never gets a 5xx or a hang."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

ROUTES = [
    ("POST", "/mq/produce"),
    ("POST", "/mq/produce/batch"),
    ("GET", "/mq/message"),
    ("POST", "/mq/ack"),
    ("POST", "/mq/release"),
    ("POST", "/mq/extend"),
    ("POST", "/admin/topics"),
    ("POST", "/admin/consumers"),
    ("POST", "/admin/consumers/fz-c/reset"),
    ("POST", "/admin/consumers/fz-c/rate-limit"),
]
FIELDS = [
    "producer",
    "message",
    "messages",
    "topic",
    "consumer",
    "requestId",
    "max",
    "wait",
    "keys",
    "tags",
    "properties",
    "orderKey",
    "name",
    "queues",
    "to",
    "offset",
    "seconds",
    "messagesPerSecond",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)


def test_random_bodies_and_parameters_never_get_a_5xx(shared_server: Server) -> None:
    ptoken, ctoken = shared_server.setup_topic("fz")
    tokens = [ptoken, ctoken, shared_server.admin_token, "garbage"]
    client = httpx.Client(base_url=shared_server.url, timeout=10)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        route=st.sampled_from(ROUTES),
        token=st.sampled_from(tokens),
        body=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
        raw=st.one_of(st.none(), st.binary(max_size=64)),
        content_type=st.sampled_from(
            ["application/json", "application/x-www-form-urlencoded", "text/plain", ""]
        ),
    )
    def check(
        route: tuple[str, str], token: str, body: dict[str, object], raw: bytes | None, content_type: str
    ) -> None:
        method, path = route
        headers = {"Authorization": f"Bearer {token}"}
        if content_type:
            headers["Content-Type"] = content_type
        if method == "GET":
            params = {k: str(v) for k, v in body.items()} | {"wait": "0"}
            r = client.get(path, params=params, headers=headers)
        elif raw is not None:
            r = client.post(path, content=raw, headers=headers)
        else:
            r = client.post(path, json=body, headers={**headers, "Content-Type": "application/json"})
        assert r.status_code < 500, (method, path, body, raw, r.text)
        envelope = r.json()
        assert set(envelope) == {"status", "message", "result"} and envelope["status"] == r.status_code

    check()
    client.close()
