"""A pull that carries its previous batch's ack is one Redis call for the ack and the lease.

The ack and the lease touch one consumer's table, in one hash slot: `ack_lease.lua` runs both,
where they were two scripts, one round trip each. The lease that takes the acked queue again
publishes no wake either: nothing was freed for another pull. Counted with MONITOR on a Redis of
the test's own, between two markers, so the gateway's background loops cannot blur the count.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import Client, RedisServer, Server

pytestmark = pytest.mark.slow
GROUP_TAG = "{g:t-c}"  # the consumer's hash tag: every key of its tables carries it


class Monitor:
    """Every command the Redis server ran from `start()` until the `stop()` marker."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._marker = "mqgate-test-monitor-end"
        self.commands: list[str] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        with self._client.monitor() as m:
            self._ready.set()
            for event in m.listen():
                command = str(event["command"])
                if self._marker in command:
                    return
                self.commands.append(command)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10), "MONITOR did not start"
        # MONITOR is on once the server answered it: a command sent now is seen.
        self._client.echo("mqgate-test-monitor-start")

    def stop(self) -> list[str]:
        self._client.echo(self._marker)
        self._thread.join(10)
        assert not self._thread.is_alive(), "MONITOR never saw its end marker"
        self._client.close()
        return self.commands


def test_a_pull_with_an_ack_is_one_script_call_and_no_wake(own_redis: RedisServer, tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", extra_args=["--store", own_redis.url]).start()
    try:
        ptoken, ctoken = srv.setup_topic("t", queues=1)
        client = Client(srv, ptoken, ctoken)
        try:
            for i in range(40):
                assert client.produce("t-p", f"m{i}").status_code == 200
            batch: Any = client.pull("t", "t-c", max=10).json()["result"]
            assert batch["status"] == "FOUND" and len(batch["msgList"]) == 10, batch
            # Once before: a script's first call on this Redis loads it (NOSCRIPT, then again).
            first: Any = client.pull("t", "t-c", max=10, requestId=batch["requestId"]).json()["result"]
            assert first["status"] == "FOUND" and first["ack"] == "ok", first

            monitor = Monitor(own_redis.url)
            monitor.start()
            second: Any = client.pull("t", "t-c", max=10, requestId=first["requestId"]).json()["result"]
            commands = monitor.stop()
        finally:
            client.close()

        assert second["status"] == "FOUND" and second["ack"] == "ok", second
        assert [m["message"] for m in second["msgList"]] == [f"m{i}" for i in range(20, 30)]
        scripts = [c for c in commands if c.upper().startswith(("EVALSHA", "EVAL ")) and GROUP_TAG in c]
        assert len(scripts) == 1, f"the ack and the lease in one script call: {scripts}"
        wakes = [c for c in commands if c.upper().startswith("PUBLISH")]
        assert wakes == [], f"the acked queue was leased again: nothing to wake, got {wakes}"
    finally:
        srv.stop()
