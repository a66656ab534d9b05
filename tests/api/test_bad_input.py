"""Bad input gets a clear 4xx naming the field: never a 500, never a hang, never a silent
default (issue 10, section 2). Each case reproduces what a tester found."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_http_api import unique
from tests.conftest import Server


def result(r: httpx.Response) -> Any:
    return r.json()["result"]


@pytest.fixture
def limits_server(tmp_path: Path) -> Any:
    env = {
        "MQGATE_HEADER_TIMEOUT_S": "1",
        "MQGATE_MAX_HEADER_COUNT": "50",
        "MQGATE_MAX_HEADER_BYTES": "16384",
    }
    server = Server(tmp_path / "data", env=env).start()
    yield server
    server.stop()


BROKEN_BODIES = [b'{"producer": "p", "message": "a\xffb"}', b"[" * 10_000 + b"]" * 10_000]
ROUTES = ["/mq/produce", "/mq/produce/batch", "/admin/topics", "/mq/ack"]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("body", BROKEN_BODIES, ids=["bad-utf8", "deep"])
def test_broken_bodies_are_401_without_a_token_and_400_with_one(
    shared_server: Server, path: str, body: bytes
) -> None:
    h = {"Content-Type": "application/json"}
    r = httpx.post(shared_server.url + path, content=body, headers=h)
    assert r.status_code == 401, r.text
    topic = unique("b")
    ptoken, _ = shared_server.setup_topic(topic)
    token = shared_server.admin_token if path.startswith("/admin") else ptoken
    r = httpx.post(shared_server.url + path, content=body, headers={**h, "Authorization": f"Bearer {token}"})
    assert 400 <= r.status_code < 500 and r.status_code != 404, r.text
    assert result(r)["field"] in ("body", "Authorization"), r.text


def test_a_bad_start_registers_nothing(shared_server: Server) -> None:
    topic, name = unique("s"), unique("c")
    shared_server.setup_topic(topic)
    h = {"Authorization": f"Bearer {shared_server.admin_token}"}
    for start in ("²", "٣", "12a", "-5"):
        r = httpx.post(
            shared_server.url + "/admin/consumers",
            json={"name": name, "topic": topic, "start": start},
            headers=h,
        )
        assert r.status_code == 400 and result(r)["field"] == "start", r.text
    names = [c["name"] for c in shared_server.admin("GET", "/admin/consumers")["consumers"]]
    assert name not in names


@pytest.mark.parametrize("field", ["delayms", "ttl", "delay_ms", "orderkey", "queue"])
def test_misspelt_message_fields_are_named(shared_server: Server, field: str) -> None:
    topic = unique("m")
    ptoken, _ = shared_server.setup_topic(topic)
    r = httpx.post(
        shared_server.url + "/mq/produce",
        json={"producer": f"{topic}-p", "message": "x", field: 5000},
        headers={"Authorization": f"Bearer {ptoken}"},
    )
    assert r.status_code == 400 and result(r)["field"] == field, r.text


@pytest.mark.parametrize(
    ("path", "fields", "field"),
    [
        ("/admin/topics", {"queues": 1.5}, "queues"),
        ("/admin/topics", {"queues": " 5 "}, "queues"),
        ("/admin/topics", {"queues": "1_0"}, "queues"),
        ("/admin/topics", {"queues": "٣"}, "queues"),
        ("/admin/topics", {"retentionBytes": 0.9}, "retentionBytes"),
        ("/admin/topics", {"queues": True}, "queues"),
    ],
)
def test_numbers_must_be_exact_integers(
    shared_server: Server, path: str, fields: dict[str, Any], field: str
) -> None:
    h = {"Authorization": f"Bearer {shared_server.admin_token}"}
    r = httpx.post(shared_server.url + path, json={"name": unique("n"), **fields}, headers=h)
    assert r.status_code == 400 and result(r)["field"] == field, r.text


def test_a_fractional_backlog_does_not_turn_the_alert_off(shared_server: Server) -> None:
    topic = unique("a")
    shared_server.setup_topic(topic)
    h = {"Authorization": f"Bearer {shared_server.admin_token}"}
    url = f"{shared_server.url}/admin/consumers/{topic}-c/alert"
    r = httpx.post(url, json={"backlog": 0.9}, headers=h)
    assert r.status_code == 400 and result(r)["field"] == "backlog"


@pytest.mark.parametrize("raw", [b"producer=p&message=a%FFb", b"producer=p&message=a\xffb"])
def test_form_values_must_be_utf8_by_one_rule(shared_server: Server, raw: bytes) -> None:
    topic = unique("f")
    ptoken, _ = shared_server.setup_topic(topic)
    body = raw.replace(b"producer=p", f"producer={topic}-p".encode())
    r = httpx.post(
        shared_server.url + "/mq/produce",
        content=body,
        headers={"Authorization": f"Bearer {ptoken}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400 and result(r)["field"] == "body", r.text


def test_an_oversized_body_is_answered_413_to_a_client_that_sends_it_all_first(shared_server: Server) -> None:
    topic = unique("o")
    ptoken, _ = shared_server.setup_topic(topic)
    for _ in range(5):
        request = urllib.request.Request(
            shared_server.url + "/mq/produce",
            data=b'{"producer":"p","message":"' + b"x" * (6 * 1024 * 1024) + b'"}',
            headers={"Authorization": f"Bearer {ptoken}", "Content-Type": "application/json"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 413
        err.value.close()


def raw_exchange(server: Server, data: bytes, *, read_timeout_s: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_timeout_s) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_slow_headers_get_408(limits_server: Server) -> None:
    with socket.create_connection(("127.0.0.1", limits_server.port), timeout=10) as s:
        started = time.monotonic()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - started < 5
    with socket.create_connection(("127.0.0.1", limits_server.port), timeout=10) as s:
        assert s.recv(65536).startswith(b"HTTP/1.1 408")  # a connection that sends nothing


def test_slow_headers_of_a_kept_alive_connections_next_request_get_408(limits_server: Server) -> None:
    """The header deadline starts again with each request on a connection, not only its first."""
    with socket.create_connection(("127.0.0.1", limits_server.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"HTTP/1.1 200" not in data:
            data += s.recv(65536)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # no timer but this one closes it
        while b"HTTP/1.1 408" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk


@pytest.mark.parametrize(
    "headers",
    [
        b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)),
        b"X-Big: " + b"a" * (1024 * 1024) + b"\r\n",
    ],
    ids=["10000-headers", "1MiB-header"],
)
def test_too_many_or_too_large_headers_get_431(limits_server: Server, headers: bytes) -> None:
    answer = raw_exchange(limits_server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_a_duplicate_authorization_header_is_refused(shared_server: Server) -> None:
    admin = f"Authorization: Bearer {shared_server.admin_token}\r\n".encode()
    request = (
        b"GET /admin/topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + admin
        + b"Authorization: Bearer x\r\n\r\n"
    )
    answer = raw_exchange(shared_server, request)
    assert answer.startswith(b"HTTP/1.1 400") and b'"field":"Authorization"' in answer, answer[:300]


def test_names_cannot_be_probed_without_a_valid_token(shared_server: Server) -> None:
    topic = unique("n")
    shared_server.setup_topic(topic)
    answers = set()
    for producer in (f"{topic}-p", unique("ghost")):
        for auth in ({}, {"Authorization": "Bearer mqp_not_a_token"}):
            r = httpx.post(
                shared_server.url + "/mq/produce", json={"producer": producer, "message": "x"}, headers=auth
            )
            answers.add((r.status_code, r.json()["message"]))
        r = httpx.get(
            shared_server.url + "/mq/message",
            params={"topic": topic, "consumer": producer},
            headers={"Authorization": "Bearer mqc_not_a_token"},
        )
        answers.add((r.status_code, r.json()["message"]))
    assert {status for status, _ in answers} == {401}
    assert len({message for _, message in answers}) == 2  # "required" and "not valid", names alike


def test_a_mangled_ack_token_is_a_bad_request(shared_server: Server) -> None:
    topic = unique("k")
    ptoken, ctoken = shared_server.setup_topic(topic)
    httpx.post(
        shared_server.url + "/mq/produce",
        json={"producer": f"{topic}-p", "message": "x"},
        headers={"Authorization": f"Bearer {ptoken}"},
    )
    h = {"Authorization": f"Bearer {ctoken}"}
    pulled = httpx.get(
        shared_server.url + "/mq/message", params={"topic": topic, "consumer": f"{topic}-c"}, headers=h
    )
    token = result(pulled)["requestId"]
    for mangled in (token + "!", token + "==", " " + token):
        r = httpx.post(shared_server.url + "/mq/ack", json={"requestId": mangled}, headers=h)
        assert r.status_code == 400 and result(r)["field"] == "requestId", r.text
    assert httpx.post(shared_server.url + "/mq/ack", json={"requestId": token}, headers=h).status_code == 200


def test_405_names_the_allowed_methods(shared_server: Server) -> None:
    r = httpx.delete(shared_server.url + "/mq/produce")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = httpx.put(shared_server.url + "/admin/topics")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"


def test_a_read_needs_its_queue_and_offset(shared_server: Server) -> None:
    topic = unique("r")
    shared_server.setup_topic(topic)
    h = {"Authorization": f"Bearer {shared_server.admin_token}"}
    r = httpx.get(shared_server.url + "/mq/read", params={"topic": topic}, headers=h)
    assert r.status_code == 400 and result(r)["field"] in ("queue", "offset"), r.text
