"""The job on a gateway's own trace topic: a project with a trace policy, produces, pulls,
acks and a release through HTTP (concurrent produces, so trace round records too; a batch, so
runs of ids), then
`mqgate analytics --project NAME` counts them from `%TRACE%<project>` (read with
format("mqgate"), its consumer group `analytics-<project>`)."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from mqgate.analytics.job import run_analytics
from mqgate.cli.analytics import add_parser, options
from mqgate.client import Client
from tests.conftest import Server, wait_until

pytestmark = pytest.mark.slow

MESSAGES = 12


def cli_options(*argv: str) -> Any:
    parser = argparse.ArgumentParser(prog="mqgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return options(parser.parse_args(["analytics", *argv]))


class TracedItsOwnReads(AssertionError):
    """The gateway wrote trace events about the job's own reads of the trace topic into it."""


def test_the_job_counts_what_a_real_gateway_traced(spark: Any, tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        srv.admin("POST", "/admin/projects", name="shop")
        srv.admin("POST", "/admin/topics", name="orders", queues=2, project="shop")
        ptoken = srv.admin("POST", "/admin/producers", name="orders-p", topic="orders")["token"]
        ctoken = srv.admin("POST", "/admin/consumers", name="orders-c", topic="orders")["token"]
        srv.admin("POST", "/admin/trace-policies", mode="project", project="shop")
        http = httpx.Client(base_url=srv.url, timeout=30)
        p, c = {"Authorization": f"Bearer {ptoken}"}, {"Authorization": f"Bearer {ctoken}"}
        ids: list[str] = []

        def produce(i: int) -> str:
            r = http.post("/mq/produce", json={"producer": "orders-p", "message": f"order {i}"}, headers=p)
            assert r.status_code == 200, r.text
            return str(r.json()["result"]["msgId"])

        def shared_a_round() -> bool:  # concurrent produces, until one commit round held several
            with ThreadPoolExecutor(MESSAGES) as pool:
                ids.extend(pool.map(produce, range(len(ids), len(ids) + MESSAGES)))
            with Client(srv.url, srv.admin_token) as gw:
                return b'["round"]' in gw.read("%TRACE%shop", 0, 0, 10_000)

        wait_until(shared_a_round, 60, "the trace records of several produces in one round record")
        # A batch over both queues: one record, each queue's messages a run of ids (parts).
        r = http.post(
            "/mq/produce/batch",
            json={"producer": "orders-p", "messages": [{"message": f"batch {i}"} for i in range(6)]},
            headers=p,
        )
        assert r.status_code == 200, r.text
        ids.extend(rc["msgId"] for rc in r.json()["result"]["receipts"])
        with Client(srv.url, srv.admin_token) as gw:
            assert b'parts\\":[{' in gw.read("%TRACE%shop", 0, 0, 10_000)

        def pull(most: int) -> dict[str, Any]:
            params = {"topic": "orders", "consumer": "orders-c", "max": most, "wait": 1}
            return dict(http.get("/mq/message", params=params, headers=c).json()["result"])

        first = pull(4)
        released = len(first["msgList"])
        assert (
            released
            and http.post("/mq/release", json={"requestId": first["requestId"]}, headers=c).is_success
        )
        delivered, acked = released, set()

        def consume() -> bool:  # everything, the released batch too once its backoff is over
            nonlocal delivered
            got = pull(32)
            if got["status"] == "FOUND":
                delivered += len(got["msgList"])
                assert http.post("/mq/ack", json={"requestId": got["requestId"]}, headers=c).is_success
                acked.update(m["messageId"] for m in got["msgList"])
            return acked == set(ids)

        wait_until(consume, 30, "every message acked")

        def traced() -> bool:  # every hop of every message in the trace topic
            for msg_id in ids:
                found = srv.admin("GET", f"/admin/traces?msgId={msg_id}")
                hops = [h["hop"] for path in found["paths"] for h in path["hops"]]
                if found["mayBeIncomplete"] or "acked" not in hops:
                    return False
            return True

        wait_until(traced, 20, "the trace index to hold every acked hop")
        http.close()

        opts = cli_options(
            "--gateway",
            srv.url,
            "--admin-token",
            srv.admin_token,
            "--project",
            "shop",
            "--out",
            str(tmp_path / "out"),
        )
        summary = run_analytics(opts, spark)
        counts = summary.report["counts"]["byProject"]["shop"]
        assert (counts["produced"], counts["delivered"], counts["acked"], counts["released"]) == (
            len(ids),
            delivered,
            len(ids),
            released,
        )
        assert counts["redelivered"] == released and counts["failed"] == 0
        assert summary.malformed_read == 0 and summary.report["malformed"]["count"] == 0
        assert summary.events_read == summary.report["counts"]["total"]["events"]
        with Client(srv.url, srv.admin_token) as gw:
            lag = gw.progress("analytics-shop")["lag"]
        again = run_analytics(opts, spark)  # nothing was traced since: nothing to read
        if lag or again.events_read:
            raise TracedItsOwnReads(
                f"after its run the job's group is {lag} events behind, and a rerun read "
                f"{again.events_read} more: {again.report['counts']['byHop']}"
            )
        assert again.report["counts"] == summary.report["counts"]
    finally:
        srv.stop()
