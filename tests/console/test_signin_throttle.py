"""The sign-in throttle under real concurrency, on SQLite and PostgreSQL: an attempt is counted
before its password is checked, so of many concurrent wrong passwords at most the limit are
checked; a right password within the limit signs in. And the client address it counts per is
X-Forwarded-For only behind a trusted proxy (`console_trusted_proxies`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_bounded
from tests.console.conftest import PASSWORD, ConsoleServer, user_cli

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

CONCURRENT = 150
# The test gateway runs uvicorn with its proxy headers on (trusting 127.0.0.1), unlike `mqgate
# serve`: trust no address there, so only the console decides what X-Forwarded-For means.
UVICORN_TRUSTS_NO_PROXY = {"FORWARDED_ALLOW_IPS": "192.0.2.1"}


def console_server(data_dir: Path, registry: str, per_user: int, per_ip: int, **env: str) -> ConsoleServer:
    srv = ConsoleServer(data_dir, per_user=per_user, per_ip=per_ip)
    srv.env = {**UVICORN_TRUSTS_NO_PROXY, **env, **({"MQGATE_REGISTRY": registry} if registry else {})}
    srv.data_dir.mkdir(parents=True)
    out = user_cli(srv.data_dir, "add", "rita", "--role", "viewer", "--password-stdin",
                   *(["--registry", registry] if registry else []), password=PASSWORD)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return srv


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request: pytest.FixtureRequest) -> str:
    """The registry's URL: empty for the SQLite file in the data directory."""
    return "" if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


def attempt(server: ConsoleServer, name: str, password: str, forwarded_for: str | None = None) -> int:
    """The status of one sign-in (the form's double-submit token is made up: it only has to
    match its cookie)."""
    headers = {"cookie": "mqgate_console_signin=t0ken"}
    if forwarded_for is not None:
        headers["x-forwarded-for"] = forwarded_for
    form = {"name": name, "password": password, "signin_token": "t0ken"}
    return httpx.post(server.url + "/console/signin", data=form, headers=headers, timeout=60).status_code


async def attempts_at_once(server: ConsoleServer, name: str, password: str, count: int) -> Counter[int]:
    """`count` sign-ins sent at the same moment, each on its own connection: their statuses."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as client:
        go = asyncio.Event()

        async def one() -> int:
            await go.wait()
            r = await client.post(
                "/console/signin",
                data={"name": name, "password": password, "signin_token": "t0ken"},
                headers={"cookie": "mqgate_console_signin=t0ken"},
            )
            return r.status_code

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        await asyncio.sleep(0.1)
        go.set()
        return Counter(await asyncio.gather(*tasks))


@pytest.fixture
def throttled(tmp_path: Path, registry: str) -> Iterator[ConsoleServer]:
    srv = console_server(tmp_path / "data", registry, per_user=5, per_ip=10_000).start()
    yield srv
    srv.stop()


def test_concurrent_wrong_passwords_are_checked_at_most_the_limit(throttled: ConsoleServer) -> None:
    statuses = run_bounded(attempts_at_once(throttled, "rita", "wrong-password", CONCURRENT), 180)
    assert sum(statuses.values()) == CONCURRENT and set(statuses) <= {401, 429}, statuses
    assert statuses[401] <= 5, statuses  # only those were checked; the rest were refused unchecked
    assert attempt(throttled, "rita", PASSWORD) == 429  # the user's limit is reached


def test_a_right_password_within_the_limit_signs_in_and_starts_the_count_again(
    tmp_path: Path, registry: str
) -> None:
    srv = console_server(tmp_path / "data", registry, per_user=3, per_ip=5).start()
    try:
        assert [attempt(srv, "rita", "wrong-password") for _ in range(2)] == [401, 401]
        assert attempt(srv, "rita", PASSWORD) == 303
        # The user's count starts again; the address's kept its 2 failures, not the sign-in.
        assert [attempt(srv, "rita", "wrong-password") for _ in range(3)] == [401, 401, 401]
        assert attempt(srv, "rita", PASSWORD) == 429
        assert attempt(srv, "someone-else", "wrong-password") == 429  # the address's 5 are used up
    finally:
        srv.stop()


def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(tmp_path: Path) -> None:
    srv = console_server(tmp_path / "data", "", per_user=100, per_ip=2).start()  # no trusted proxy
    try:
        assert attempt(srv, "a", "wrong-password", "203.0.113.1") == 401
        assert attempt(srv, "b", "wrong-password", "203.0.113.2") == 401
        # Another forged address does not get round the limit of the peer's own address.
        assert attempt(srv, "c", "wrong-password", "203.0.113.3") == 429
        assert attempt(srv, "rita", PASSWORD) == 429
    finally:
        srv.stop()


def test_behind_a_trusted_proxy_each_client_address_is_limited_on_its_own(tmp_path: Path) -> None:
    trusted = {"MQGATE_CONSOLE_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8"}
    srv = console_server(tmp_path / "data", "", per_user=100, per_ip=2, **trusted).start()
    try:
        # The client is the rightmost address no trusted proxy holds (10.1.2.3 is a proxy too).
        assert attempt(srv, "a", "wrong-password", "203.0.113.1, 10.1.2.3") == 401
        # What the client sent itself stands left of what its proxy appended: not believed.
        assert attempt(srv, "b", "wrong-password", "198.51.100.7, 203.0.113.1") == 401
        assert attempt(srv, "c", "wrong-password", "203.0.113.1") == 429
        # Others behind the same proxy are not locked out.
        assert attempt(srv, "rita", PASSWORD, "203.0.113.2") == 303
        assert attempt(srv, "d", "wrong-password", "198.51.100.7") == 401
        # Without the header the proxy itself is the client.
        assert attempt(srv, "rita", PASSWORD) == 303
    finally:
        srv.stop()
