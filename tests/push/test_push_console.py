"""A push consumer's page in the console (issue 31): its endpoint, state and latest attempts,
each linked to its message's trace, the failures marked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, sign_in
from tests.push.test_push_gateway import ALLOW_PRIVATE, Received, Receiver, producer, register

pytestmark = pytest.mark.slow


@pytest.fixture
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(tmp_path_factory.mktemp("pushconsole") / "data")
    srv.env = dict(ALLOW_PRIVATE)
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    yield srv
    srv.stop()


def test_the_consumer_page_shows_push_delivery(console: ConsoleServer) -> None:
    def answer(n: int, r: Received) -> tuple[int, dict[str, str], float]:
        return (500, {}, 0.0) if n == 1 else (204, {}, 0.0)

    receiver = Receiver(answer)
    try:
        register(console, "hook-c", "push-c", endpoint=receiver.url, headers={"X-Key": "secret-value"},
                 backoffInitialMs=50, backoffMaxMs=100)  # fmt: skip
        producer(console, "push-c").produce("push-c-p", "shown")
        wait_until(lambda: len(receiver.requests) >= 2, 30, "a failed attempt and a good one")
        client = sign_in(console, "admin")
        page = client.get("/console/consumers/hook-c").text
        assert f'id="push-endpoint">{receiver.url}<' in page
        assert 'id="push-state" class="push-ok">ok<' in page
        assert '<tr data-outcome="http_500">' in page and '<tr data-outcome="ok">' in page
        assert page.index('data-outcome="ok"') < page.index('data-outcome="http_500"')  # newest first
        assert "X-Key" in page and "secret-value" not in page  # header names, never their values
        assert "/console/traces?by=msgId&amp;value=" in page
        # A consumer that is not a push one has no such section.
        console.admin("POST", "/admin/consumers", name="pull-c", topic="push-c")
        assert 'id="push"' not in client.get("/console/consumers/pull-c").text
    finally:
        receiver.close()
