"""Diagnostics against ground truth (issue 27): one known history driven through a real gateway
(two messages; one delivered and acked; the other delivered, its lock expired, delivered again
from the retry queue, released, dead-lettered after its two attempts, redriven to the consumer
it died for, delivered from its inbox and acked; a second consumer group reads both), then every
figure the trace path, the consumers' progress, the dead-letter answers and the CLI show,
checked against what happened. It found two wrong figures: the release of the retry queue's
delivery said attempt 1 (it was the 2nd), and the path said `dead_lettered` for a message that
was redriven and consumed."""

from __future__ import annotations

import subprocess
from typing import Any

from tests.conftest import MQGATE, Client, Server, wait_until
from tests.services.test_dead_letters import dead_letters
from tests.tracing.test_tracing_gateway import setup, traces


def one(client: Client, consumer: str) -> dict[str, Any]:
    """The next pull of one message that finds one."""

    def found() -> dict[str, Any] | None:
        res = client.pull("gt", consumer, max=1, wait=1).json()["result"]
        return dict(res) if res["status"] == "FOUND" else None

    return dict(wait_until(found, 20, f"a message for {consumer}"))


def hops_of(path: dict[str, Any], consumer: str) -> list[tuple[str, str, int | None]]:
    """(hop, where: the queue or the retry queue / inbox, attempt) of one consumer's hops."""
    return [
        (h["hop"], h.get("source") or f"queue {h.get('queue')}", h.get("attempt"))
        for h in path["hops"]
        if h.get("consumer") == consumer
    ]


