"""Load test of the scaled-out setup: 3 gateway processes on one Redis, 4 producers writing
200,000 messages, 8 cluster-mode consumers pulling through every gateway in turn.

Checked: every message is consumed at least once; per queue, no two lock windows ever
intersect; every duplicate delivery is explained by a lock that expired (some consumers stall
on purpose).

The client sees a lock only through its own clock, so each check uses the part of a lock's
life the client can be sure of: the lock was taken after the pull was sent and before its
answer came; an acknowledged batch was locked from receiving it until its ack was sent; a
batch whose ack was refused was locked from receiving it until at least `sent + lock timeout`
(nothing, if the answer itself came later: under load a lock can run out in transit)."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisServer, Server, wait_until

pytestmark = pytest.mark.slow

TOTAL = 200_000
PRODUCERS = 4
CONSUMERS = 8
QUEUES = 8
BATCH = 500
PULL_MAX = 200
LOCK_TIMEOUT_S = 2.0
STALLS_PER_CONSUMER = 1
RUN_BOUND_S = 150.0


@dataclass
class Delivery:
    consumer: int
    queue: tuple[str | None, int]  # (source, queue): the retry topic's queues have locks of their own
    first: int
    end: int
    sent: float  # the pull was sent: the lock was taken after this
    recv: float
    msg_ids: list[str] = field(repr=False)
    ack_sent: float = 0.0
    ack_ok: bool = False
    ack_recv: float = 0.0

    def sure_lock_window(self) -> tuple[float, float]:
        """A part of the time this batch's lock was certainly held (may be empty: start >= end)."""
        return self.recv, self.ack_sent if self.ack_ok else self.sent + LOCK_TIMEOUT_S


@dataclass
class Shared:
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    produced: dict[str, tuple[int, int]] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)
    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    producers_done: int = 0


