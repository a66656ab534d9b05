"""The queue fault timeline of a real gateway (1 s intervals, sampled every 0.1 s): a consumer
that stops pulling and a store that refuses writes (the gateway restarted with a free-space
floor above the disk's free space: every produce is 507 `disk_full`) are found in the
intervals they happened in, read from the gateway's history database. Through the gateway's
API only queue intervals come back, so neither can be found there: the section says so."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from mqgate.analytics import queuefaults
from mqgate.analytics.queuestate_source import GATEWAY_MISSING, GatewaySource, HistorySource
from mqgate.client import Client
from mqgate.queuestate.diagnosis import Thresholds
from tests.conftest import Server, wait_until

# 1 s intervals read against wall time: coverage's tracing of this process would blur them.
pytestmark = [pytest.mark.slow, pytest.mark.no_cover]

STEP = 1000
THRESHOLDS = Thresholds(silent_after_ms=2000)  # the rules' other settings as the gateway has them


def wall() -> int:
    return int(time.time() * 1000)


class Traffic:
    """Produce and consume through HTTP, keeping each call's send and answer times."""

    def __init__(self, srv: Server, ptoken: str, ctoken: str) -> None:
        self.srv = srv
        self.http = httpx.Client(timeout=30)
        self.p = {"Authorization": f"Bearer {ptoken}"}
        self.c = {"Authorization": f"Bearer {ctoken}"}
        self.pulls: list[tuple[int, int]] = []
        self.refused: list[tuple[int, int]] = []

    def produce(self) -> None:
        sent = wall()
        r = self.http.post(
            self.srv.url + "/mq/produce", json={"producer": "jobs-p", "message": "x"}, headers=self.p
        )
        if r.status_code == 507:
            assert r.json()["result"]["code"] == "disk_full", r.text
            self.refused.append((sent, wall()))
        else:
            assert r.status_code == 200, r.text

    def consume(self) -> bool:
        sent = wall()
        params = {"topic": "jobs", "consumer": "jobs-c", "max": 64}
        res = self.http.get(self.srv.url + "/mq/message", params=params, headers=self.c).json()["result"]
        self.pulls.append((sent, wall()))
        if res["status"] != "FOUND":
            return False
        ack = self.http.post(self.srv.url + "/mq/ack", json={"requestId": res["requestId"]}, headers=self.c)
        assert ack.status_code == 200, ack.text
        return True

    def run(self, seconds: float, *steps: Callable[[], Any]) -> None:
        """Call the steps over and over for `seconds` of wall time (this is the load, not a wait)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for step in steps:
                step()


def intervals(a: int, b: int) -> list[int]:
    """The interval starts in [a, b)."""
    return list(range(-(-a // STEP) * STEP, b, STEP))


def test_a_consumer_down_and_a_store_fault_of_a_real_gateway_are_found_in_their_intervals(
    tmp_path: Path,
) -> None:
    env = {"MQGATE_QUEUE_STATE_INTERVAL_S": "1", "MQGATE_QUEUE_STATE_SAMPLE_S": "0.1",
           "MQGATE_DISK_FREE_FLOOR_BYTES": "0"}  # fmt: skip
    srv = Server(tmp_path / "data", env=env).start()
    try:
        srv.admin("POST", "/admin/projects", name="ops")
        srv.admin("POST", "/admin/topics", name="jobs", queues=2, project="ops")
        ptoken = srv.admin("POST", "/admin/producers", name="jobs-p", topic="jobs")["token"]
        ctoken = srv.admin("POST", "/admin/consumers", name="jobs-c", topic="jobs")["token"]
        load = Traffic(srv, ptoken, ctoken)
        began = wall()
        load.run(3, load.produce, load.consume)  # healthy
        last_pull = load.pulls[-1]
        load.run(4.5, load.produce)  # the consumer is down; its backlog grows
        load.consume()
        resumed = load.pulls[-1]
        load.run(2, load.produce, load.consume)
        wait_until(lambda: not load.consume(), 10, "the backlog to drain")  # none left across the restart
        srv.stop()
        srv.env["MQGATE_DISK_FREE_FLOOR_BYTES"] = str(2**62)  # the store refuses every write
        srv.start()
        load.run(2.5, load.produce, load.consume)
        assert load.refused, "the store refused nothing"
        srv.stop()
        srv.env["MQGATE_DISK_FREE_FLOOR_BYTES"] = "0"
        srv.start()
        load.run(2, load.produce, load.consume)
        ended = wall() // STEP * STEP  # the intervals closed by now

        with Client(srv.url, srv.admin_token) as gw:
            api = queuefaults.section(GatewaySource(gw), "ops", began, ended, THRESHOLDS)
        load.http.close()
    finally:
        srv.stop()  # writes the open interval

    history = HistorySource(str(tmp_path / "data" / "queue-state.sqlite"))
    try:
        section = queuefaults.section(history, "ops", began, ended, THRESHOLDS)
    finally:
        history.close()
    tl = section["projects"]["ops"]
    assert tl["intervalMs"] == STEP
    # The interval the consumer stops in may also show as too slow: it pulled and acked in it
    # while its backlog grew (past min_growth, since the load keeps producing). Nowhere else.
    slow = [r for r in tl["runs"] if r["rule"] == "consumers_too_slow"]
    stop_interval = {last_pull[0] // STEP * STEP, last_pull[1] // STEP * STEP}
    assert all(r["intervals"] == 1 and r["fromMs"] in stop_interval for r in slow), slow
    runs = [(r["rule"], r["topic"], r["queue"], r["consumer"]) for r in tl["runs"] if r not in slow]
    assert runs == [("consumer_down", "jobs", None, "jobs-c"), ("store_fault", "jobs", None, None)], tl[
        "runs"
    ]
    marked = {r["rule"]: intervals(r["fromMs"], r["toMs"]) for r in tl["runs"]}

    # Down from the interval after the gateway handled the last pull (between its send and its
    # answer) to the interval before the one it handled the next pull in.
    surely = intervals(last_pull[1], resumed[0] // STEP * STEP)
    at_most = intervals(last_pull[0], resumed[1] // STEP * STEP)
    assert len(surely) >= 3 and set(surely) <= set(marked["consumer_down"]) <= set(at_most)
    # A store fault in every interval a produce was refused in, and in no other.
    surely = {a // STEP * STEP for a, b in load.refused if a // STEP == b // STEP}
    at_most = {t // STEP * STEP for pair in load.refused for t in pair}
    assert surely <= set(marked["store_fault"]) <= at_most
    states = {i["t"]: i["state"] for i in tl["intervals"]}
    assert {states[t] for t in marked["consumer_down"]} == {"consumer_fault"}
    assert {states[t] for t in marked["store_fault"]} == {"queue_fault"}
    faulty = set(marked["consumer_down"]) | set(marked["store_fault"]) | {r["fromMs"] for r in slow}
    assert {s for t, s in states.items() if t not in faulty} <= {"healthy", "no_data"}
    assert tl["totals"]["healthy"] >= 6  # before, between and after the faults

    # The gateway's API gives queue intervals only: neither fault can be found through it.
    assert api["complete"] is False and api["source"]["missing"] == GATEWAY_MISSING
    queues_only = api["projects"]["ops"]
    assert queues_only["runs"] == [] and {lane["side"] for lane in queues_only["lanes"]} == {"queue"}
    assert len(queues_only["intervals"]) >= 10
