"""Concurrent consumers against one real gateway process.

Cluster mode: several consumers share a consumer group; every message is delivered exactly once
(no lock ever expires in these runs), a queue is never leased to two consumers at once, and the
committed offsets end at the end of every queue. Broadcast mode: every clientId sees everything.

Timing note for the lock check. A batch's lock is certainly held from the moment its pull answer
is received until the moment its ack is *sent*: the server takes the lock before it answers the
pull and gives it up only after it has received the ack. The end of that window is the ack send
time, not the ack answer time, because the server unlocks (and may lease the queue to someone
else) before the answer to the ack is written: the answer waits for the fsync of the commit.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import Server

N_QUEUES = 8
PULL_MAX = 50
PULL_WAIT_S = 1
RUN_DEADLINE_S = 40.0  # a bound for every loop below; the runs take a few seconds
HTTP_TIMEOUT_S = 10.0
PROCESS_MAX_S = 0.02  # per batch, between receiving it and acking it


@dataclass
class Batch:
    consumer: str
    queue: int
    first: int  # offset of the first message
    end: int  # offset after the last message
    recv: float  # time.monotonic() when the pull answer was received
    ack_sent: float = 0.0  # when the request carrying the ack was sent
    ack_done: float = 0.0  # when its answer was received
    ack_via: str = ""  # "ack" (POST /mq/ack) or "requestId" (carried by the next pull)


@dataclass
class Run:
    """What the threads of one test share. Every mutation happens under `lock`."""

    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    produced: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # msgId -> (q, off, body)
    producer_done: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)


def _http(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=HTTP_TIMEOUT_S, headers={"Authorization": f"Bearer {token}"}
    )


def _producer(server: Server, run: Run, topic: str, ptoken: str, total: int, batch: int) -> None:
    """Produce `total` messages in batches, a little spread out so consumers run alongside."""
    try:
        with _http(server, ptoken) as http:
            sent = 0
            while sent < total and time.monotonic() < run.deadline:
                bodies = [f"{topic}-{sent + i}-{'é' * (i % 5)}{'x' * (i % 37)}" for i in range(batch)]
                r = http.post(
                    "/mq/produce/batch",
                    json={"producer": f"{topic}-p", "messages": [{"message": b} for b in bodies]},
                )
                if r.status_code != 200:
                    run.fail(f"produce answered {r.status_code}: {r.text}")
                    return
                receipts = r.json()["result"]["receipts"]
                assert len(receipts) == len(bodies)
                with run.lock:
                    for body, rc in zip(bodies, receipts, strict=True):
                        run.produced[rc["msgId"]] = (rc["queue"], rc["offset"], body)
                sent += batch
                time.sleep(0.01)
    except Exception as exc:  # reported by the test, not as a thread warning
        run.fail(f"producer: {exc!r}")
    finally:
        run.producer_done.set()


class PullingConsumer:
    """One consumer thread: pull (max=50, wait=1), ack every batch, either with POST /mq/ack or
    by carrying its requestId on the next pull (chosen at random)."""

    def __init__(
        self,
        server: Server,
        run: Run,
        topic: str,
        consumer: str,
        ctoken: str,
        total: int,
        *,
        name: str,
        client_id: str | None = None,
        seed: int = 0,
    ) -> None:
        self.server = server
        self.run_ = run
        self.topic = topic
        self.consumer = consumer
        self.ctoken = ctoken
        self.total = total
        self.name = name
        self.client_id = client_id
        self.rng = random.Random(seed)
        self.batches: list[Batch] = []
        self.delivered: list[tuple[str, int, int, str]] = []  # (msgId, queue, offset, body)
        self.shared_count: list[int] | None = None  # cluster mode: a counter shared by the group
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _delivered_so_far(self) -> int:
        if self.shared_count is None:
            return len(self.delivered)
        with self.run_.lock:
            return self.shared_count[0]

    def _done(self) -> bool:
        return self.run_.producer_done.is_set() and self._delivered_so_far() >= self.total

    def _main(self) -> None:
        try:
            with _http(self.server, self.ctoken) as http:
                self._loop(http)
        except Exception as exc:
            self.run_.fail(f"{self.name}: {exc!r}")

    def _ack(self, http: httpx.Client, pending: Batch, request_id: str) -> None:
        pending.ack_sent = time.monotonic()
        r = http.post("/mq/ack", json={"requestId": request_id})
        pending.ack_done = time.monotonic()
        pending.ack_via = "ack"
        if r.status_code != 200:
            self.run_.fail(f"{self.name}: ack of {pending} answered {r.status_code}: {r.text}")
        elif r.json()["result"] != {"queue": pending.queue, "committed": pending.end}:
            self.run_.fail(f"{self.name}: ack of {pending} answered {r.json()['result']}")

    def _loop(self, http: httpx.Client) -> None:
        pending: Batch | None = None
        request_id: str | None = None
        while time.monotonic() < self.run_.deadline:
            if self._done():
                break
            params: dict[str, Any] = {
                "topic": self.topic,
                "consumer": self.consumer,
                "max": PULL_MAX,
                "wait": PULL_WAIT_S,
            }
            if self.client_id is not None:
                params["clientId"] = self.client_id
            carried: Batch | None = None
            if pending is not None and request_id is not None:
                if self.rng.random() < 0.5:
                    self._ack(http, pending, request_id)
                else:
                    params["requestId"] = request_id
                    carried = pending
                pending = request_id = None
            sent = time.monotonic()
            r = http.get("/mq/message", params=params)
            received = time.monotonic()
            if r.status_code != 200:
                self.run_.fail(f"{self.name}: pull answered {r.status_code}: {r.text}")
                return
            result = r.json()["result"]
            if carried is not None:
                carried.ack_sent, carried.ack_done, carried.ack_via = sent, received, "requestId"
                if result.get("ack") != "ok":
                    self.run_.fail(f"{self.name}: ack carried by a pull of {carried}: {result.get('ack')}")
            if result["status"] == "NO_NEW_MSG":
                assert result["msgList"] == [] and result["requestId"] is None
                continue
            if result["status"] != "FOUND":
                self.run_.fail(f"{self.name}: pull status {result['status']}")
                return
            msgs = result["msgList"]
            queue = msgs[0]["queue"]
            first = msgs[0]["offset"]
            if [(m["queue"], m["offset"]) for m in msgs] != [(queue, first + i) for i in range(len(msgs))]:
                self.run_.fail(f"{self.name}: batch is not one queue's consecutive offsets: {msgs}")
            if len(msgs) > PULL_MAX:
                self.run_.fail(f"{self.name}: {len(msgs)} messages for max={PULL_MAX}")
            if any(m["reconsumeTimes"] != 0 for m in msgs):
                self.run_.fail(f"{self.name}: redelivery although no lock expired: {msgs[0]}")
            pending = Batch(self.name, queue, first, first + len(msgs), received)
            request_id = result["requestId"]
            self.batches.append(pending)
            self.delivered.extend((m["messageId"], m["queue"], m["offset"], m["message"]) for m in msgs)
            if self.shared_count is not None:
                with self.run_.lock:
                    self.shared_count[0] += len(msgs)
            # "Process" the batch while holding its lock, so lock windows of different
            # consumers really overlap in time (without this, the GIL serialises them).
            time.sleep(self.rng.uniform(0.0, PROCESS_MAX_S))
        if pending is not None and request_id is not None:
            self._ack(http, pending, request_id)
        if not self._done():
            self.run_.fail(f"{self.name}: deadline passed with {self._delivered_so_far()} delivered")


def _check_delivered_match_produced(run: Run, delivered: list[tuple[str, int, int, str]], who: str) -> None:
    counts = Counter(msg_id for msg_id, _, _, _ in delivered)
    dups = {m: n for m, n in counts.items() if n > 1}
    assert not dups, f"{who}: {len(dups)} messages delivered more than once, e.g. {list(dups.items())[:5]}"
    missing = set(run.produced) - set(counts)
    assert not missing, f"{who}: {len(missing)} produced messages never delivered, e.g. {sorted(missing)[:5]}"
    unknown = set(counts) - set(run.produced)
    assert not unknown, f"{who}: delivered messages nobody produced: {sorted(unknown)[:5]}"
    for msg_id, queue, offset, body in delivered:
        assert run.produced[msg_id] == (queue, offset, body), (msg_id, (queue, offset, body))


def _check_progress(progress: dict[str, Any], total: int, clients: list[str | None]) -> None:
    assert progress["lag"] == 0, progress
    assert progress["deadLettered"] == 0, progress
    by_client: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for q in progress["queues"]:
        if q["source"] == progress["topic"]:
            by_client[q["clientId"]].append(q)
        else:  # the consumer's retry queue and inbox: nothing was ever released or sent there
            assert q["max"] == 0, q
    assert sorted(by_client, key=str) == sorted(clients, key=str), progress
    for client, queues in by_client.items():
        assert [q["queue"] for q in queues] == list(range(N_QUEUES)), (client, queues)
        assert sum(q["max"] for q in queues) == total, (client, queues)
        for q in queues:
            assert q["min"] == 0 and q["committed"] == q["max"] and q["lag"] == 0, (client, q)
            assert not q["locked"], (client, q)
            assert q["deadLettered"] == 0, (client, q)


def _setup(server: Server, topic: str, **consumer_args: Any) -> tuple[str, str]:
    return server.setup_topic(topic, queues=N_QUEUES, consumer_args={"lockTimeoutS": 60, **consumer_args})


@pytest.mark.timeout(60)
def _finish(run: Run, producer: threading.Thread, threads: list[threading.Thread], total: int) -> None:
    """Wait for every thread within the run's deadline; none may hang or have failed."""
    for t in [producer, *threads]:
        t.join(RUN_DEADLINE_S + 5)
    assert not any(t.is_alive() for t in [producer, *threads]), "threads hung"
    assert not run.errors, run.errors[:10]
    assert len(run.produced) == total


