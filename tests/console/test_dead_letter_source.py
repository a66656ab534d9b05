"""The dead-letter page names where each dead letter was read: a store queue of the topic, or
the consumer's retry queue or inbox (`dlq.source`), each with its queue and offset."""

from __future__ import annotations

import html
import re
import time
from typing import Any

import httpx

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, sign_in

TOPIC, CONSUMER, PRODUCER = "dls", "dls-c", "dls-p"


def sources(page: str) -> dict[str, str]:
    """The dead-letter table's "From" column, by message body."""
    header = re.search(r"<thead>(.*?)</thead>", page, re.S)
    assert header is not None
    names = [
        html.unescape(re.sub(r"<[^>]+>", "", h)).strip()
        for h in re.findall(r"<th[^>]*>(.*?)</th>", header.group(1), re.S)
    ]
    rows = {}
    for row in re.findall(r'<tr data-offset="\d+">(.*?)</tr>', page, re.S):
        texts = [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        rows[texts[names.index("Body")]] = texts
    return {body: texts[names.index("From")] for body, texts in rows.items()}


def test_each_dead_letter_names_the_queue_it_was_read_from(console: ConsoleServer) -> None:
    console.admin("POST", "/admin/topics", name=TOPIC, queues=4)
    ptoken = console.admin("POST", "/admin/producers", name=PRODUCER, topic=TOPIC,
                           destinations=[f"inbox:{CONSUMER}"])["token"]  # fmt: skip
    ctoken = console.admin("POST", "/admin/consumers", name=CONSUMER, topic=TOPIC, start="earliest",
                           maxAttempts=2)["token"]  # fmt: skip
    p_auth, c_auth = {"Authorization": f"Bearer {ptoken}"}, {"Authorization": f"Bearer {ctoken}"}

    def produce(**message: Any) -> dict[str, Any]:
        r = httpx.post(console.url + "/mq/produce", json={"producer": PRODUCER, **message}, headers=p_auth)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()["result"]
        return result

    def pull() -> dict[str, Any]:
        r = httpx.get(console.url + "/mq/message", params={"topic": TOPIC, "consumer": CONSUMER, "wait": 1},
                      headers=c_auth, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()["result"]
        return result

    def pull_until(body: str) -> dict[str, Any]:
        """The next batch that holds the message `body`."""
        deadline = time.monotonic() + 10
        while True:
            batch = pull()
            if any(m["message"] == body for m in batch.get("msgList", [])):
                return batch
            assert time.monotonic() < deadline, f"{body} was not delivered"

    def dead_lettered(count: int) -> bool:
        pull()  # a pull finds expired messages and moves them to the dead letters
        return bool(console.admin("GET", f"/admin/consumers/{CONSUMER}/progress")["deadLettered"] == count)

    # Expired in a store queue of the topic: order keys until one picks a queue other than 0.
    probes = 0
    while (queue := produce(message=f"probe-{probes}", orderKey=f"k{probes}", ttlMs=1)["queue"]) == 0:
        probes += 1
    time.sleep(0.01)  # the 1 ms validity passes: a deadline in time, not a wait for a process
    wait_until(lambda: dead_lettered(probes + 1), 10, "the expired messages to be dead-lettered")
    # Expired in the consumer's inbox.
    produce(message="from-inbox", destinations=[{"consumer": CONSUMER, "ttlMs": 1}])
    time.sleep(0.01)
    wait_until(lambda: dead_lettered(probes + 2), 10, "the inbox message to be dead-lettered")
    # Released once (to the retry queue), released again from there: out of attempts.
    produce(message="from-retry")
    for _ in range(2):
        batch = pull_until("from-retry")
        released = httpx.post(
            console.url + "/mq/release", json={"requestId": batch["requestId"]}, headers=c_auth
        )
        assert released.status_code == 200, released.text
    wait_until(lambda: dead_lettered(probes + 3), 10, "the retried message to be dead-lettered")

    page = sign_in(console, "admin").get(f"/console/consumers/{CONSUMER}/dead-letters").text
    assert sources(page) == {
        **{f"probe-{i}": f"{TOPIC} queue 0 · offset {i}" for i in range(probes)},
        f"probe-{probes}": f"{TOPIC} queue {queue} · offset 0",
        "from-inbox": f"inbox: %INBOX%{CONSUMER} queue 0 · offset 0",
        "from-retry": f"retry: %RETRY%{CONSUMER} queue 0 · offset 0",
    }
