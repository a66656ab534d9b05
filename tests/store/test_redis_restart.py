"""Redis killed (-9) and started again while producers and consumers keep going through two
gateways: meanwhile every call answers 503 with Retry-After (no hang, no crash), the gateways
recover by themselves, every acknowledged message is delivered and every committed offset is still there
(the test's Redis runs with appendonly yes, appendfsync always)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisServer, Server, wait_until

pytestmark = pytest.mark.slow

MAX_CALL_S = 8.0  # no call may hang: Redis calls time out after 5 s
# A batch whose ack was lost is handed to the scheduler when its lock (3 s) expires, its
# offsets committed, and comes back after its backoff (1 s, 2 s, 4 s for its first three
# failures): meanwhile the group's lag reads 0. Lag 0 counts as drained once it has held longer.
LAG_ZERO_HELD_S = 7.0
RUN_BOUND_S = 90.0  # producers stop by then at the latest
DRAIN_BOUND_S = 120.0  # consumers keep going this much longer, so a slow recovery can drain


@dataclass
class Shared:
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked_produce: set[str] = field(default_factory=set)
    consumed: set[str] = field(default_factory=set)
    unavailable: int = 0
    ok_after_restart: int = 0
    restarted: bool = False
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_consuming: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def saw(self, r: httpx.Response, elapsed: float) -> bool:
        """True for a 200; counts 503s; records anything else as an error."""
        with self.lock:
            if elapsed > MAX_CALL_S:
                self.errors.append(f"a call took {elapsed:.1f}s")
            if r.status_code == 200:
                if self.restarted:
                    self.ok_after_restart += 1
                return True
            if r.status_code == 503 and r.headers.get("retry-after", "").isdigit():
                self.unavailable += 1
            else:
                self.errors.append(f"{r.status_code} {r.headers.get('retry-after')} {r.text[:200]}")
            return False


def _produce(gws: list[Server], token: str, shared: Shared, worker: int) -> None:
    clients = [httpx.Client(base_url=g.url, timeout=30) for g in gws]
    i = 0
    while not shared.stop_producing.is_set() and time.monotonic() < shared.deadline:
        body = f"w{worker}-{i}"
        started = time.monotonic()
        try:
            r = clients[i % 2].post(
                "/mq/produce",
                json={"producer": "t-p", "message": body},
                headers={"Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            shared.errors.append(f"produce transport error {exc!r}")
            break
        if shared.saw(r, time.monotonic() - started):
            with shared.lock:
                shared.acked_produce.add(body)
        else:
            time.sleep(0.05)  # back off as Retry-After asks (shortened for the test)
        i += 1
    for c in clients:
        c.close()


def _consume(gws: list[Server], token: str, shared: Shared, worker: int) -> None:
    clients = [httpx.Client(base_url=g.url, timeout=30) for g in gws]
    headers = {"Authorization": f"Bearer {token}"}
    i = worker
    while not shared.stop_consuming.is_set() and time.monotonic() < shared.deadline + DRAIN_BOUND_S:
        i += 1
        started = time.monotonic()
        try:
            r = clients[i % 2].get(
                "/mq/message", params={"topic": "t", "consumer": "t-c", "max": 50, "wait": 1}, headers=headers
            )
        except httpx.HTTPError as exc:
            shared.errors.append(f"pull transport error {exc!r}")
            break
        if not shared.saw(r, time.monotonic() - started):
            time.sleep(0.05)
            continue
        result = r.json()["result"]
        if result["status"] != "FOUND":
            continue
        # Counted when delivered: an ack Redis applied just before its kill answers 503, and a
        # retry may find the queue moved on already, so "ack answered 200" would miss messages
        # that were delivered. An ack that was not applied lets the lock expire and the batch
        # comes again; the final lag of 0 shows nothing was skipped.
        with shared.lock:
            shared.consumed.update(m["message"] for m in result["msgList"])
        ack = clients[(i + 1) % 2].post(
            "/mq/ack", json={"consumer": "t-c", "requestId": result["requestId"]}, headers=headers
        )
        if ack.status_code not in (200, 409, 503):
            shared.errors.append(f"ack {ack.status_code} {ack.text[:200]}")
    for c in clients:
        c.close()


def _lag_zero_held(gw: Server, seconds: float) -> Callable[[], bool]:
    """A predicate: the group's lag has read 0 at every look for `seconds`."""
    since: float | None = None

    def held() -> bool:
        nonlocal since
        r = httpx.get(
            gw.url + "/admin/consumers/t-c/progress",
            headers={"Authorization": f"Bearer {gw.admin_token}"},
            timeout=30,
        )
        # A pooled connection Redis closed at its restart answers one call 503 (retry later,
        # redisio.connect), the next goes on a new one: a look that tells nothing.
        if r.status_code == 503 and r.headers.get("retry-after", "").isdigit():
            since = None
            return False
        assert r.status_code == 200, r.text
        if r.json()["result"]["lag"] != 0:
            since = None
            return False
        since = time.monotonic() if since is None else since
        return time.monotonic() - since >= seconds

    return held


