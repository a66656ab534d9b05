"""A read-by-offset answer is bounded in bytes (`max_answer_bytes`), whatever its messages' size
and the `max` asked: it stops before the budget (at least one message) and its `next` pages on,
so nothing is skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server

BUDGET = 2 * 1024 * 1024
BODY = 600_000  # 3 fit in the budget, 4 do not


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", env={"MQGATE_MAX_ANSWER_BYTES": str(BUDGET)}).start()
    try:
        ptoken, _ = srv.setup_topic("big", queues=1)
        for i in range(8):
            r = httpx.post(
                srv.url + "/mq/produce",
                json={"producer": "big-p", "message": f"{i}" * BODY, "keys": ["k"]},
                headers={"Authorization": f"Bearer {ptoken}"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
        yield srv
    finally:
        srv.stop()


def pages(srv: Server, path: str, **params: object) -> list[tuple[int, list[int], int]]:
    """(answer bytes, offsets, next) of each page until the queue's end."""
    out = []
    start = 0
    while start < 8:
        r = httpx.get(
            srv.url + path,
            params={"topic": "big", "queue": 0, "offset": start, "max": 100, **params},
            headers={"Authorization": f"Bearer {srv.admin_token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        offsets = [m["offset"] for m in result["msgList"]]
        out.append((len(r.content), offsets, result["next"]))
        assert offsets, "an answer holds at least one message"
        start = result["next"]
    return out


@pytest.mark.parametrize("path", ["/mq/read", "/mq/browse"])
def test_an_answer_stops_at_its_byte_budget_and_pages_on(bounded: Server, path: str) -> None:
    got = pages(bounded, path)
    assert [offsets for _, offsets, _ in got] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert all(size < BUDGET + 64 * 1024 for size, _, _ in got)


def test_a_key_search_stops_at_its_byte_budget_and_pages_on(bounded: Server) -> None:
    got = pages(bounded, "/mq/browse", key="k")
    assert [offsets for _, offsets, _ in got] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_a_pull_stops_at_its_byte_budget_and_the_rest_comes_next(bounded: Server) -> None:
    """A pull of max=100 over 600 kB messages answered all 8 (4.8 MB over a 2 MiB budget): it
    holds what fits (at least one), its ack commits those only, and the next pull goes on."""
    ctoken = bounded.admin("POST", "/admin/consumers/big-c/token")["token"]
    got: list[list[int]] = []
    request_id = None
    while sum(map(len, got)) < 8:
        params = {"topic": "big", "consumer": "big-c", "max": 100, "wait": 5}
        if request_id is not None:
            params["requestId"] = request_id  # acks the batch before
        r = httpx.get(bounded.url + "/mq/message", params=params,
                      headers={"Authorization": f"Bearer {ctoken}"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        assert len(r.content) < BUDGET + 64 * 1024
        result = r.json()["result"]
        assert result["status"] == "FOUND", result
        got.append([m["offset"] for m in result["msgList"]])
        request_id = result["requestId"]
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7]]
