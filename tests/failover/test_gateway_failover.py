"""Failover through the gateway's HTTP API (SPEC P8, E7): two real redis-servers of the test's
own as a project's primary and backup, gateways started as processes, the primary killed -9,
hung by SIGSTOP, or both clusters down. Producers and consumers use one gateway URL and the
same tokens throughout."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.conftest import Server, wait_until
from tests.failover.conftest import FailoverRedis, post_once_read

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

QUEUES = 4
# Short thresholds so a test sees a switch within a second or two (defaults: docs/FAILOVER.md).
FAST = {
    "MQGATE_FAILOVER_SEND_TIMEOUT_S": "1.0",
    "MQGATE_FAILOVER_PROBE_INTERVAL_S": "0.1",
    "MQGATE_FAILOVER_PROBE_TIMEOUT_S": "0.3",
    "MQGATE_FAILOVER_CHECK_S": "0.2",
    "MQGATE_FAILOVER_REJOIN_PROBES": "3",
}


ADMIN_TOKEN = "mqa_failover_test"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def gateway(data: Path, **env: str) -> Server:
    data.parent.mkdir(parents=True, exist_ok=True)
    return Server(data, admin_token=ADMIN_TOKEN, env={**FAST, **env})


def project_on(gw: Server, primary: FailoverRedis, backup: FailoverRedis) -> tuple[str, str]:
    """Project `shop` on clusters p (primary) and b (backup), topic `orders` with producer and
    consumer; their tokens."""
    gw.admin("POST", "/admin/clusters", name="p", url=primary.url)
    gw.admin("POST", "/admin/clusters", name="b", url=backup.url)
    gw.admin("POST", "/admin/projects", name="shop")
    gw.admin("PUT", "/admin/projects/shop/clusters", primary="p", backup="b")

    # Each registration that writes to the cluster is made once the switch record was read.
    def once_read(path: str, **body: Any) -> Any:
        return post_once_read(gw.url + path, gw.admin_token, body)

    once_read("/admin/topics", name="orders", queues=QUEUES, project="shop")
    ptoken = once_read("/admin/producers", name="orders-p", topic="orders")["token"]
    ctoken = once_read("/admin/consumers", name="orders-c", topic="orders", lockTimeoutS=2)["token"]
    return ptoken, ctoken


@dataclass
class Traffic:
    """Producers and consumers against one gateway; what each saw."""

    url: str
    ptoken: str
    ctoken: str
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[str, float] = field(default_factory=dict)  # msgId -> when its produce was answered
    statuses: dict[str, int] = field(default_factory=dict)  # receipt status -> count
    errors: list[tuple[float, int, str]] = field(default_factory=list)
    consumed: dict[str, int] = field(default_factory=dict)  # msgId -> deliveries
    # msgId -> its deliveries whose ack did not answer 200 (sent to the primary as it died, or
    # after the lock expired): each may be delivered again, by at-least-once.
    unacked: dict[str, int] = field(default_factory=dict)
    found_at: list[float] = field(default_factory=list)  # when each pull that found messages came back
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (when, produce seconds)
    brokers: list[tuple[float, str]] = field(default_factory=list)  # (when, cluster that stored a batch)

    def produce(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            i = 0
            while not self.stop.is_set():
                body = {"producer": "orders-p", "messages": [{"message": f"w{n}-{i}-{k}"} for k in range(5)]}
                started = time.monotonic()
                r = c.post("/mq/produce/batch", json=body, headers={"Authorization": f"Bearer {self.ptoken}"})
                now = time.monotonic()
                with self.lock:
                    if r.status_code != 200:
                        self.errors.append((now, r.status_code, r.text[:200]))
                        continue
                    self.latencies.append((now, now - started))
                    self.brokers.append((now, r.json()["result"]["receipts"][0]["broker"]))
                    for rc in r.json()["result"]["receipts"]:
                        self.acked[rc["msgId"]] = now
                        self.statuses[rc["status"]] = self.statuses.get(rc["status"], 0) + 1
                i += 1
                time.sleep(0.005)

    def consume(self) -> None:
        headers = {"Authorization": f"Bearer {self.ctoken}"}
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stop.is_set():
                r = c.get(
                    "/mq/message",
                    params={"topic": "orders", "consumer": "orders-c", "max": 50, "wait": 1},
                    headers=headers,
                )
                if r.status_code != 200:
                    with self.lock:
                        self.errors.append((time.monotonic(), r.status_code, "pull " + r.text[:200]))
                    time.sleep(0.05)
                    continue
                res = r.json()["result"]
                if res["status"] != "FOUND":
                    continue
                # Counted when delivered (at least once): an ack the killed primary applied just
                # before dying answers 503, and its messages are not delivered again.
                with self.lock:
                    self.found_at.append(time.monotonic())
                    for m in res["msgList"]:
                        self.consumed[m["messageId"]] = self.consumed.get(m["messageId"], 0) + 1
                ack = c.post(
                    "/mq/ack", json={"consumer": "orders-c", "requestId": res["requestId"]}, headers=headers
                )
                if ack.status_code != 200:
                    with self.lock:
                        for m in res["msgList"]:
                            self.unacked[m["messageId"]] = self.unacked.get(m["messageId"], 0) + 1

    def run(self, producers: int, consumers: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.produce, args=(n,)) for n in range(producers)]
        threads += [threading.Thread(target=self.consume) for _ in range(consumers)]
        for t in threads:
            t.start()
        return threads


def failover_state(gw: Server) -> Any:
    return gw.admin("GET", "/admin/projects/shop/failover")


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_kill9_of_the_primary_under_load(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook.server_address[1]}/alerts"
    gw = gateway(tmp_path / "gw" / "data", MQGATE_ALERT_WEBHOOK_URL=url).start()
    try:
        ptoken, ctoken = project_on(gw, primary, backup)
        assert failover_state(gw)["active"] == "p"
        traffic = Traffic(gw.url, ptoken, ctoken)
        threads = traffic.run(producers=4, consumers=4)
        wait_until(lambda: len(traffic.consumed) > 500, 30, "traffic on the primary")
        primary.kill9()
        killed = time.monotonic()
        wait_until(lambda: failover_state(gw)["active"] == "b", 15, "the switch to the backup")
        degraded = httpx.get(gw.url + "/healthz").json()["result"]["degraded"]
        assert "cluster p" in degraded, degraded
        switched = time.monotonic() - killed
        count_at_switch = len(traffic.acked)
        wait_until(lambda: len(traffic.acked) > count_at_switch + 500, 20, "produces after the switch")
        traffic.stop.set()
        for t in threads:
            t.join(30)
        # Drain: consumers pull until every acknowledged message was consumed (from the backup,
        # or from the primary before it died).
        primary.start()
        state = wait_until(lambda: (s := failover_state(gw)) and not s["draining"] and s, 30, "the drain")
        rest = Traffic(gw.url, ptoken, ctoken, consumed=traffic.consumed, unacked=traffic.unacked)
        threads = rest.run(producers=0, consumers=2)
        wait_until(
            lambda: not set(traffic.acked) - set(rest.consumed), 60, "every acknowledged message consumed"
        )
        rest.stop.set()
        for t in threads:
            t.join(30)
        produce_errors = [e for e in traffic.errors if not e[2].startswith("pull")]
        spool = gw.admin("GET", "/admin/spool")
        duplicates = sum(n - 1 for n in rest.consumed.values())
        # Deliveries beyond a message's first and its unacknowledged ones: only a stored copy
        # too many explains them.
        stored_twice = sum(max(n - 1 - rest.unacked.get(m, 0), 0) for m, n in rest.consumed.items())
        first_pull = min(t for t in traffic.found_at if t > killed) - killed
        around = sorted(d for t, d in traffic.latencies if killed - 1 <= t <= killed + 3)
        p99 = around[int(len(around) * 0.99)] if around else 0.0
        print(
            f"\nkill -9 of the primary: switched in {switched:.2f}s, first pull served after "
            f"{first_pull:.2f}s, produce p99 around the switch {p99 * 1000:.0f} ms, "
            f"{len(traffic.acked)} produced ({traffic.statuses}), produce errors {len(produce_errors)}, "
            f"pull errors {len(traffic.errors) - len(produce_errors)}, acks refused or failed for "
            f"{sum(rest.unacked.values())} messages, duplicates {duplicates} ({stored_twice} beyond "
            f"those; possible: {spool['possibleDuplicates']}), spooled {spool['spooledTotal']} resent "
            f"{spool['resentTotal']}, {state['reason']}"
        )
        assert not produce_errors, produce_errors[:5]
        # A pull may fail on the dying primary (503), never for a topic or inbox the switch has
        # not declared on the backup yet (issue 27 item 1: 404s in 3 of 9 runs).
        assert not [e for e in traffic.errors if e[1] == 404], traffic.errors[:5]
        assert switched < 5
        assert first_pull < switched + 5
        assert spool["pending"] == 0 and spool["resentTotal"] == spool["spooledTotal"]
        health = httpx.get(gw.url + "/healthz").json()["result"]
        assert "cluster p" not in health["degraded"]  # back and healthy
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'mqgate_project_switches_total{project="shop",to="b"} 1.0' in metrics
        switched_events = [e for e in _Hook.received if e.get("kind") == "project_switched"]
        assert [(e["before"], e["after"], e["reason"]) for e in switched_events] == [
            ("p", "b", "p is failed")
        ]
        # A message is stored twice only by the resend of a produce that failed mid-call.
        assert stored_twice <= spool["possibleDuplicates"]
    finally:
        gw.stop()
        hook.shutdown()
        hook.server_close()


def test_a_hung_primary_and_a_primary_refusing_writes_each_cause_a_switch(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """SIGSTOP: nothing answers, the send time-out fails it. Then fail-back to the primary, and
    an out-of-memory primary (maxmemory with noeviction refuses every write): the error rate
    fails it. Nothing acknowledged is lost across the three moves."""
    primary, backup = redis_pair
    gw = gateway(tmp_path / "gw" / "data").start()
    try:
        ptoken, ctoken = project_on(gw, primary, backup)
        produced: list[str] = []
        headers = {"Authorization": f"Bearer {ptoken}"}

        def produce(n: int) -> list[dict[str, Any]]:
            r = httpx.post(
                gw.url + "/mq/produce/batch",
                headers=headers,
                timeout=30,
                json={"producer": "orders-p", "messages": [{"message": f"m{i}"} for i in range(n)]},
            )
            assert r.status_code == 200, r.text
            receipts = r.json()["result"]["receipts"]
            produced.extend(rc["msgId"] for rc in receipts)
            return receipts

        gw.admin("POST", "/admin/trace-policies", mode="project", project="shop", level="debug")
        produce(20)
        primary.pause()
        paused = time.monotonic()
        receipts = produce(10)  # waits up to the send time-out, then spooled
        if {rc["status"] for rc in receipts} == {"stored"}:
            # A loaded machine (CI): the failure detector's probe met the hang and switched
            # before the produce came; stored on the backup, as the state says.
            assert failover_state(gw)["active"] == "b"
        else:
            assert {rc["status"] for rc in receipts} == {"spooled"}
        wait_until(lambda: failover_state(gw)["active"] == "b", 10, "the switch after SIGSTOP")
        hung_switch = time.monotonic() - paused
        state = failover_state(gw)
        assert "p is failed" in state["reason"]
        produce(20)
        # The path of a spooled message: accepted, spooled (why), stored on the backup when resent.
        spooled_id = receipts[0]["msgId"]

        def path_hops() -> list[tuple[str, str]]:
            paths = gw.admin("GET", f"/admin/traces?msgId={spooled_id}")["paths"]
            return [(h["hop"], h.get("detail", "")) for p in paths for h in p["hops"]]

        hops = wait_until(lambda: (h := path_hops()) and "stored" in [x[0] for x in h] and h, 10, "the trace")
        names = [h for h, _ in hops]
        assert names.index("accepted") < names.index("spooled") < names.index("stored"), hops
        assert "did not answer" in dict(hops)["spooled"] and "cluster b" in dict(hops)["stored"], hops
        primary.resume()
        wait_until(lambda: gw.admin("GET", "/admin/clusters/p")["state"] == "healthy", 15, "p healthy")
        wait_until(lambda: not failover_state(gw)["draining"], 15, "the drain of p")

        back = gw.admin("POST", "/admin/projects/shop/failback")
        assert back["active"] == "p" and back["reason"] == "manual fail-back"
        produce(20)
        primary.config_set("maxmemory", "1")  # every write now fails with OOM
        primary.config_set("maxmemory-policy", "noeviction")
        refused_at = time.monotonic()
        deadline = refused_at + 15
        while failover_state(gw)["active"] != "b":
            produce(5)  # each refused write counts towards the error rate (min samples 20)
            assert time.monotonic() < deadline, "no switch on a primary refusing writes"
        oom_switch = time.monotonic() - refused_at
        assert "p is failed" in failover_state(gw)["reason"]
        produce(20)
        primary.config_set("maxmemory", "0")
        wait_until(lambda: not failover_state(gw)["draining"], 20, "the drain of p")
        wait_until(lambda: gw.admin("GET", "/admin/spool")["pending"] == 0, 20, "the spool replayed")
        consumed = drain_all(gw.url, ctoken, set(produced), 60)
        print(
            f"\nSIGSTOP -> switch in {hung_switch:.2f}s; OOM -> switch in {oom_switch:.2f}s; "
            f"{len(produced)} produced, all consumed"
        )
        assert set(produced) <= consumed
    finally:
        gw.stop()


def consume_until(
    url: str, ctoken: str, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float
) -> list[dict[str, Any]]:
    """Pull and ack until `done(every message consumed so far, in order)`; those messages."""
    headers = {"Authorization": f"Bearer {ctoken}"}
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    answers: Counter[str] = Counter()  # what the pulls and acks answered: said if it times out
    with httpx.Client(base_url=url, timeout=30) as c:
        while not done(got):
            if time.monotonic() >= deadline:
                progress = c.get("/admin/consumers/orders-c/progress", headers=ADMIN).text
                raise AssertionError(
                    f"only {len(got)} consumed; answers {dict(answers)}; progress {progress}"
                )
            r = c.get(
                "/mq/message",
                params={"topic": "orders", "consumer": "orders-c", "max": 100, "wait": 1},
                headers=headers,
            )
            res = r.json()["result"]
            answers[f"pull {r.status_code} {res.get('status') or res.get('code')}"] += 1
            if r.status_code != 200 or res["status"] != "FOUND":
                continue
            ack = c.post(
                "/mq/ack", json={"consumer": "orders-c", "requestId": res["requestId"]}, headers=headers
            )
            answers[f"ack {ack.status_code}"] += 1
            if ack.status_code == 200:
                got += res["msgList"]
    return got


def drain_all(url: str, ctoken: str, wanted: set[str], timeout_s: float) -> set[str]:
    """Pull and ack until every id of `wanted` was consumed; the ids consumed."""
    found = consume_until(url, ctoken, lambda got: wanted <= {m["messageId"] for m in got}, timeout_s)
    return {m["messageId"] for m in found}


def test_automatic_failback_once_the_primary_is_healthy(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair
    gw = gateway(tmp_path / "gw" / "data", MQGATE_FAILOVER_FAILBACK_DWELL_S="1").start()
    try:
        ptoken, ctoken = project_on(gw, primary, backup)
        gw.admin("PUT", "/admin/projects/shop/clusters", primary="p", backup="b", autoFailback=True)
        headers = {"Authorization": f"Bearer {ptoken}"}
        produced: list[str] = []

        def produce(n: int) -> None:
            body = {"producer": "orders-p", "messages": [{"message": f"m{i}"} for i in range(n)]}
            r = httpx.post(gw.url + "/mq/produce/batch", headers=headers, timeout=30, json=body)
            assert r.status_code == 200, r.text
            produced.extend(rc["msgId"] for rc in r.json()["result"]["receipts"])

        produce(20)
        primary.kill9()
        wait_until(lambda: failover_state(gw)["active"] == "b", 10, "the switch to the backup")
        produce(20)
        primary.start()
        back = wait_until(
            lambda: (s := failover_state(gw))["active"] == "p" and s, 20, "the automatic fail-back"
        )
        assert back["epoch"] == 3 and "fail-back" in back["reason"], back
        produce(20)
        wait_until(lambda: not failover_state(gw)["draining"], 20, "the drain of b")
        assert set(produced) <= drain_all(gw.url, ctoken, set(produced), 30)
    finally:
        gw.stop()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_gateway_with_failover_rounds_stays_idle(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """The failover rounds run every failover_check_s (0.2 s here), not in a loop: a round that
    re-armed itself kept a gateway at a full core while nothing happened."""
    primary, backup = redis_pair
    gw = gateway(tmp_path / "gw" / "data").start()
    try:
        project_on(gw, primary, backup)
        assert gw.proc is not None
        time.sleep(1.0)  # start-up work done; measuring a quiet interval, not waiting for an event
        before, started = _cpu_s(gw.proc.pid), time.monotonic()
        time.sleep(3.0)
        share = (_cpu_s(gw.proc.pid) - before) / (time.monotonic() - started)
        print(f"\nidle gateway with a project on two clusters: {share:.1%} of a core")
        assert share < 0.25
    finally:
        gw.stop()
