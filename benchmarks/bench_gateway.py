"""A `mqgate serve` of a benchmark's own (embedded store, fsync always) on a free loopback port,
with a random admin token; shared by the Spark and pipeline benchmarks."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

MQGATE = str(Path(sys.executable).parent / "mqgate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = "mqa_bench_" + secrets.token_hex(8)
        self.command = [MQGATE, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                        "--data-dir", str(directory / "data"), "--fsync", "always"]  # fmt: skip
        log_path = directory / "gateway.log"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, env={**os.environ, "MQGATE_ADMIN_TOKEN": self.token}, stdout=log, stderr=log
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"gateway did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.http = httpx.Client(
            base_url=self.url, timeout=60, headers={"Authorization": f"Bearer {self.token}"}
        )

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST with the admin token; the result, or exit naming the call."""
        r = self.http.post(path, json=body)
        if r.status_code != 200:
            raise SystemExit(f"{path}: {r.status_code} {r.text}")
        return r.json()["result"]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
