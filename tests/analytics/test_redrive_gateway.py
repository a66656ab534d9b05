"""Issue 27 on a real gateway's trace topic: messages redelivered through the retry queue,
dead-lettered there (after a late ack the gateway refused), redriven to their consumer's
inbox and delivered again (one acked, one not), while a second consumer group acked them at
once. The report's phases are never negative, the redrive is its own path, and the dead
letters' finding names the queue they were stored in."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from mqgate.analytics.job import run_analytics
from mqgate.analytics.render import render_html
from tests.analytics.test_trace_topics import cli_options
from tests.conftest import Client, Server, wait_until

pytestmark = pytest.mark.slow

LOCK_S = 1


def _found(client: Client, consumer: str, most: int) -> dict[str, Any]:
    def pulled() -> dict[str, Any] | None:
        res = client.pull("orders", consumer, max=most, wait=1, clientId=f"{consumer}-1").json()["result"]
        return dict(res) if res["status"] == "FOUND" else None

    return dict(wait_until(pulled, 20, f"messages for {consumer}"))


def _hops(srv: Server, msg_id: str) -> list[dict[str, Any]]:
    found = srv.admin("GET", f"/admin/traces?msgId={msg_id}")
    if found["mayBeIncomplete"]:
        return []
    return [h for path in found["paths"] for h in path["hops"]]


def test_a_redriven_message_s_figures_on_a_real_gateway(spark: Any, tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        srv.admin("POST", "/admin/projects", name="shop")
        srv.admin("POST", "/admin/topics", name="orders", queues=1, project="shop")
        ptoken = srv.admin("POST", "/admin/producers", name="orders-p", topic="orders")["token"]
        ctoken = srv.admin(
            "POST", "/admin/consumers", name="billing", topic="orders", maxAttempts=2, lockTimeoutS=LOCK_S
        )["token"]
        atoken = srv.admin("POST", "/admin/consumers", name="audit", topic="orders")["token"]
        srv.admin("POST", "/admin/trace-policies", mode="project", project="shop", level="error")
        billing, audit = Client(srv, ptoken, ctoken), Client(srv, None, atoken)
        ids = [billing.produce("orders-p", f"order {i}").json()["result"]["msgId"] for i in range(2)]

        got = _found(audit, "audit", 10)  # the other group acks both at once
        assert len(got["msgList"]) == 2 and audit.call("/mq/ack", requestId=got["requestId"]).is_success
        first = _found(billing, "billing", 10)  # delivered, never acked: its lock expires
        assert len(first["msgList"]) == 2
        time.sleep(LOCK_S + 0.3)
        billing.pull("orders", "billing", max=10, wait=0)  # the expired batch goes to the retry queue
        late = billing.call("/mq/ack", requestId=first["requestId"])
        assert late.status_code == 409, late.text  # refused: traced as an acked hop with status error
        again = _found(billing, "billing", 10)  # from the retry queue; its lock expires too
        assert len(again["msgList"]) == 2
        time.sleep(LOCK_S + 0.3)

        def redriven() -> int:
            billing.pull("orders", "billing", max=10, wait=0)  # max attempts: dead-lettered
            done = srv.admin("POST", "/admin/consumers/billing/dead-letters/redrive", all=True)
            return len(done["redriven"])

        assert wait_until(redriven, 20, "the dead letters redriven") == 2
        acked = _found(billing, "billing", 1)  # from the inbox: one acked, one left
        assert billing.call("/mq/ack", requestId=acked["requestId"]).is_success
        left = _found(billing, "billing", 1)
        assert left["msgList"][0]["messageId"] != acked["msgList"][0]["messageId"]
        for msg_id in ids:
            wait_until(
                lambda m=msg_id: [h["hop"] for h in _hops(srv, m)].count("delivered") == 4,
                20,
                f"every hop of {msg_id} traced",
            )
        billing.close()
        audit.close()

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
        report = run_analytics(opts, spark).report
    finally:
        srv.stop()

    lat = report["latency"]
    groups = [lat["overall"], *lat["byTopicConsumer"], *lat["byClient"]]
    figures = [g[h][q] for g in groups for h in ("store", "deliver", "process", "endToEnd") if h in g
               for q in ("p50", "p90", "p99", "max")]  # fmt: skip
    figures += [s[h] for s in lat["slowest"] for h in ("deliver", "process", "endToEnd")]
    assert all(v is None or v >= 0 for v in figures), lat
    # End to end: audit's two acks only; billing dead-lettered both on their first path.
    assert sorted((s["consumer"], s["msgId"]) for s in lat["slowest"]) == sorted(("audit", m) for m in ids)
    assert all(s["endToEnd"] < 10_000 for s in lat["slowest"])
    billing_group = next(g for g in lat["byTopicConsumer"] if g["consumer"] == "billing")
    assert (billing_group["endToEnd"]["count"], billing_group["process"]["count"]) == (0, 0)
    redrive = lat["redrive"]
    assert (redrive["redriven"], redrive["acked"]) == (2, 1)
    assert redrive["overall"]["process"]["count"] == 1 and redrive["overall"]["process"]["max"] >= 0

    dead = next(f for f in report["findings"] if f.get("type") == "max_attempts")
    assert [(q["topic"], q["queue"]) for q in dead["queues"]] == [("orders", 0)]
    assert "none (before storing)" not in render_html(report, {}, None)
