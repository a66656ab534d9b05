"""Crash safety: `kill -9` under load, restart on the same data directory, nothing acknowledged
is lost, committed offsets never go backwards, and a torn tail is cut off at start-up.

Producer threads record every message whose produce got a 200 (msgId, queue, offset, body); a
consumer thread records the committed offset of every ack that got a 200. The server is
killed at random moments while they run and restarted at once. After each restart, before the
consumer resumes, the consumer's committed offsets must be at least what was acked before the
kill and every queue must hold at least what producers were told is stored. At the end a fresh
consumer reads everything back and every acknowledged message must be there, byte for byte.
"""

from __future__ import annotations

import itertools
import random
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server

pytestmark = pytest.mark.slow

TOPIC = "crash"
N_QUEUES = 8
KILLS = 10
PRODUCERS = 3
TEST_BUDGET_S = 110.0  # every loop below stops by this deadline
HTTP_TIMEOUT_S = 5.0
# Small segments, so the load rolls segments often and kills also land around a roll.
SERVER_ENV = {"MQGATE_SEGMENT_BYTES": str(64 * 1024)}

# Letters of 1 to 4 UTF-8 bytes, quotes and escapes included.
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:-_!?\"'\\/{}[]\n\t"
    "éèüößçñøåæ€£¥§©®°±µ¶ΩπλЖжШщ中文日本語한국어ไทยالعربيةעברית😀🚀🎉👍🏽🧪\u200b\u00a0"
)


def random_body(rng: random.Random) -> str:
    size = rng.choice([0, 1, rng.randint(2, 40), rng.randint(40, 400), rng.randint(400, 4000)])
    if rng.random() < 0.01:
        size = rng.randint(20_000, 60_000)
    return "".join(rng.choices(ALPHABET, k=size))


@dataclass
class Load:
    """What the client threads and the test share; every mutation under `lock`."""

    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    # Held by the consumer for one pull+ack round; the test takes it to pause the consumer.
    consumer_gate: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0  # bumped once the killed process is gone
    produced: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)  # (q, off) -> (id, body)
    acked: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # queue -> highest committed
    delivered: list[tuple[int, int, str, str]] = field(default_factory=list)  # (q, off, id, body)
    connection_errors: int = 0
    produce_calls: int = 0
    acks_ok: int = 0
    acks_refused_after_crash: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, what: str) -> None:
        with self.lock:
            self.problems.append(what)

    def outage(self) -> None:
        with self.lock:
            self.connection_errors += 1
        time.sleep(0.05)


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=HTTP_TIMEOUT_S, headers={"Authorization": f"Bearer {token}"})


def producer_thread(url: str, token: str, load: Load, seed: int) -> None:
    rng = random.Random(seed)
    try:
        with _client(url, token) as http:
            while not load.stop.is_set() and time.monotonic() < load.deadline:
                n = 1 if rng.random() < 0.5 else rng.randint(2, 8)
                bodies = [random_body(rng) for _ in range(n)]
                try:
                    if n == 1:
                        r = http.post("/mq/produce", json={"producer": f"{TOPIC}-p", "message": bodies[0]})
                    else:
                        r = http.post(
                            "/mq/produce/batch",
                            json={"producer": f"{TOPIC}-p", "messages": [{"message": b} for b in bodies]},
                        )
                except httpx.HTTPError:
                    load.outage()
                    continue
                with load.lock:
                    load.produce_calls += 1
                if r.status_code != 200:
                    load.problem(f"produce answered {r.status_code}: {r.text[:300]}")
                    time.sleep(0.05)
                    continue
                result = r.json()["result"]
                receipts = [result] if n == 1 else result["receipts"]
                with load.lock:
                    for body, rc in zip(bodies, receipts, strict=True):
                        key = (rc["queue"], rc["offset"])
                        if key in load.produced:
                            load.problems.append(f"offset {key} acknowledged twice: {rc['msgId']}")
                        load.produced[key] = (rc["msgId"], body)
                time.sleep(rng.uniform(0, 0.004))
    except Exception as exc:
        load.problem(f"producer {seed}: {exc!r}")


@dataclass
class Pending:
    """A pulled batch whose ack has not been answered yet."""

    request_id: str
    queue: int
    end: int  # the committed offset its ack must report
    generation: int  # server generation when it was pulled


def consumer_thread(url: str, token: str, load: Load, seed: int) -> None:
    rng = random.Random(seed)
    pending: list[Pending] = []  # at most one; an ack cut off by a kill is retried after the restart
    try:
        with _client(url, token) as http:
            while not load.stop.is_set() and time.monotonic() < load.deadline:
                with load.consumer_gate:
                    ok = _consume_once(http, load, rng, pending)
                if not ok:
                    load.outage()
    except Exception as exc:
        load.problem(f"consumer: {exc!r}")


