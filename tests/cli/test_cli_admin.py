"""The administration commands against a real gateway: text for people, --json for programs,
exit statuses a script can act on, a closed pipe, and resets that say what they clamped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import MQGATE, Server, wait_until

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MQGATE, *args, "--url", server.url],
        env={**os.environ, "MQGATE_ADMIN_TOKEN": server.admin_token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def produce(server: Server, token: str, producer: str, count: int) -> None:
    for i in range(count):
        httpx.post(
            server.url + "/mq/produce",
            json={"producer": producer, "message": str(i)},
            headers={"Authorization": f"Bearer {token}"},
        ).raise_for_status()


def test_text_by_default_json_with_the_switch(shared_server: Server) -> None:
    assert cli(shared_server, "topic", "create", "cli-text", "--queues", "2").returncode == 0
    text = cli(shared_server, "topic", "list")
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split() == ["name", "project", "queues", "retentionMs", "retentionBytes", "maxPriority"]
    assert any(row.split()[:3] == ["cli-text", "default", "2"] for row in rows), text.stdout
    for args in (["--json", "topic", "list"], ["topic", "list", "--json"]):
        topics = json.loads(cli(shared_server, *args).stdout)["topics"]
        assert {"name": "cli-text", "queues": 2}.items() <= next(
            t for t in topics if t["name"] == "cli-text"
        ).items()

    registered = cli(shared_server, "producer", "register", "cli-text-p", "--topic", "cli-text")
    assert registered.returncode == 0
    assert registered.stdout.splitlines()[0] == "producer cli-text-p registered on topic cli-text"
    assert registered.stdout.splitlines()[1].startswith("token: mqp_")
    progress = cli(shared_server, "--json", "consumer", "register", "cli-text-c", "--topic", "cli-text")
    assert json.loads(progress.stdout)["token"].startswith("mqc_")
    table = cli(shared_server, "consumer", "progress", "cli-text-c").stdout.splitlines()
    assert table[0] == "consumer cli-text-c on cli-text (cluster): lag 0, dead-lettered 0"
    assert table[1].split() == ["client", "queue", "min", "max", "committed", "lag", "locked", "attempts"]
    assert [row.split()[:2] for row in table[2:4]] == [["-", "0"], ["-", "1"]]  # then the retry queues


def test_alerts_exit_status_says_whether_one_is_active(shared_server: Server) -> None:
    ptoken, _ = shared_server.setup_topic("cli-alert", queues=1)
    quiet = cli(shared_server, "alerts")
    assert quiet.returncode == 0 and quiet.stdout.strip() == "no active alerts", quiet
    assert cli(shared_server, "consumer", "alert", "cli-alert-c", "1").stdout.strip() == (
        "consumer cli-alert-c: alert when lag > 1"
    )
    produce(shared_server, ptoken, "cli-alert-p", 2)
    active = cli(shared_server, "alerts")
    assert active.returncode == 3, active
    assert active.stdout.splitlines()[1].split() == ["cli-alert-c", "cli-alert", "2", "1"]
    as_json = cli(shared_server, "--json", "alerts")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["alerts"][0]["consumer"] == "cli-alert-c"
    assert cli(shared_server, "consumer", "alert", "cli-alert-c", "0").returncode == 0
    assert cli(shared_server, "alerts").returncode == 0


def test_a_closed_pipe_ends_quietly(shared_server: Server) -> None:
    """`mqgate topic list | head -1`: the reader is gone before the output is written."""
    for i in range(3):
        shared_server.admin("POST", "/admin/topics", name=f"cli-pipe-{i}", queues=1)
    for args in (["topic", "list"], ["--json", "topic", "list"]):
        proc = subprocess.Popen(
            [MQGATE, *args, "--url", shared_server.url],
            env={**os.environ, "MQGATE_ADMIN_TOKEN": shared_server.admin_token},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the command can have written anything
        status = proc.wait(60)
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
        assert status == 141 and stderr == "", (status, stderr)
    shell = subprocess.run(
        ["bash", "-c", f"{MQGATE} topic list --url {shared_server.url} | head -1"],
        env={**os.environ, "MQGATE_ADMIN_TOKEN": shared_server.admin_token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shell.stdout.split() == [
        "name",
        "project",
        "queues",
        "retentionMs",
        "retentionBytes",
        "maxPriority",
    ]
    assert shell.stderr == ""


def test_reset_says_which_offsets_it_clamped(shared_server: Server) -> None:
    ptoken, _ = shared_server.setup_topic("cli-reset", queues=1)
    produce(shared_server, ptoken, "cli-reset-p", 3)
    wait_until(
        lambda: shared_server.admin("GET", "/admin/consumers/cli-reset-c/progress")["lag"] == 3,
        10,
        "the lag of 3",
    )
    beyond = cli(
        shared_server, "consumer", "reset", "cli-reset-c", "--to", "offset", "--offset", "100", "--queue", "0"
    )
    assert beyond.returncode == 0, beyond.stderr
    assert beyond.stdout.splitlines()[-1] == "queue 0: offset 100 is outside the queue, reset to 3"
    # Every queue of the consumer (the topic's and its retry queues) is reset and reported.
    answer = json.loads(
        cli(
            shared_server, "--json", "consumer", "reset", "cli-reset-c", "--to", "offset", "--offset", "100"
        ).stdout
    )
    ends = {(q["source"], q["queue"]): q["max"] for q in answer["queues"]}
    assert answer["clamped"] == [
        {"clientId": None, "queue": q, "source": source, "requested": 100, "offset": end}
        for (source, q), end in ends.items()
    ]
    assert answer["lag"] == 0 and ends[("cli-reset", 0)] == 3 and answer["queues"][0]["committed"] == 3
    within = json.loads(
        cli(
            shared_server,
            "--json",
            "consumer",
            "reset",
            "cli-reset-c",
            "--to",
            "offset",
            "--offset",
            "1",
            "--queue",
            "0",
        ).stdout
    )
    assert within["clamped"] == [] and within["lag"] == 2
    earliest = cli(shared_server, "consumer", "reset", "cli-reset-c", "--to", "earliest")
    assert "outside" not in earliest.stdout and "lag 3" in earliest.stdout.splitlines()[0]


def test_cli_administers_a_gateway(server: Server, tmp_path: Path) -> None:
    assert cli(server, "topic", "create", "cli-t", "--queues", "2").returncode == 0
    producer = json.loads(cli(server, "--json", "producer", "register", "cli-p", "--topic", "cli-t").stdout)
    consumer = json.loads(cli(server, "consumer", "register", "cli-c", "--topic", "cli-t", "--json").stdout)
    assert producer["token"].startswith("mqp_") and consumer["token"].startswith("mqc_")
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
