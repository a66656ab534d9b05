"""Push's pure parts: which addresses an endpoint may reach, the URL and header checks, the
backoff's bounds, and one attempt against endpoints that answer badly or not at all."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Iterator

import pytest

from mqgate.errors import BadRequest
from mqgate.push import client
from mqgate.push.config import PushConfig, backoff_ms
from mqgate.push.endpoints import EndpointRefused, check_headers, parse_endpoint, public, resolve


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.0.0.1", False),
        ("172.16.5.4", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4 mapped: judged as the IPv4 address
        ("::ffff:8.8.8.8", True),
    ],
)
def test_only_public_addresses_are_reachable(address: str, allowed: bool) -> None:
    assert public(ipaddress.ip_address(address)) is allowed


def test_names_resolving_to_private_addresses_are_refused_unless_allowed() -> None:
    with pytest.raises(EndpointRefused):
        asyncio.run(resolve(parse_endpoint("http://localhost:9/"), allow_private=False))
    assert "127.0.0.1" in asyncio.run(resolve(parse_endpoint("http://localhost:9/"), allow_private=True))
    assert asyncio.run(resolve(parse_endpoint("http://8.8.8.8/"), allow_private=False)) == ["8.8.8.8"]


def test_urls_and_headers_are_checked() -> None:
    e = parse_endpoint("https://example.com:8443/in?x=1")
    assert (e.https, e.host, e.port, e.target, e.host_header) == (
        True,
        "example.com",
        8443,
        "/in?x=1",
        "example.com:8443",
    )
    assert parse_endpoint("http://[2001:db8::1]/").host_header == "[2001:db8::1]"
    for bad in (
        "ftp://x/",
        "http:///x",
        "http://a b/",
        "http://x/#f",
        "http://u:p@x/",
        "http://x:99999/",
        "http://é.com/",
    ):
        with pytest.raises(BadRequest) as refused:
            parse_endpoint(bad)
        assert refused.value.field == "endpoint", bad
    assert check_headers({"X-Api-Key": "k"}) == {"X-Api-Key": "k"}
    for headers in (
        {"Content-Length": "1"},
        {"webhook-id": "x"},
        {"mq-topic": "x"},
        {"X A": "1"},
        {"X": "a\nb"},
    ):
        with pytest.raises(BadRequest):
            check_headers(headers)


def test_the_backoff_grows_within_its_bounds_and_honours_retry_after() -> None:
    config = PushConfig(endpoint="http://x/", backoff_initial_ms=100, backoff_max_ms=1000)
    for attempt, full in ((1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (60, 1000)):
        for _ in range(50):
            assert full // 2 <= backoff_ms(config, attempt, None) <= full
    assert backoff_ms(config, 1, 0.5) == 500
    assert backoff_ms(config, 1, 3600.0) == 1000  # capped


@pytest.fixture
def raw_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server answering each connection with the next canned bytes (None: no answer)."""
    answers: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                if answers:
                    conn.sendall(answers.pop(0))
                if not answers:
                    stop.wait(2.0)  # hold the connection without answering

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], answers
    stop.set()
    thread.join()
    listener.close()


def test_bad_answers_and_silence_are_failures_with_their_reason(raw_server: tuple[int, list[bytes]]) -> None:
    port, answers = raw_server
    endpoint = parse_endpoint(f"http://127.0.0.1:{port}/")

    def attempt(timeout_s: float = 2.0) -> client.Answer:
        return asyncio.run(client.post(endpoint, ["127.0.0.1"], b"x", {}, timeout_s))

    answers.extend(
        [b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\n\r\n", b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\n"]
    )
    assert attempt() == client.Answer(503, 7.0)
    with pytest.raises(client.AttemptFailed) as bad:
        attempt()
    assert bad.value.reason == "protocol"
    with pytest.raises(client.AttemptFailed) as cut:
        attempt()  # the head never ends: it closes
    assert cut.value.reason in ("protocol", "timeout")
    with pytest.raises(client.AttemptFailed) as silent:
        attempt(0.3)  # nothing left to answer with: silence
    assert silent.value.reason == "timeout"
    closed = parse_endpoint("http://127.0.0.1:1/")
    with pytest.raises(client.AttemptFailed) as refused:
        asyncio.run(client.post(closed, ["127.0.0.1"], b"x", {}, 2.0))
    assert refused.value.reason == "connection"


def test_connections_are_kept_between_attempts_and_replaced_when_the_endpoint_drops_them() -> None:
    """One connection carries many attempts while the endpoint keeps it; an endpoint that closed
    an idle connection costs no failed attempt (the next one goes on a new connection); an
    answer whose body runs to the connection's end is not kept."""

    async def main() -> None:
        connections = 0
        answered = 0
        writers: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections, answered
            connections += 1
            writers.append(writer)
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(
                        next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(
                            b":"
                        )[1]
                    )
                    await reader.readexactly(length)
                    answered += 1
                    if answered % 5 == 0:  # now and then: a body, chunked
                        writer.write(
                            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                        )
                    else:
                        writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
                    if answered == 12:
                        writer.close()  # the endpoint lets this connection go while it is idle
                        return
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        endpoint = parse_endpoint(f"http://127.0.0.1:{port}/")
        pool = client.Pool()
        try:
            statuses = [
                (await pool.post(endpoint, ["127.0.0.1"], b"x" * 10, {}, 5.0)).status for _ in range(12)
            ]
            assert statuses.count(202) == 10 and statuses.count(200) == 2
            assert connections == 1
            await asyncio.sleep(0.05)  # the endpoint's close reaches this side
            assert (await pool.post(endpoint, ["127.0.0.1"], b"y", {}, 5.0)).status == 202
            assert connections == 2 and answered == 13
        finally:
            pool.close()
            server.close()
            for w in writers:
                w.close()
            await server.wait_closed()

    asyncio.run(main())
