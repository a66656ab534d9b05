"""The README tour, run as written, and the CLI against a real gateway."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.conftest import MQGATE, ROOT, Server


def tour_script() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- tour:start -->\s*```bash\n(.*?)```\s*<!-- tour:end -->", text, re.S)
    assert block, "README.md has no tour block"
    return block.group(1)


def test_readme_tour_runs_as_written_and_again(server: Server) -> None:
    """Twice against the same gateway: a reader trying the tour a second time gets the same."""
    for _ in range(2):
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", tour_script()],
            env={**os.environ, "MQGATE_URL": server.url, "MQGATE_ADMIN_TOKEN": server.admin_token},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr + out.stdout
        lines = out.stdout.strip().splitlines()
        assert lines[-1] == "1", out.stdout
        assert lines[-3] == "order 2 paid", out.stdout
        assert json.loads(lines[-2])["status"] == 200


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MQGATE, *args, "--url", server.url],
        env={**os.environ, "MQGATE_ADMIN_TOKEN": server.admin_token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_administers_a_gateway(server: Server, tmp_path: Path) -> None:
    assert cli(server, "topic", "create", "cli-t", "--queues", "2").returncode == 0
    producer = json.loads(cli(server, "--json", "producer", "register", "cli-p", "--topic", "cli-t").stdout)
    consumer = json.loads(cli(server, "consumer", "register", "cli-c", "--topic", "cli-t", "--json").stdout)
    assert producer["token"].startswith("mqp_") and consumer["token"].startswith("mqc_")
    import httpx

    for i in range(3):
        httpx.post(
            server.url + "/mq/produce",
            json={"producer": "cli-p", "message": str(i)},
            headers={"Authorization": f"Bearer {producer['token']}"},
        ).raise_for_status()
    table = cli(server, "consumer", "progress", "cli-c")
    assert table.returncode == 0 and "lag 3" in table.stdout
    assert cli(server, "consumer", "pause", "cli-c").returncode == 0
    assert json.loads(cli(server, "consumer", "progress", "cli-c", "--json").stdout)["paused"] is True
    assert cli(server, "consumer", "resume", "cli-c").returncode == 0
    assert cli(server, "consumer", "rate-limit", "cli-c", "100").returncode == 0
    assert cli(server, "consumer", "alert", "cli-c", "1").returncode == 0
    assert json.loads(cli(server, "--json", "alerts").stdout)["alerts"][0]["consumer"] == "cli-c"
    reset = json.loads(cli(server, "--json", "consumer", "reset", "cli-c", "--to", "latest").stdout)
    assert reset["lag"] == 0
    bad = cli(server, "consumer", "pause", "nobody")
    assert bad.returncode == 1 and "consumer nobody is not registered" in bad.stderr
    assert "topic" in cli(server, "--json", "topic", "list").stdout
    assert "cli-t" in cli(server, "topic", "list").stdout.split()
