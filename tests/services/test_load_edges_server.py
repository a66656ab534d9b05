"""Load edges (issue 10, section 3) on real `mqgate serve` processes: SIGTERM with long polls
waiting, and the metrics token."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import STORES, Server, store_server, wait_until

LONG_POLLS = 50
ANSWER_BUDGET_S = 2.0  # the long polls wait 30 s; before, SIGTERM cut them off after 5 s
EXIT_BUDGET_S = 5.0
RAMP = 10


def waiting_pulls(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=5).text
    found = re.findall(r"^mqgate_waiting_pulls\{[^}]*\} ([0-9.]+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


@pytest.mark.parametrize("store", STORES)
def test_sigterm_answers_waiting_long_polls_at_once_and_exits(tmp_path: Path, store: str) -> None:
    srv, cleanup = store_server(tmp_path / "data", store)
    srv.start()
    try:
        _, ctoken = srv.setup_topic("t", queues=4)

        async def go() -> tuple[list[httpx.Response | BaseException], float, float]:
            limits = httpx.Limits(max_connections=LONG_POLLS + 5)
            async with httpx.AsyncClient(base_url=srv.url, limits=limits, timeout=60) as http:
                pulls: list[asyncio.Task[httpx.Response]] = []
                deadline = time.monotonic() + 30
                # In steps: fifty first pulls at once exceed the Redis client's connection pool.
                for _ in range(LONG_POLLS // RAMP):
                    pulls += [
                        asyncio.create_task(
                            http.get(
                                "/mq/message",
                                params={"topic": "t", "consumer": "t-c", "wait": 30},
                                headers={"Authorization": f"Bearer {ctoken}"},
                            )
                        )
                        for _ in range(RAMP)
                    ]
                    while await asyncio.to_thread(waiting_pulls, srv) < len(pulls):
                        assert time.monotonic() < deadline, "the long polls did not all start waiting"
                        assert not any(p.done() for p in pulls), [p.result().text for p in pulls if p.done()]
                        await asyncio.sleep(0.02)
                started = time.monotonic()
                assert srv.proc is not None
                srv.proc.send_signal(signal.SIGTERM)
                answers = await asyncio.gather(*pulls, return_exceptions=True)
                answered_s = time.monotonic() - started
                await asyncio.to_thread(srv.proc.wait, 30)
                return answers, answered_s, time.monotonic() - started

        answers, answered_s, exited_s = asyncio.run(go())
        statuses = [
            (a.status_code, a.json()["result"]["status"] if a.status_code == 200 else a.text[:80])
            if isinstance(a, httpx.Response)
            else repr(a)
            for a in answers
        ]
        assert statuses == [(200, "NO_NEW_MSG")] * LONG_POLLS, statuses
        assert answered_s < ANSWER_BUDGET_S, f"answered after {answered_s:.2f}s"
        assert exited_s < EXIT_BUDGET_S, f"exited after {exited_s:.2f}s"
    finally:
        srv.stop()
        cleanup()


def test_metrics_need_the_metrics_token_when_one_is_set(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", env={"MQGATE_METRICS_TOKEN": "scrape-secret"}).start()
    try:
        assert httpx.get(srv.url + "/metrics", timeout=5).status_code == 401
        wrong = {"Authorization": "Bearer scrape-secrex"}
        assert httpx.get(srv.url + "/metrics", headers=wrong, timeout=5).status_code == 401
        right = {"Authorization": "Bearer scrape-secret"}
        r = httpx.get(srv.url + "/metrics", headers=right, timeout=5)
        assert r.status_code == 200 and "mqgate_request_seconds" in r.text
        assert httpx.get(srv.url + "/healthz", timeout=5).status_code == 200  # only /metrics
    finally:
        srv.stop()
    # Not set: open, as before.
    open_srv = Server(tmp_path / "open").start()
    try:
        wait_until(lambda: httpx.get(open_srv.url + "/metrics", timeout=5).status_code == 200, 5, "metrics")
    finally:
        open_srv.stop()