def _ack(http: httpx.Client, load: Load, p: Pending) -> bool:
    """Send the ack of `p`; False on a connection error (then `p` stays pending)."""
    try:
        r = http.post("/mq/ack", json={"requestId": p.request_id})
    except httpx.HTTPError:
        return False
    with load.lock:
        if r.status_code == 200:
            result = r.json()["result"]
            if result != {"queue": p.queue, "committed": p.end}:
                load.problems.append(f"ack answered {result} for {p}")
            load.acked[p.queue] = max(load.acked[p.queue], result["committed"])
            load.acks_ok += 1
        elif r.status_code == 409 and load.generation != p.generation:
            load.acks_refused_after_crash += 1  # the lock died with the old process
        else:
            load.problems.append(f"ack answered {r.status_code} without a crash: {r.text[:300]}")
    return True


def _consume_once(http: httpx.Client, load: Load, rng: random.Random, pending: list[Pending]) -> bool:
    """Finish a pending ack, then one pull and, if it found messages, its ack.
    False on a connection error."""
    if pending:
        if not _ack(http, load, pending[0]):
            return False
        pending.clear()
    with load.lock:
        generation = load.generation
    params = {"topic": TOPIC, "consumer": f"{TOPIC}-c", "max": rng.randint(1, 64), "wait": 0.3}
    try:
        r = http.get("/mq/message", params=params)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        load.problem(f"pull answered {r.status_code}: {r.text[:300]}")
        return True
    result = r.json()["result"]
    if result["status"] != "FOUND":
        return True
    msgs = result["msgList"]
    with load.lock:
        load.delivered.extend((m["queue"], m["offset"], m["messageId"], m["message"]) for m in msgs)
    pending.append(Pending(result["requestId"], msgs[0]["queue"], msgs[-1]["offset"] + 1, generation))
    time.sleep(rng.uniform(0, 0.02))  # processing: a kill may fall between pull and ack
    if not _ack(http, load, pending[0]):
        return False
    pending.clear()
    return True


def read_all(
    server: Server, consumer: str, token: str, deadline: float
) -> dict[tuple[int, int], tuple[str, str]]:
    """Everything a consumer gets from where it stands now to the end, acking as it goes."""
    out: dict[tuple[int, int], tuple[str, str]] = {}
    with _client(server.url, token) as http:
        while time.monotonic() < deadline:
            r = http.get("/mq/message", params={"topic": TOPIC, "consumer": consumer, "max": 1024})
            assert r.status_code == 200, r.text
            result = r.json()["result"]
            if result["status"] == "NO_NEW_MSG":
                return out
            assert result["status"] == "FOUND", result
            for m in result["msgList"]:
                key = (m["queue"], m["offset"])
                assert key not in out, f"read {key} twice"
                out[key] = (m["messageId"], m["message"])
            r = http.post("/mq/ack", json={"requestId": result["requestId"]})
            assert r.status_code == 200, r.text
    raise AssertionError("reading back did not finish before the deadline")


def new_reader(server: Server, name: str, start: str = "earliest") -> str:
    token: str = server.admin("POST", "/admin/consumers", name=name, topic=TOPIC, start=start)["token"]
    return token


def check_readback(
    server: Server, name: str, produced: dict[tuple[int, int], tuple[str, str]], deadline: float
) -> dict[tuple[int, int], tuple[str, str]]:
    """A new consumer from the earliest offset sees every acknowledged message, exact, and
    each queue as one run of offsets from 0 without holes."""
    got = read_all(server, name, new_reader(server, name), deadline)
    missing = [k for k in produced if k not in got]
    assert not missing, f"{len(missing)} acknowledged messages are gone, e.g. {sorted(missing)[:10]}"
    wrong = [k for k, v in produced.items() if got[k] != v]
    assert not wrong, (
        f"{len(wrong)} messages differ from what was acknowledged, e.g. {wrong[0]}: "
        f"stored {got[wrong[0]]!r:.200} != produced {produced[wrong[0]]!r:.200}"
    )
    progress = server.admin("GET", f"/admin/consumers/{name}/progress")
    assert progress["lag"] == 0, progress
    for q in progress["queues"]:
        if q["source"] != TOPIC:
            continue  # the consumer's retry queue and inbox are empty here
        offsets = sorted(o for (queue, o) in got if queue == q["queue"])
        assert offsets == list(range(q["min"], q["max"])), f"queue {q['queue']}: holes in the offsets"
    return got