def test_every_figure_matches_a_known_history(server: Server) -> None:
    client = setup(server, "gt", "gt", lockTimeoutS=1, maxAttempts=2)
    other_token = server.admin("POST", "/admin/consumers", name="gt-other", topic="gt", start="earliest")[
        "token"
    ]
    other = Client(server, None, other_token)
    server.admin("POST", "/admin/trace-policies", mode="project", project="gt", level="info")
    fine = client.produce("gt-p", "fine").json()["result"]["msgId"]
    poison = client.produce("gt-p", "poison").json()["result"]["msgId"]

    got = one(client, "gt-c")  # fine: delivered once, acked
    assert [(m["messageId"], m["offset"], m["reconsumeTimes"]) for m in got["msgList"]] == [(fine, 0, 0)]
    assert client.call("/mq/ack", requestId=got["requestId"]).status_code == 200
    got = one(client, "gt-c")  # poison: delivered, not acked: its lock expires
    assert [(m["messageId"], m["offset"], m["reconsumeTimes"]) for m in got["msgList"]] == [(poison, 1, 0)]
    again = one(client, "gt-c")  # from the retry queue, its 2nd and last attempt: released
    assert [(m["messageId"], m["source"], m["reconsumeTimes"]) for m in again["msgList"]] == [
        (poison, "%RETRY%gt-c", 1)
    ]
    assert client.call("/mq/release", requestId=again["requestId"]).status_code == 200
    (dead,) = dead_letters(server, "gt-c", 1)
    assert dead["messageId"] == poison and dead["message"] == "poison"
    assert {k: dead["properties"][k] for k in ("dlq.reason", "dlq.attempts", "dlq.source", "dlq.offset")} == {
        "dlq.reason": "max_attempts",
        "dlq.attempts": "2",
        "dlq.source": "%RETRY%gt-c",
        "dlq.offset": "0",
    }
    for _ in range(2):  # the other group reads both and acks
        got = one(other, "gt-other")
        assert other.call("/mq/ack", requestId=got["requestId"]).status_code == 200
    redrive = server.admin("POST", "/admin/consumers/gt-c/dead-letters/redrive", messageId=poison)
    assert [(r["messageId"], r["topic"]) for r in redrive["redriven"]] == [(poison, "%INBOX%gt-c")]
    got = one(client, "gt-c")
    assert [(m["messageId"], m["source"], m["reconsumeTimes"]) for m in got["msgList"]] == [
        (poison, "%INBOX%gt-c", 0)  # a redrive starts the message's attempts again (SQS does too)
    ]
    assert client.call("/mq/ack", requestId=got["requestId"]).status_code == 200
    assert one_more_is_none(client, other)

    # --- the consumers' progress: every row what happened to it -------------------------------
    rows = {r["source"]: r for r in server.admin("GET", "/admin/consumers/gt-c/progress")["queues"]}
    progress = server.admin("GET", "/admin/consumers/gt-c/progress")
    assert (progress["lag"], progress["deadLettered"]) == (0, 1)
    assert {s: (r["max"], r["committed"], r["lag"], r["locked"]) for s, r in rows.items()} == {
        "gt": (2, 2, 0, False),
        "%RETRY%gt-c": (1, 1, 0, False),
        "%INBOX%gt-c": (1, 1, 0, False),
    }
    assert rows["%RETRY%gt-c"]["deadLettered"] == 1
    theirs = server.admin("GET", "/admin/consumers/gt-other/progress")
    assert (theirs["lag"], theirs["deadLettered"]) == (0, 0)  # the redrive did not reach them
    assert {r["source"]: r["max"] for r in theirs["queues"]}["%INBOX%gt-other"] == 0
    state = server.admin("GET", "/admin/consumers/gt-c/dead-letters")
    assert {k: state[k] for k in ("min", "max", "position", "redriven")} == {
        "min": 0, "max": 1, "position": 1, "redriven": 1,
    }  # fmt: skip

    # --- the trace paths ------------------------------------------------------------------------
    def settled() -> dict[str, Any] | None:
        paths = traces(server, msgId=poison)["paths"]
        hops = paths[0]["hops"] if paths else []
        return paths[0] if sum(h["hop"] == "acked" for h in hops) == 2 else None

    path = wait_until(settled, 20, "the redriven copy's ack")
    assert hops_of(path, "gt-c") == [
        ("delivered", "queue 0", 1),
        ("lock_expired", "queue 0", 1),
        ("redelivered", "queue 0", 2),
        ("delivered", "%RETRY%gt-c", 2),
        ("released", "%RETRY%gt-c", 2),
        ("dead_lettered", "%RETRY%gt-c", 2),
        ("redriven", "%INBOX%gt-c", None),
        ("delivered", "%INBOX%gt-c", 1),
        ("acked", "%INBOX%gt-c", None),
    ]
    assert hops_of(path, "gt-other") == [("delivered", "queue 0", 1), ("acked", "queue 0", None)]
    assert [f["hop"] for f in path["failures"]] == ["dead_lettered"]
    assert {c["consumer"]: (c["state"], c["committed"]) for c in path["consumers"]} == {
        "gt-c": ("consumed", 2),  # redriven and acked: no longer dead_lettered
        "gt-other": ("consumed", 2),
    }
    (fine_path,) = traces(server, msgId=fine)["paths"]
    assert hops_of(fine_path, "gt-c") == [("delivered", "queue 0", 1), ("acked", "queue 0", None)]
    assert {c["consumer"]: c["state"] for c in fine_path["consumers"]} == {
        "gt-c": "consumed",
        "gt-other": "consumed",
    }

    # --- the CLI tells the same story -----------------------------------------------------------
    common = ["--url", server.url, "--admin-token", server.admin_token]
    found = subprocess.run([MQGATE, "trace", "find", "--msg-id", poison, *common],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert found.returncode == 0, found.stderr
    for text in ("%RETRY%gt-c offset 0", "%INBOX%gt-c offset 0", "redriven", "dead_lettered"):
        assert text in found.stdout, (text, found.stdout)
    assert "queue None" not in found.stdout
    shown = subprocess.run([MQGATE, "consumer", "progress", "gt-c", *common],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "%RETRY%gt-c" in shown.stdout and "%INBOX%gt-c" in shown.stdout, shown.stdout
    client.close()
    other.close()


def one_more_is_none(client: Client, other: Client) -> bool:
    """Nothing is left for either group."""
    mine = client.pull("gt", "gt-c", max=10, wait=0).json()["result"]["status"]
    theirs = other.pull("gt", "gt-other", max=10, wait=0).json()["result"]["status"]
    return mine == theirs == "NO_NEW_MSG"
