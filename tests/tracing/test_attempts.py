"""A message's attempt numbers count on through the consumer's retry queue: every hop, the
pull's reconsumeTimes and the dead letter's dlq.attempts tell one story."""

from __future__ import annotations

import subprocess
from typing import Any

from tests.conftest import MQGATE, Server, wait_until
from tests.services.test_dead_letters import dead_letters
from tests.tracing.test_tracing_gateway import pull_found, setup, traces


def test_attempts_count_on_through_the_retry_queue(server: Server) -> None:
    client = setup(server, "att", "att", lockTimeoutS=1, maxAttempts=2)
    server.admin("POST", "/admin/trace-policies", mode="project", project="att", level="info")
    msg_id = client.produce("att-p", "m").json()["result"]["msgId"]
    first = pull_found(client, "att")
    assert (
        first["msgList"][0]["reconsumeTimes"] == 0
    )  # not acked: its lock expires, it goes to the retry queue
    again = pull_found(client, "att")
    (retried,) = again["msgList"]
    assert retried.get("source") == "%RETRY%att-c" and retried["reconsumeTimes"] == 1
    assert client.call("/mq/release", requestId=again["requestId"]).status_code == 200  # its 2nd and last
    dead = dead_letters(server, "att-c", 1)
    assert [m["properties"]["dlq.attempts"] for m in dead] == ["2"]

    def hops() -> list[dict[str, Any]] | None:
        paths = traces(server, msgId=msg_id)["paths"]
        found = paths[0]["hops"] if paths else []
        return found if any(h["hop"] == "dead_lettered" for h in found) else None

    path = wait_until(hops, 15, "the dead-lettered hop")
    attempts = [(h["hop"], h.get("attempt")) for h in path if h["hop"] != "accepted" and h["hop"] != "stored"]
    assert [a for hop, a in attempts if hop == "delivered"] == [1, 2]
    assert [a for hop, a in attempts if hop == "lock_expired"] == [1]
    assert [a for hop, a in attempts if hop == "redelivered"] == [2]
    assert [a for hop, a in attempts if hop == "dead_lettered"] == [2]
    # The hops in the retry queue name it (they have no queue of the topic).
    in_retry = [h for h in path if h["hop"] in ("due", "delivered", "released", "dead_lettered")][1:]
    assert in_retry and all(h.get("source") == "%RETRY%att-c" and h.get("queue") is None for h in in_retry)
    found = subprocess.run(
        [
            MQGATE,
            "trace",
            "find",
            "--msg-id",
            msg_id,
            "--url",
            server.url,
            "--admin-token",
            server.admin_token,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert "%RETRY%att-c offset 0" in found.stdout and "queue None" not in found.stdout
    client.close()


def test_a_path_names_each_consumer_s_committed_offset_whatever_its_state(server: Server) -> None:
    client = setup(server, "com", "com")
    server.admin("POST", "/admin/consumers", name="com-idle", topic="com")
    server.admin("POST", "/admin/trace-policies", mode="project", project="com", level="info")
    msg_id = client.produce("com-p", "m").json()["result"]["msgId"]
    got = pull_found(client, "com")
    assert client.call("/mq/ack", requestId=got["requestId"]).status_code == 200

    def states() -> list[dict[str, Any]] | None:
        paths = traces(server, msgId=msg_id)["paths"]
        found: list[dict[str, Any]] = paths[0]["consumers"] if paths else []
        return found if any(s["state"] == "consumed" for s in found) else None

    assert sorted(
        (s["consumer"], s["state"], s.get("committed")) for s in wait_until(states, 15, "the ack")
    ) == [
        ("com-c", "consumed", 1),
        ("com-idle", "not_consumed", 0),
    ]
    client.close()