def committed_by_queue(server: Server) -> dict[int, tuple[int, int]]:
    """queue -> (committed, max) of the load's consumer."""
    progress = server.admin("GET", f"/admin/consumers/{TOPIC}-c/progress")
    return {q["queue"]: (q["committed"], q["max"]) for q in progress["queues"] if q["source"] == TOPIC}


@dataclass
class Gateway:
    """The current server process; restarts keep data directory, port and admin token."""

    server: Server
    restarts: int = 0
    restart_s: list[float] = field(default_factory=list)

    def restart(self) -> Server:
        started = time.monotonic()
        old = self.server
        self.server = Server(old.data_dir, port=old.port, admin_token=old.admin_token, env=old.env).start()
        self.restart_s.append(time.monotonic() - started)
        self.restarts += 1
        return self.server


def server_errors(server: Server) -> str:
    """The first error the server logged (all incarnations log to one file), for failure messages."""
    path = server.data_dir.parent / f"server-{server.port}.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    first = min((i for i in (text.find("unexpected error"), text.find("Traceback")) if i >= 0), default=-1)
    return text[first : first + 6000] if first >= 0 else "(no error in the server log)"


def kill_and_check(gw: Gateway, load: Load, kill: int) -> dict[str, Any]:
    """kill -9 and restart; before the consumer resumes, check nothing acknowledged went back."""
    gw.server.kill9()
    # Bumped only once the old process is gone: a pull that reads the new generation can only
    # have been answered by the next process, so its lock cannot have died with this one.
    with load.lock:
        load.generation += 1
    # Pause the consumer: an ack in flight has failed or been recorded once we hold the gate.
    with load.consumer_gate:
        with load.lock:
            acked_before = dict(load.acked)
            stored_before: dict[int, int] = defaultdict(int)
            for q, o in load.produced:
                stored_before[q] = max(stored_before[q], o + 1)
            n_produced = len(load.produced)
        gw.restart()
        after = committed_by_queue(gw.server)
    for q in range(N_QUEUES):
        committed, end = after[q]
        assert committed >= acked_before.get(q, 0), (
            f"kill {kill}: queue {q} committed offset went back from "
            f"{acked_before.get(q, 0)} (acked) to {committed}"
        )
        assert end >= stored_before[q], (
            f"kill {kill}: queue {q} ends at {end}, but offset {stored_before[q] - 1} "
            "was acknowledged to a producer"
        )
    return {"produced": n_produced, "acked": acked_before, "after": after}


def append_garbage(queue_dir: Path, garbage: bytes) -> tuple[Path, int]:
    """Append bytes to the newest segment of a queue; return the file and its intact size."""
    newest = max(queue_dir.glob("*.log"), key=lambda p: int(p.stem))
    intact = newest.stat().st_size
    with open(newest, "ab") as fh:
        fh.write(garbage)
    assert newest.stat().st_size == intact + len(garbage)
    return newest, intact


def queue_log_bytes(queue_dir: Path) -> int:
    return sum(p.stat().st_size for p in queue_dir.glob("*.log"))


def produce_and_read_new(
    server: Server, ptoken: str, name: str, queue: int, deadline: float
) -> dict[tuple[int, int], tuple[str, str]]:
    """New produces still work, on every queue, and read back exactly (via a consumer from latest)."""
    ctoken = new_reader(server, name, start="latest")
    rng = random.Random(queue)
    bodies = [random_body(rng) + "-after-recovery" for _ in range(2 * N_QUEUES)]
    with _client(server.url, ptoken) as http:
        r = http.post(
            "/mq/produce/batch", json={"producer": f"{TOPIC}-p", "messages": [{"message": b} for b in bodies]}
        )
    assert r.status_code == 200, r.text
    fresh = {
        (rc["queue"], rc["offset"]): (rc["msgId"], body)
        for body, rc in zip(bodies, r.json()["result"]["receipts"], strict=True)
    }
    assert any(q == queue for q, _ in fresh), "no new message went to the repaired queue"
    assert read_all(server, name, ctoken, deadline) == fresh
    return fresh


