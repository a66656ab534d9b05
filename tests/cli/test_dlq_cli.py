"""`mqgate topic browse` and `mqgate dlq show|browse|redrive` against a real gateway, on both
stores (issue 10 §4)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.cli.test_cli_admin import cli
from tests.conftest import Server, wait_until


def answer(server: Server, *args: str) -> Any:
    done = cli(server, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_browse_and_redrive_from_the_command_line(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("cli-d", queues=1)
    auth = {"Authorization": f"Bearer {ptoken}"}
    batch = [{"message": f"m{i}", "keys": [f"k{i % 2}"], "ttlMs": 1} for i in range(4)]
    httpx.post(
        server.url + "/mq/produce/batch", json={"producer": "cli-d-p", "messages": batch}, headers=auth
    ).raise_for_status()
    browsed = answer(server, "topic", "browse", "cli-d", "--key", "k1")
    assert [m["message"] for m in browsed["msgList"]] == ["m1", "m3"] and browsed["scanLimit"] == 10_000
    assert [m["offset"] for m in answer(server, "topic", "browse", "cli-d", "--offset", "2")["msgList"]] == [
        2,
        3,
    ]
    time.sleep(0.01)  # let the 1 ms validity pass
    httpx.get(
        server.url + "/mq/message",
        params={"topic": "cli-d", "consumer": "cli-d-c"},
        headers={"Authorization": f"Bearer {ctoken}"},
    ).raise_for_status()
    wait_until(lambda: answer(server, "dlq", "show", "cli-d-c")["max"] == 4, 10, "4 dead letters")
    assert len(answer(server, "dlq", "browse", "cli-d-c")["msgList"]) == 4
    one = answer(server, "dlq", "redrive", "cli-d-c", "--offset", "0")
    assert [r["dlqOffset"] for r in one["redriven"]] == [0] and one["position"] == 1
    twice = cli(server, "dlq", "redrive", "cli-d-c", "--offset", "0")
    assert twice.returncode == 1 and "redriven already" in twice.stderr
    rest = answer(server, "dlq", "redrive", "cli-d-c", "--all")
    assert [r["dlqOffset"] for r in rest["redriven"]] == [1, 2, 3]
    assert answer(server, "dlq", "show", "cli-d-c")["redriven"] == 4
    refused = cli(server, "dlq", "redrive", "cli-d-c")
    assert refused.returncode == 1 and "choose what to redrive" in refused.stderr
    # The copies went to the consumer's inbox alone: the topic holds the 4 it had.
    assert len(answer(server, "topic", "browse", "cli-d")["msgList"]) == 4
    assert answer(server, "consumer", "progress", "cli-d-c")["lag"] == 4


def test_a_key_search_names_every_queue_and_progress_names_the_side_queues(server: Server) -> None:
    ptoken, _ = server.setup_topic("cli-k", queues=2)
    auth = {"Authorization": f"Bearer {ptoken}"}
    batch = [{"message": f"m{i}", "keys": ["wanted"]} for i in range(6)]  # round robin: 3 a queue
    httpx.post(
        server.url + "/mq/produce/batch", json={"producer": "cli-k-p", "messages": batch}, headers=auth
    ).raise_for_status()
    found = answer(server, "topic", "browse", "cli-k", "--key", "wanted")
    assert sorted(m["message"] for m in found["msgList"]) == [f"m{i}" for i in range(6)]
    assert {m["queue"] for m in found["msgList"]} == {0, 1}
    one = answer(server, "topic", "browse", "cli-k", "--key", "wanted", "--queue", "1")
    assert len(one["msgList"]) == 3  # a queue named: that queue alone
    text = cli(server, "consumer", "progress", "cli-k-c").stdout
    assert "%RETRY%cli-k-c" in text and "%INBOX%cli-k-c" in text
