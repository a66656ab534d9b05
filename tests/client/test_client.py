"""mqgate.client against real gateways: each error answer becomes its mqgate.errors class,
an unreachable gateway is Unavailable, connections are kept alive and renewed, calls retry."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mqgate.client import UNREACHABLE, Client
from mqgate.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    MethodNotAllowed,
    MqgateError,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)
from tests.conftest import RedisServer, Server, free_port, wait_until


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("client") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def admin(gateway: Server) -> Iterator[Client]:
    with Client(gateway.url, gateway.admin_token) as client:
        yield client


def fails(call: Any, cls: type[MqgateError]) -> MqgateError:
    with pytest.raises(MqgateError) as info:
        call()
    assert type(info.value) is cls, info.value
    return info.value


def test_a_client_administers_a_gateway(admin: Client) -> None:
    assert admin.create_topic("adm", queues=2)["queues"] == 2
    assert admin.register_producer("adm-p", "adm")["token"].startswith("mqp_")
    assert admin.register_consumer("adm-c", "adm", lock_timeout_s=5)["token"].startswith("mqc_")
    assert admin.produce("adm-p", [{"message": str(i), "keys": [f"k{i}"]} for i in range(5)]) == 5
    assert admin.progress("adm-c")["lag"] == 5
    assert admin.pause_consumer("adm-c")["paused"] is True
    assert admin.resume_consumer("adm-c")["paused"] is False
    assert admin.reset_consumer("adm-c", "latest")["lag"] == 0
    assert "adm" in [t["name"] for t in admin.topics()["topics"]]
    broker, bounds = admin.bounds("adm")
    assert broker and [b.queue for b in bounds] == [0, 1] and sum(b.max for b in bounds) == 5
    page = msgspec.json.decode(admin.read("adm", bounds[0].queue, 0, 100))["result"]
    assert len(page["msgList"]) == bounds[0].max
    assert admin.commit("adm-c", {0: 0}) == {0: bounds[0].max}  # commit never lowers


def test_error_answers_map_to_their_classes(gateway: Server, admin: Client) -> None:
    admin.create_topic("errs", queues=1)
    ptoken = admin.register_producer("errs-p", "errs")["token"]

    bad = fails(lambda: admin.create_topic("errs2", queues=0), BadRequest)
    assert (bad.http_status, bad.code, bad.field) == (400, "bad_request", "queues")
    assert "creating topic errs2: HTTP 400: " in bad.message

    with Client(gateway.url, "") as anonymous:
        assert fails(anonymous.topics, Unauthorized).field == "Authorization"
    with Client(gateway.url, ptoken) as producer:
        assert fails(producer.topics, Forbidden).http_status == 403

    missing = fails(lambda: admin.progress("nobody"), NotFound)
    assert "consumer nobody is not registered" in missing.message and missing.http_status == 404
    no_route = fails(lambda: admin.call("GET", "/mq/nothing-here"), NotFound)
    assert (no_route.code, no_route.field) == ("no_route", "path")
    assert fails(lambda: admin.call("DELETE", "/admin/topics"), MethodNotAllowed).http_status == 405

    again = fails(lambda: admin.create_topic("errs"), AlreadyExists)
    assert (again.http_status, again.code) == (409, "already_exists")

    too_large = fails(
        lambda: admin.produce("errs-p", [{"message": "x" * (4 * 1024 * 1024 + 1)}]), PayloadTooLarge
    )
    assert too_large.http_status == 413


def test_a_refused_ack_is_a_conflict_with_the_reason_as_code(gateway: Server) -> None:
    ptoken, ctoken = gateway.setup_topic("acks", queues=1)
    with Client(gateway.url, ptoken) as producer, Client(gateway.url, ctoken) as consumer:
        producer.produce("acks-p", [{"message": "m"}])
        pulled = consumer.call("GET", "/mq/message", params={"topic": "acks", "consumer": "acks-c"})
        consumer.call("POST", "/mq/ack", {"requestId": pulled["requestId"]})
        refused = fails(
            lambda: consumer.call("POST", "/mq/ack", {"requestId": pulled["requestId"]}), Conflict
        )
    assert (refused.http_status, refused.code, refused.field) == (409, "already_acked", "requestId")


def test_rate_limited_is_unavailable_with_the_answers_retry_after(gateway: Server, admin: Client) -> None:
    ptoken, ctoken = gateway.setup_topic("rl", queues=1)
    with Client(gateway.url, ptoken) as producer:
        producer.produce("rl-p", [{"message": str(i)} for i in range(20)])
    admin.set_rate_limit("rl-c", 2)
    params = {"topic": "rl", "consumer": "rl-c", "max": 100}
    with Client(gateway.url, ctoken) as consumer:
        first = consumer.call("GET", "/mq/message", params=params)
        limited = fails(
            lambda: consumer.call("GET", "/mq/message", params={**params, "requestId": first["requestId"]}),
            Unavailable,
        )
    assert limited.http_status == 429 and limited.retry_after_s is not None and limited.retry_after_s >= 1


def test_a_gateway_whose_store_is_down_answers_unavailable(own_redis: RedisServer, tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", extra_args=["--store", own_redis.url]).start()
    try:
        with Client(srv.url, srv.admin_token) as client:
            client.create_topic("down", queues=1)
            client.register_producer("down-p", "down")
            own_redis.kill9()

            def refused() -> MqgateError | None:
                try:
                    client.produce("down-p", [{"message": "m"}])
                except MqgateError as exc:
                    return exc
                return None

            down = wait_until(refused, 30, "a produce to fail while Redis is down")
    finally:
        srv.stop()
    assert type(down) is Unavailable and down.http_status == 503
    assert down.retry_after_s is not None and down.retry_after_s >= 1


def test_an_unreachable_gateway_is_unavailable() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", "t", timeout_s=5) as client:
        down = fails(client.topics, Unavailable)
    assert down.code == UNREACHABLE and "cannot reach the gateway" in down.message


def test_a_url_that_is_not_http_is_refused() -> None:
    assert fails(lambda: Client("ftp://host", "t"), BadRequest).field == "url"


def test_calls_retry_until_the_gateway_answers(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data")
    started = threading.Thread(target=srv.start)
    started.start()
    try:
        with Client(srv.url, srv.admin_token, retry_for_s=30) as client:
            assert client.topics() == {"topics": []}
    finally:
        started.join()
        srv.stop()


def test_a_connection_the_gateway_closed_is_replaced(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    with Client(srv.url, srv.admin_token) as client:
        client.create_topic("kept", queues=1)
        srv.stop()
        srv.start()  # same port: the client's kept-alive connection is dead now
        assert [t["name"] for t in client.topics()["topics"]] == ["kept"]
    srv.stop()


def test_one_client_serves_many_threads(admin: Client) -> None:
    admin.create_topic("threads", queues=4)
    admin.register_producer("threads-p", "threads")

    def produce(n: int) -> int:
        return admin.produce("threads-p", [{"message": f"{n}-{i}"} for i in range(50)])

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(produce, range(32))) == 32 * 50
    _, bounds = admin.bounds("threads")
    assert sum(b.max for b in bounds) == 32 * 50