def test_cluster_consumers_share_queues_without_overlap(server: Server) -> None:
    topic, total, n_consumers = "conc", 4000, 4
    ptoken, ctoken = _setup(server, topic)
    run = Run(deadline=time.monotonic() + RUN_DEADLINE_S)
    shared_count = [0]
    consumers = [
        PullingConsumer(server, run, topic, f"{topic}-c", ctoken, total, name=f"consumer-{i}", seed=i)
        for i in range(n_consumers)
    ]
    for c in consumers:
        c.shared_count = shared_count
        c.thread.start()
    producer = threading.Thread(target=_producer, args=(server, run, topic, ptoken, total, 100), daemon=True)
    producer.start()
    _finish(run, producer, [c.thread for c in consumers], total)

    # Every message exactly once, at the place its produce receipt named, with its body.
    delivered = [d for c in consumers for d in c.delivered]
    _check_delivered_match_produced(run, delivered, "cluster")
    assert all(c.batches for c in consumers), [len(c.batches) for c in consumers]

    # Per queue, batches follow each other in offset order and never overlap in time.
    batches = [b for c in consumers for b in c.batches]
    assert all(b.ack_via and b.ack_sent >= b.recv for b in batches), "a batch was never acked"
    assert {b.ack_via for b in batches} == {"ack", "requestId"}
    ends = {}
    by_queue: dict[int, list[Batch]] = defaultdict(list)
    for b in batches:
        by_queue[b.queue].append(b)
    for queue, qbatches in by_queue.items():
        by_offset = sorted(qbatches, key=lambda b: b.first)
        by_time = sorted(qbatches, key=lambda b: b.recv)
        assert by_offset == by_time, f"queue {queue}: batches delivered out of offset order"
        assert by_offset[0].first == 0
        for prev, nxt in itertools.pairwise(by_offset):
            assert nxt.first == prev.end, f"queue {queue}: gap or overlap between {prev} and {nxt}"
            # nxt was leased only after prev's ack reached the server.
            assert nxt.recv > prev.ack_sent, f"queue {queue}: {nxt} received while {prev} still locked"
        ends[queue] = by_offset[-1].end
    # Pairwise, to be explicit: no two lock windows of one queue intersect.
    for queue, qbatches in by_queue.items():
        windows = sorted((b.recv, b.ack_sent) for b in qbatches)
        for (_, a_end), (b_start, _) in itertools.pairwise(windows):
            assert b_start > a_end, f"queue {queue}: two lock windows overlap"

    # The consumers really did work side by side: some moment had batches of several queues out.
    events = sorted([(b.recv, 1) for b in batches] + [(b.ack_sent, -1) for b in batches])
    out = peak = 0
    for _, delta in events:
        out += delta
        peak = max(peak, out)
    assert peak >= 2, "the consumers never held two queues at once: the test did not exercise concurrency"

    progress = server.admin("GET", f"/admin/consumers/{topic}-c/progress")
    _check_progress(progress, total, [None])
    assert {q["queue"]: q["committed"] for q in progress["queues"] if q["source"] == topic} == {
        q: ends.get(q, 0) for q in range(N_QUEUES)
    }