def _producer(gws: list[Server], token: str, shared: Shared, n: int) -> None:
    clients = [httpx.Client(base_url=g.url, timeout=30) for g in gws]
    try:
        for b in range(TOTAL // PRODUCERS // BATCH):
            body = {"producer": "load-p", "messages": [{"message": f"p{n}-{b}-{i}"} for i in range(BATCH)]}
            r = clients[b % len(gws)].post(
                "/mq/produce/batch", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            if r.status_code != 200:
                shared.errors.append(f"produce {r.status_code} {r.text[:200]}")
                return
            with shared.lock:
                for rc in r.json()["result"]["receipts"]:
                    shared.produced[rc["msgId"]] = (rc["queue"], rc["offset"])
    finally:
        with shared.lock:
            shared.producers_done += 1
        for c in clients:
            c.close()


def _consumer(gws: list[Server], token: str, shared: Shared, n: int) -> None:
    rng = random.Random(n)
    clients = [httpx.Client(base_url=g.url, timeout=30) for g in gws]
    headers = {"Authorization": f"Bearer {token}"}
    stalls = STALLS_PER_CONSUMER
    pulls = itertools.count(n)
    try:
        while time.monotonic() < shared.deadline:
            with shared.lock:
                finished = shared.producers_done == PRODUCERS and len(shared.consumed) >= len(shared.produced)
            if finished:
                return
            k = next(pulls)
            sent = time.monotonic()
            r = clients[k % len(gws)].get(
                "/mq/message",
                params={"topic": "load", "consumer": "load-c", "max": PULL_MAX, "wait": 1},
                headers=headers,
            )
            recv = time.monotonic()
            if r.status_code != 200:
                shared.errors.append(f"pull {r.status_code} {r.text[:200]}")
                return
            result = r.json()["result"]
            if result["status"] != "FOUND":
                continue
            msgs = result["msgList"]
            where = (msgs[0].get("source"), msgs[0]["queue"])
            d = Delivery(
                n,
                where,
                msgs[0]["offset"],
                msgs[-1]["offset"] + 1,
                sent,
                recv,
                [m["messageId"] for m in msgs],
            )
            if stalls and k > 20 and rng.random() < 0.05:
                stalls -= 1
                time.sleep(LOCK_TIMEOUT_S + 0.5)  # a stuck consumer: its lock runs out
            d.ack_sent = time.monotonic()
            ack = clients[(k + 1) % len(gws)].post(
                "/mq/ack", json={"consumer": "load-c", "requestId": result["requestId"]}, headers=headers
            )
            d.ack_recv = time.monotonic()
            d.ack_ok = ack.status_code == 200
            if not d.ack_ok and ack.json()["result"]["code"] not in (
                "lock_expired",
                "lock_taken",
                "offset_moved",
            ):
                shared.errors.append(f"ack {ack.status_code} {ack.text[:200]}")
            with shared.lock:
                shared.deliveries.append(d)
                if d.ack_ok:
                    shared.consumed.update(d.msg_ids)
    finally:
        for c in clients:
            c.close()


@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_three_gateways_eight_consumers_200k_messages(own_redis: RedisServer, tmp_path: Path) -> None:
    data = tmp_path / "shared"  # one machine: the gateways share the SQLite registry
    gws = [
        Server(data / "data", admin_token="mqa_test_load", extra_args=["--store", own_redis.url])
        for _ in range(3)
    ]
    data.mkdir()
    for g in gws:
        g.start()
    try:
        ptoken, ctoken = gws[0].setup_topic(
            "load", queues=QUEUES, consumer_args={"lockTimeoutS": LOCK_TIMEOUT_S}
        )
        for g in gws[1:]:
            wait_until(
                lambda g=g: g.admin("GET", "/admin/consumers/load-c/progress")["topic"], 10, "registry"
            )
        shared = Shared(deadline=time.monotonic() + RUN_BOUND_S)
        started = time.monotonic()
        threads = [
            threading.Thread(target=_producer, args=(gws, ptoken, shared, n)) for n in range(PRODUCERS)
        ]
        threads += [
            threading.Thread(target=_consumer, args=(gws, ctoken, shared, n)) for n in range(CONSUMERS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_BOUND_S + 10)
        elapsed = time.monotonic() - started
        assert not shared.errors, shared.errors[:5]
        assert len(shared.produced) == TOTAL

        # Every message consumed at least once.
        missing = set(shared.produced) - shared.consumed
        assert not missing, f"{len(missing)} messages never consumed"

        # No queue held by two consumers at once: no two sure windows of a queue intersect.
        by_queue: dict[tuple[str | None, int], list[tuple[float, float, Delivery]]] = defaultdict(list)
        for d in shared.deliveries:
            start, end = d.sure_lock_window()
            if start < end:
                by_queue[d.queue].append((start, end, d))
        for queue, windows in by_queue.items():
            windows.sort(key=lambda w: w[0])
            held_until, holder = float("-inf"), None
            for start, end, d in windows:
                assert start > held_until, f"queue {queue}: {d} received while {holder} held the lock"
                if end > held_until:
                    held_until, holder = end, d

        # No message is delivered again once an ack of it has been answered: a pull sent after
        # that answer came back must not carry the message.
        acked_at: dict[str, float] = {}
        for d in shared.deliveries:
            if d.ack_ok:
                for m in d.msg_ids:
                    acked_at[m] = min(acked_at.get(m, d.ack_recv), d.ack_recv)
        for d in shared.deliveries:
            for m in d.msg_ids:
                if m in acked_at and d.sent > acked_at[m]:
                    raise AssertionError(f"{m} delivered again after an acknowledged delivery: {d}")

        # Duplicates come only from expired locks.
        times = Counter(m for d in shared.deliveries for m in d.msg_ids)
        duplicates = sum(n - 1 for n in times.values() if n > 1)
        expired = [d for d in shared.deliveries if not d.ack_ok]
        assert duplicates <= sum(len(d.msg_ids) for d in expired)
        print(
            f"200k load: {elapsed:.1f}s, {len(shared.deliveries)} deliveries, "
            f"{len(expired)} expired locks, {duplicates} duplicate deliveries"
        )
        progress = gws[2].admin("GET", "/admin/consumers/load-c/progress")
        assert progress["lag"] == 0
    finally:
        for g in gws:
            g.stop()
