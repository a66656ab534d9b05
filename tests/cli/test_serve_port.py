"""`mqgate serve` on a port another process holds: it fails at once, before it opens or recovers
the store, so no client of that port is answered by a half-started gateway's neighbour while it
starts, and a store with a long recovery is not opened for nothing."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import MQGATE

# Starts gateway processes: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_fails_before_the_store_is_opened(tmp_path: Path, workers: int) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [
                MQGATE,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
                "--workers",
                str(workers),
            ],
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