@pytest.mark.timeout(60)
def test_broadcast_clients_each_see_everything_once(server: Server) -> None:
    topic, total, client_ids = "bcast", 1500, ["client-a", "client-b", "client-c"]
    ptoken, ctoken = _setup(server, topic, mode="broadcast")
    run = Run(deadline=time.monotonic() + RUN_DEADLINE_S)
    clients = [
        PullingConsumer(
            server, run, topic, f"{topic}-c", ctoken, total, name=cid, client_id=cid, seed=100 + i
        )
        for i, cid in enumerate(client_ids)
    ]
    # The clients start pulling while the producer is still producing.
    producer = threading.Thread(target=_producer, args=(server, run, topic, ptoken, total, 50), daemon=True)
    producer.start()
    for c in clients:
        c.thread.start()
    _finish(run, producer, [c.thread for c in clients], total)

    for c in clients:
        _check_delivered_match_produced(run, c.delivered, c.name)
        per_queue: dict[int, list[Batch]] = defaultdict(list)
        for b in c.batches:
            per_queue[b.queue].append(b)
        for queue, qbatches in per_queue.items():
            qbatches.sort(key=lambda b: b.first)
            assert qbatches[0].first == 0
            for prev, nxt in itertools.pairwise(qbatches):
                assert nxt.first == prev.end, f"{c.name} queue {queue}: {prev} then {nxt}"
                assert nxt.recv > prev.ack_sent, f"{c.name} queue {queue}: {nxt} while {prev} locked"

    progress = server.admin("GET", f"/admin/consumers/{topic}-c/progress")
    assert progress["mode"] == "broadcast"
    _check_progress(progress, total, list(client_ids))
