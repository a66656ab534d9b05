"""Redis servers of the failover tests' own: killed (-9), hung (SIGSTOP) and started again on
the same port, and a fresh PostgreSQL database per test (the `pg_url` fixture of tests/conftest).

`FailoverRedis` follows tests/conftest.py's `RedisServer` (a free loopback port, AOF with fsync
always, stopped by PID) and adds what failover needs: extra server options (maxmemory), a
pause/resume by SIGSTOP/SIGCONT and a restart on the same port and files.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import IN_CI, free_port, kill9, terminate, wait_until


@dataclass
class FailoverRedis:
    directory: Path
    port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> FailoverRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            if IN_CI:
                pytest.fail("redis-server is not installed (required in CI)")
            pytest.skip("SKIPPED LOUDLY: redis-server is not installed")
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--protected-mode", "yes",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        wait_until(self.answers, timeout_s, "redis-server to answer PING")
        return self

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

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
