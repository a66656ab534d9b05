"""A read checks what it read against the index: index entries swapped, or pointing at another
record, in the active segment (trusted at start-up under its checkpoint) or in a sealed one.
Reads and pulls answer 200 with each offset's own message, never a 500, never another record's
data; the index is rebuilt from the records and the rebuild is counted."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server

N = 120


def produce(srv: Server, ptoken: str) -> dict[int, str]:
    sent: dict[int, str] = {}
    for first in range(0, N, 10):  # batches of 10: a 4 KiB segment rolls between them
        r = httpx.post(
            srv.url + "/mq/produce/batch",
            json={"producer": "idx-p", "messages": [{"message": f"m{i}"} for i in range(first, first + 10)]},
            headers={"Authorization": f"Bearer {ptoken}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        sent |= {rec["offset"]: rec["msgId"] for rec in r.json()["result"]["receipts"]}
    return sent


def read(srv: Server, offset: int, count: int) -> list[dict[str, Any]]:
    r = httpx.get(
        srv.url + "/mq/read",
        params={"topic": "idx", "queue": 0, "offset": offset, "max": count},
        headers={"Authorization": f"Bearer {srv.admin_token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return list(r.json()["result"]["msgList"])


def scramble(idx: Path) -> None:
    """Swap two neighbouring entries, swap two distant ones, point one at another record."""
    entries = array("Q")
    entries.frombytes(idx.read_bytes())
    assert len(entries) > 12
    entries[3], entries[4] = entries[4], entries[3]
    entries[5], entries[10] = entries[10], entries[5]
    entries[8] = entries[9]
    idx.write_bytes(entries.tobytes())


@pytest.mark.parametrize("segment", ["active", "sealed"])
def test_wrong_index_entries_never_serve_another_record(tmp_path: Path, segment: str) -> None:
    env = {"MQGATE_SEGMENT_BYTES": "4096"} if segment == "sealed" else {}
    srv = Server(tmp_path / "data", env=env).start()
    try:
        ptoken, ctoken = srv.setup_topic("idx", queues=1)
        sent = produce(srv, ptoken)
        srv.stop()
        qdir = tmp_path / "data" / "topics" / "idx" / "0"
        indexes = sorted(qdir.glob("*.idx"))
        assert len(indexes) == (1 if segment == "active" else len(list(qdir.glob("*.log"))))
        assert (len(indexes) > 2) == (segment == "sealed")
        scramble(indexes[0])
        srv.start()

        for offset in (3, 4, 5, 8, 10):  # one at a time, first: no range read has rebuilt it yet
            (one,) = read(srv, offset, 1)
            assert (one["offset"], one["messageId"]) == (offset, sent[offset])
        got = read(srv, 0, 1000)
        assert {m["offset"]: m["messageId"] for m in got} == sent
        pulled: list[str] = []
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {ctoken}"}, timeout=30) as c:
            while True:
                body = c.get("/mq/message", params={"topic": "idx", "consumer": "idx-c", "max": 50})
                assert body.status_code == 200, body.text
                result = body.json()["result"]
                if result["status"] != "FOUND":
                    break
                pulled += [m["messageId"] for m in result["msgList"]]
                assert c.post("/mq/ack", json={"requestId": result["requestId"]}).status_code == 200
        assert pulled == [sent[o] for o in range(N)]
        health = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]
        assert [f["kind"] for f in health["faults"]] == ["index_rebuilt"], health
    finally:
        srv.stop()