def test_redis_restart_under_load(own_redis: RedisServer, pg_url: str, tmp_path: Path) -> None:
    gws = [
        Server(
            tmp_path / f"gw{n}" / "data",
            admin_token="mqa_test_restart",
            extra_args=["--store", own_redis.url, "--registry", pg_url],
        )
        for n in range(2)
    ]
    for g in gws:
        g.data_dir.parent.mkdir(parents=True)
        g.start()
    try:
        ptoken, ctoken = gws[0].setup_topic("t", queues=4, consumer_args={"lockTimeoutS": 3})
        wait_until(lambda: gws[1].admin("GET", "/admin/consumers/t-c/progress")["topic"] == "t", 10, "gw1")
        shared = Shared(deadline=time.monotonic() + RUN_BOUND_S)
        threads = [threading.Thread(target=_produce, args=(gws, ptoken, shared, n)) for n in range(2)]
        threads += [threading.Thread(target=_consume, args=(gws, ctoken, shared, n)) for n in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: len(shared.consumed) >= 200, 30, "traffic before the kill")
        before = gws[0].admin("GET", "/admin/consumers/t-c/progress")
        own_redis.kill9()
        wait_until(lambda: shared.unavailable >= 20, 30, "503s while Redis is down")
        with shared.lock:
            shared.restarted = True
        own_redis.start()
        wait_until(lambda: shared.ok_after_restart >= 200, 60, "the gateways to recover by themselves")
        shared.stop_producing.set()
        for t in threads[:2]:  # no produce lands after the consumers stop
            t.join(MAX_CALL_S + 30)
        acked = set(shared.acked_produce)
        try:
            wait_until(lambda: acked <= shared.consumed, 60, "every acknowledged message to be consumed")
        except AssertionError as exc:
            missing = sorted(acked - shared.consumed)
            progress = gws[1].admin("GET", "/admin/consumers/t-c/progress")
            raise AssertionError(
                f"{exc}: {len(missing)} of {len(acked)} missing, e.g. {missing[:5]}; "
                f"consumers alive: {[t.is_alive() for t in threads[2:]]}; errors {shared.errors[:3]}; "
                f"progress {progress}"
            ) from None
        # Delivered is not yet acked: the consumers go on until the group's lag has been 0 for
        # longer than a lost ack's lock and backoff (its batch comes again meanwhile).
        wait_until(_lag_zero_held(gws[1], LAG_ZERO_HELD_S), 90, f"lag 0 for {LAG_ZERO_HELD_S:g} s", 0.2)
        shared.stop_consuming.set()
        for t in threads:
            t.join(30)
        assert not shared.errors, shared.errors[:5]
        after = gws[1].admin("GET", "/admin/consumers/t-c/progress")
        for old, new in zip(before["queues"], after["queues"], strict=True):
            assert new["committed"] >= old["committed"]
        assert after["lag"] == 0
        print(f"acked produces {len(acked)}, 503 answers {shared.unavailable}")
    finally:
        for g in gws:
            g.stop()