@pytest.mark.timeout(120)
def test_kill9_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    t0 = time.monotonic()
    server = Server(tmp_path / "data", env=dict(SERVER_ENV)).start()
    deadline = t0 + TEST_BUDGET_S
    rng = random.Random(20240601)
    ptoken, ctoken = server.setup_topic(TOPIC, queues=N_QUEUES, consumer_args={"lockTimeoutS": 60})
    gw = Gateway(server)
    load = Load(deadline=deadline - 25)  # leave time for the checks after the load
    threads = [
        threading.Thread(target=producer_thread, args=(server.url, ptoken, load, i), daemon=True)
        for i in range(PRODUCERS)
    ]
    threads.append(threading.Thread(target=consumer_thread, args=(server.url, ctoken, load, 99), daemon=True))
    restart_checks: list[dict[str, Any]] = []
    try:
        try:
            for t in threads:
                t.start()
            for kill in range(KILLS):
                time.sleep(rng.uniform(0.3, 1.0))
                assert time.monotonic() < load.deadline, f"only {kill} kills before the deadline"
                restart_checks.append(kill_and_check(gw, load, kill + 1))
            time.sleep(0.5)
        finally:
            load.stop.set()
            for t in threads:
                t.join(15)
        srv = gw.server
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        assert not load.problems, (load.problems[:10], server_errors(srv))
        assert gw.restarts == KILLS and len(restart_checks) == KILLS
        assert load.connection_errors > 0, "the clients never saw an outage: the kills did not hit the load"
        assert len(load.produced) > 1000 and load.acks_ok > 50, (len(load.produced), load.acks_ok)
        assert all(any(q == queue for q, _ in load.produced) for queue in range(N_QUEUES))
        ids = [msg_id for msg_id, _ in load.produced.values()]
        assert len(set(ids)) == len(ids), "a msgId was given to two messages (across restarts)"
        # Growth between kills: the load ran during every interval, not just at the start.
        counts = [c["produced"] for c in restart_checks]
        assert all(b > a for a, b in itertools.pairwise(counts)), counts

        # What the load's consumer got matches what was produced at that (queue, offset).
        for q, o, msg_id, body in load.delivered:
            if (q, o) in load.produced:
                assert load.produced[(q, o)] == (msg_id, body), f"delivered {q}:{o} differs from its produce"

        # Final committed offsets are still at least every acked one.
        final = committed_by_queue(srv)
        for q, acked in load.acked.items():
            assert final[q][0] >= acked, (q, final[q], acked)

        topic_dir = srv.data_dir / "topics" / TOPIC
        assert all(len(list((topic_dir / str(q)).glob("*.log"))) > 1 for q in range(N_QUEUES)), "no rolls"

        # Every acknowledged message reads back byte for byte from a fresh consumer.
        produced = dict(load.produced)
        got = check_readback(srv, "reader-1", produced, deadline)

        # --- a torn tail: stop the server, append half a record, restart --------------------
        srv.stop()
        queue_a, queue_b = 3, 5
        log_a, intact_a = append_garbage(
            topic_dir / str(queue_a),
            struct.pack("<II", 1000, 0x12345678) + b"0123456789",  # claims 1000 bytes, has 10
        )
        srv = gw.restart()
        assert log_a.stat().st_size == intact_a, "the torn record is still there after the restart"
        bytes_a = queue_log_bytes(topic_dir / str(queue_a))
        got_after = check_readback(srv, "reader-2", produced, deadline)
        assert got_after == got, "the restart changed stored messages"
        fresh = produce_and_read_new(srv, ptoken, "tail-1", queue_a, deadline)
        assert min(o for q, o in fresh if q == queue_a) == max(o for q, o in got if q == queue_a) + 1
        produced.update(fresh)

        # --- the same after kill -9: a whole record with a bad CRC, then a torn one -----------
        srv.kill9()
        payload = b"not what the CRC says"
        log_b, intact_b = append_garbage(
            topic_dir / str(queue_b),
            struct.pack("<II", len(payload), 0) + payload + struct.pack("<II", 1000, 0) + b"0123456789",
        )
        srv = gw.restart()
        assert log_b.stat().st_size == intact_b, "the corrupt tail is still there after the restart"
        # The fresh messages were stored after the repair: in log_a, or in a segment rolled after
        # it when log_a had reached MQGATE_SEGMENT_BYTES.
        assert queue_log_bytes(topic_dir / str(queue_a)) > bytes_a
        check_readback(srv, "reader-3", produced, deadline)
        produce_and_read_new(srv, ptoken, "tail-2", queue_b, deadline)
    finally:
        gw.server.stop()
    total = time.monotonic() - t0
    print(
        f"\ncrash test: {len(load.produced)} messages acknowledged in {load.produce_calls} produce calls, "
        f"{load.acks_ok} acks ok, {load.acks_refused_after_crash} acks refused after a crash, "
        f"{load.connection_errors} connection errors, restarts {[round(s, 2) for s in gw.restart_s]} s, "
        f"total {total:.1f} s"
    )
    assert total < 120
