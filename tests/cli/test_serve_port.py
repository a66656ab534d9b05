"""`mqgate serve` on a port another process holds: it fails at once, before it opens or recovers
the store, so no client of that port is answered by a half-started gateway's neighbour while it
starts, and a store with a long recovery is not opened for nothing."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import MQGATE, free_port, terminate, wait_until

# Starts gateway processes: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def serve_command(port: int, data_dir: Path) -> list[str]:
    return [MQGATE, "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_fails_before_the_store_is_opened(tmp_path: Path, workers: int) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [*serve_command(port, data_dir), "--workers", str(workers)],
            env={**os.environ, "MQGATE_ADMIN_TOKEN": "mqa_test_port_in_use"},
            capture_output=True,
            timeout=60,
        )
    log = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 3, log
    assert "address already in use" in log.lower(), log
    assert "Waiting for application startup" not in log, "the app started before the port was taken"
    # Neither the store (its topics' folder) nor a store process (its socket) was started.
    assert sorted(p.name for p in data_dir.iterdir() if p.name in ("topics", "store.sock")) == []


def test_two_gateways_started_on_one_port_one_serves_and_the_other_exits(tmp_path: Path) -> None:
    """Both start at once: both may bind (SO_REUSEADDR) while neither listens yet. The one that
    listens second must exit 3 at once, not start and run on without ever serving."""
    port = free_port()
    token = "mqa_test_two_on_one_port"
    procs = [
        subprocess.Popen(
            serve_command(port, tmp_path / f"d{i}"),
            env={**os.environ, "MQGATE_ADMIN_TOKEN": token},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    try:
        wait_until(lambda: any(p.poll() is not None for p in procs), 60, "one of the two to exit")
        [loser] = [p for p in procs if p.poll() is not None]
        [winner] = [p for p in procs if p is not loser]
        assert loser.returncode == 3

        def served_by_the_winner() -> bool:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and r.json()["result"]["pid"] == winner.pid

        wait_until(served_by_the_winner, 30, "the other to serve the port")
    finally:
        for p in procs:
            terminate(p, grace_s=15)
