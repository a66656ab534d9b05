"""Redis servers of the failover tests' own: killed (-9), hung (SIGSTOP) and started again on
the same port, and a fresh PostgreSQL database per test (the `pg_url` fixture of tests/conftest).

`FailoverRedis` follows tests/conftest.py's `RedisServer` (a free loopback port, AOF with fsync
always, stopped by PID) and adds what failover needs: extra server options (maxmemory), a
pause/resume by SIGSTOP/SIGCONT and a restart on the same port and files.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import RedisServer, kill9, terminate


@dataclass
class FailoverRedis(RedisServer):
    """A Redis of the test's own that can also hang (SIGSTOP) and come back."""

    paused: bool = False

    def kill9(self) -> None:
        if self.paused:
            self.resume()
        kill9(self.proc)

    def pause(self) -> None:
        """A hung server: the port accepts connections (the kernel does), nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def config_set(self, name: str, value: str) -> None:
        import redis

        with redis.Redis.from_url(self.url) as r:
            r.config_set(name, value)

    def stop(self) -> None:
        if self.paused:
            self.resume()
        terminate(self.proc, grace_s=10)


@pytest.fixture
def redis_pair(tmp_path: Path) -> Iterator[tuple[FailoverRedis, FailoverRedis]]:
    """A primary and a backup Redis."""
    primary = FailoverRedis(tmp_path / "primary").start()
    backup = FailoverRedis(tmp_path / "backup").start()
    yield primary, backup
    primary.stop()
    backup.stop()


def post_once_read(url: str, token: str, body: dict[str, Any], deadline_s: float = 30.0) -> Any:
    """A POST's result from a gateway that writes nothing to a project's cluster (503) while
    its view of the active cluster is older than its lease, until its next read of the switch
    record: on a busy machine that read can come late. Asked again until then (as a client
    would), within `deadline_s`; any other answer must be a 200."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        if r.status_code != 503 or "switch record" not in r.text:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    assert r.status_code == 200, r.text
    return r.json()["result"]
