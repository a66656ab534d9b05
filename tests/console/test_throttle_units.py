"""The sign-in throttle and the client address it counts per, without a server: an attempt is
counted before its password is checked, a refused one is not counted, a right password gives its
count back; X-Forwarded-For is read only from a trusted proxy (SQLite files of the test's own)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from mqgate.console.tables import create_tables, engine_for
from mqgate.console.throttle import Limits, Throttle
from mqgate.errors import BadRequest
from mqgate.web.request import client_address, trusted_networks


@pytest.fixture
def engine(tmp_path: Path) -> sa.Engine:
    e = engine_for(f"sqlite:///{tmp_path / 'registry.db'}")
    create_tables(e)
    return e


def test_attempts_are_counted_per_user_and_per_address(engine: sa.Engine) -> None:
    throttle = Throttle(engine, Limits(per_user=2, per_ip=3, window_ms=1000))
    assert throttle.attempt("dave", "10.0.0.1", 0) == 0
    assert throttle.attempt("Dave", "10.0.0.1", 1) == 0  # user names count alike in any case
    assert throttle.attempt("dave", "10.0.0.9", 2) == 998  # the user, from anywhere
    assert throttle.attempt("erin", "10.0.0.1", 3) == 0  # refused attempts were not counted
    assert throttle.attempt("frank", "10.0.0.1", 4) == 996  # the address, for anyone
    assert throttle.attempt("frank", "10.0.0.2", 4) == 0
    assert throttle.attempt("dave", "10.0.0.9", 1000) == 0  # the window passed: counting starts again
    assert throttle.attempt("dave", "10.0.0.9", 1001) == 0
    assert throttle.attempt("dave", "10.0.0.9", 1002) == 998  # from the new window's start


def test_a_right_password_clears_the_user_and_gives_the_address_its_attempt_back(engine: sa.Engine) -> None:
    throttle = Throttle(engine, Limits(per_user=2, per_ip=2, window_ms=1000))
    assert throttle.attempt("gina", "10.0.0.1", 0) == 0  # a failure
    assert throttle.attempt("gina", "10.0.0.1", 1) == 0  # the right password
    throttle.succeeded("gina", "10.0.0.1")
    assert throttle.attempt("gina", "10.0.0.2", 2) == 0
    assert throttle.attempt("hugo", "10.0.0.1", 3) == 0  # the address's second failure
    assert throttle.attempt("ivan", "10.0.0.1", 4) == 996


def test_concurrent_attempts_pass_at_most_the_limit(engine: sa.Engine) -> None:
    throttle = Throttle(engine, Limits(per_user=5, per_ip=1000, window_ms=60_000))
    start = threading.Barrier(40)
    waits: list[int] = []

    def one() -> None:
        start.wait()
        waits.append(throttle.attempt("jack", "10.0.0.1", 0))

    threads = [threading.Thread(target=one) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(waits) == [0] * 5 + [60_000] * 35


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        ("203.0.113.9", "198.51.100.1", "203.0.113.9"),  # not a proxy of ours: the header is ignored
        ("10.0.0.5", "198.51.100.1", "198.51.100.1"),
        ("10.0.0.5", "198.51.100.66, 198.51.100.1", "198.51.100.1"),  # the client's own claim is left
        ("10.0.0.5", "198.51.100.1, 10.0.0.7", "198.51.100.1"),  # two proxies of ours
        ("10.0.0.5", "10.0.0.8, 10.0.0.7", "10.0.0.8"),  # all ours: the farthest
        ("10.0.0.5", "", "10.0.0.5"),  # no header: the proxy itself
        ("10.0.0.5", "garbage, 10.0.0.7", "10.0.0.7"),  # the last address a proxy of ours gave
        ("::ffff:10.0.0.5", "2001:db8::1", "2001:db8::1"),  # an IPv4 peer on a dual-stack socket
    ],
)
def test_the_client_address_is_read_from_trusted_proxies_only(
    peer: str, forwarded_for: str, client: str
) -> None:
    assert client_address(peer, forwarded_for, trusted_networks("10.0.0.0/8")) == client


def test_no_trusted_proxy_means_the_peer_and_a_bad_setting_is_refused() -> None:
    assert client_address("10.0.0.5", "198.51.100.1", trusted_networks("")) == "10.0.0.5"
    assert trusted_networks(" 127.0.0.1 , ::1,10.0.0.0/8") == trusted_networks(
        "127.0.0.1/32,::1/128,10.0.0.0/8"
    )
    with pytest.raises(BadRequest) as refused:
        trusted_networks("127.0.0.1, proxy.example")
    assert refused.value.field == "console_trusted_proxies"
