"""Starting the store process from `mqgate serve --workers N`, and starting it again when it
dies: its workers' calls fail with 503 meanwhile, and reconnect to the new one, which has
recovered the data directory as a restarted single-process gateway would."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Final

from mqgate.storeproc.wire import socket_path

log = logging.getLogger(__name__)

RESTART_DELAY_MAX_S: Final = 5.0
STOP_TIMEOUT_S: Final = 30.0


class StoreProcess:
    def __init__(self, data_dir: Path, ready_timeout_s: float = 120.0) -> None:
        self.path = socket_path(data_dir)
        self.ready_timeout_s = ready_timeout_s
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        """Start it and return once it serves (its recovery done); RuntimeError if it exits
        first or is not ready within `ready_timeout_s`."""
        self._spawn()
        self.wait_ready()
        self._watcher = threading.Thread(target=self._watch, name="store-process", daemon=True)
        self._watcher.start()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            process = self._process
            assert process is not None
            if process.poll() is not None:
                raise RuntimeError(f"the store process exited with {process.returncode} before serving")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(self.path))
                    return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the store process did not serve {self.path} within {self.ready_timeout_s} s"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM, so it closes its backends; SIGKILL if it has not exited in STOP_TIMEOUT_S."""
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("the store process did not stop within %s s: killed", STOP_TIMEOUT_S)
            process.kill()
            process.wait()

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            # A socket file a killed store process left behind: the new one makes its own.
            self.path.unlink(missing_ok=True)
            self._process = subprocess.Popen(
                [sys.executable, "-m", "mqgate.cli.store_process", "--parent", str(os.getpid())]
            )

    def _watch(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            process = self._process
            assert process is not None
            code = process.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1
            log.error(
                "the store process exited with %s; starting it again in %.1f s (restart %d)",
                code,
                delay,
                self.restarts,
            )
            if self._stopping.wait(delay):
                return
            started = time.monotonic()
            self._spawn()
            # One that keeps dying at once is started less and less often; one that ran a
            # while is started again soon.
            delay = min(delay * 2, RESTART_DELAY_MAX_S) if time.monotonic() - started < 10 else 0.1
