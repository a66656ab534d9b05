"""Issue 27: an alert check with nothing changed evaluates no rule (a check evaluated every
consumer's rules, reading its dead-letter topic, every `alert_check_interval_s`); a produce has
the consumers of its topic evaluated, and their lag alert fires; a dead-letter alert still
resolves when its quiet window passes, with nothing else moving.

A real gateway process (embedded store), checks every 0.2 s; checks and consumers evaluated are
counted from /metrics (`mqgate_alert_checks_total`, `mqgate_alert_consumers_checked_total`),
never through GET /admin/alerts (which checks too)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.conftest import Server, metric_samples, wait_until

TOPICS = 20
PER_TOPIC = 3  # 60 consumers


def figures(server: Server) -> dict[str, float]:
    return metric_samples(httpx.get(server.url + "/metrics", timeout=10).text)


def counters(server: Server) -> tuple[int, int, dict[str, float]]:
    """(checks, consumers evaluated) so far, and every figure."""
    f = figures(server)
    if "mqgate_alert_consumers_checked_total" not in f:
        raise AssertionError("no mqgate_alert_consumers_checked_total in /metrics")
    checks = sum(v for k, v in f.items() if k.startswith("mqgate_alert_checks_total"))
    return int(checks), int(f["mqgate_alert_consumers_checked_total"]), f


def checks_beyond(server: Server, checks: int, more: int) -> tuple[int, int, dict[str, float]]:
    """Poll until `more` checks ended after `checks`; the counters then."""
    found: tuple[int, int, dict[str, float]] = wait_until(
        lambda: (c := counters(server))[0] >= checks + more and c, 30, f"{more} alert checks"
    )
    return found


def active(f: dict[str, float], kind: str) -> float:
    return f.get(f'mqgate_alerts_active{{kind="{kind}"}}', 0.0)


def test_idle_checks_evaluate_nothing_and_a_change_its_consumers(tmp_path: Path) -> None:
    env = {"MQGATE_ALERT_CHECK_INTERVAL_S": "0.2", "MQGATE_ALERT_DEAD_LETTER_WINDOW_S": "2"}
    server = Server(tmp_path / "data", env=env).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    try:
        tokens = {}
        for i in range(TOPICS):
            server.admin("POST", "/admin/topics", name=f"t{i}", queues=1)
            for j in range(PER_TOPIC):
                name = f"c{i}-{j}"
                tokens[name] = server.admin("POST", "/admin/consumers", name=name, topic=f"t{i}",
                                            start="earliest")["token"]  # fmt: skip
        for j in range(PER_TOPIC):
            server.admin("POST", f"/admin/consumers/c3-{j}/alert", backlog=1)
        ptoken = server.admin("POST", "/admin/producers", name="p3", topic="t3")["token"]
        p5token = server.admin("POST", "/admin/producers", name="p5", topic="t5")["token"]

        # Idle: once the checks under way have taken the registrations (two checks), five checks
        # evaluate no consumer.
        checks, _, _ = checks_beyond(server, counters(server)[0], 2)
        before, evaluated, _ = counters(server)
        checks, idle, _ = checks_beyond(server, before, 5)
        per_check = (idle - evaluated) / (checks - before)
        assert idle == evaluated, f"{per_check:g} consumers evaluated per idle check"

        # Two messages to t3 (one queue, one write): its three consumers, and only they, are
        # evaluated; each one's lag (2) is over its threshold (1).
        batch = {"producer": "p3", "messages": [{"message": "a"}, {"message": "b"}]}
        r = http.post("/mq/produce/batch", json=batch, headers={"Authorization": f"Bearer {ptoken}"})
        assert r.status_code == 200, r.text
        f = wait_until(lambda: active(f := figures(server), "lag") == PER_TOPIC and f, 10, "the lag alerts")
        checks, fired, _ = checks_beyond(server, counters(server)[0], 1)
        assert fired - idle == PER_TOPIC

        # Two messages to t5 past their deadline, pulled by c5-0: dead-lettered, the alert
        # fires; with nothing moving after that, it resolves once the window (2 s) has passed.
        for k in range(2):
            r = http.post("/mq/produce", json={"producer": "p5", "message": f"m{k}", "ttlMs": 1},
                          headers={"Authorization": f"Bearer {p5token}"})  # fmt: skip
            assert r.status_code == 200, r.text
        # Let the 1 ms validity pass (a deadline in time, not a wait for a process): a pull
        # within 2 ms of the produce is handed m1, and its lock holds it past this test's wait.
        time.sleep(0.01)

        def dead_lettered() -> bool:
            pulled = http.get("/mq/message", params={"topic": "t5", "consumer": "c5-0", "max": 10},
                              headers={"Authorization": f"Bearer {tokens['c5-0']}"})  # fmt: skip
            assert pulled.status_code == 200, pulled.text
            progress = server.admin("GET", "/admin/consumers/c5-0/progress")
            return bool(pulled.json()["result"]["status"] != "FOUND" and progress["deadLettered"] == 2)

        wait_until(dead_lettered, 10, "the expired messages to be dead-lettered")
        wait_until(lambda: active(figures(server), "dead_letters") == 1, 10, "the dead-letter alert")
        fired_at = time.monotonic()
        wait_until(lambda: active(figures(server), "dead_letters") == 0, 15, "the quiet window to pass")
        assert time.monotonic() - fired_at >= 1.0  # not before the window had passed
        checks, resolved, _ = counters(server)

        # Idle again: nobody.
        before = checks
        checks, idle, f = checks_beyond(server, checks, 5)
        per_check = (idle - resolved) / (checks - before)
        assert idle == resolved, f"{per_check:g} consumers evaluated per idle check"
        assert active(f, "lag") == PER_TOPIC  # still firing: nothing was consumed
    finally:
        http.close()
        server.stop()
