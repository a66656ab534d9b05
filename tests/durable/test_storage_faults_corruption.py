"""Corruption is loud but costs only itself: flipped bytes in a message log, the offsets journal
and the schedule log, a lost registry, and the frame scan that recovery is built on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from mqgate.durable.framing import HEADER_BYTES, frame, scan
from mqgate.durable.group_commit import GroupCommitter
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.interface import Destination
from tests.conftest import Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

# --- the frame scan -----------------------------------------------------------------------


def records(*payloads: bytes) -> bytes:
    return b"".join(frame(p) for p in payloads)


@pytest.mark.parametrize("where", ["payload", "length", "crc"])
def test_scan_skips_one_damaged_record_and_keeps_the_ones_after_it(where: str) -> None:
    data = bytearray(records(b"one", b"two" * 50, b"three", b"four"))
    second = len(frame(b"one"))
    data[second + {"payload": HEADER_BYTES + 7, "length": 2, "crc": 5}[where]] ^= 0x5A
    got = list(scan(bytes(data)))
    assert [p for _, _, p in got] == [b"one", None, b"three", b"four"]
    assert got[1][:2] == (second, second + len(frame(b"two" * 50)))


def test_scan_stops_at_a_torn_or_damaged_tail_and_at_zeros() -> None:
    intact = records(b"a", b"b")
    assert [p for _, _, p in scan(intact + frame(b"c")[:-1])] == [b"a", b"b"]
    assert [p for _, _, p in scan(intact + b"\0" * 64)] == [b"a", b"b"]
    last = bytearray(intact + frame(b"c"))
    last[-1] ^= 1  # the last record, damaged: nothing intact follows, so it is a tail
    assert [p for _, _, p in scan(bytes(last))] == [b"a", b"b"]


# --- message log --------------------------------------------------------------------------


def admin_get(srv: Server, path: str, **params: Any) -> httpx.Response:
    return httpx.get(
        srv.url + path, params=params, headers={"Authorization": f"Bearer {srv.admin_token}"}, timeout=30
    )


def flip_inside_record(log: Path, index: int) -> None:
    """Flip a byte inside the payload of the record at `index` (counting from 0)."""
    data = bytearray(log.read_bytes())
    pos = 0
    for _ in range(index):
        pos += HEADER_BYTES + int.from_bytes(data[pos : pos + 4], "little")
    data[pos + HEADER_BYTES + 10] ^= 0x20
    log.write_bytes(bytes(data))


@pytest.mark.parametrize("checkpoint", ["kept", "removed"])
def test_a_flipped_byte_mid_log_costs_one_record_and_is_reported(tmp_path: Path, checkpoint: str) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        ptoken, ctoken = srv.setup_topic("flip", queues=1)
        batch = [{"message": f"m{i}"} for i in range(201)]
        r = httpx.post(
            srv.url + "/mq/produce/batch",
            json={"producer": "flip-p", "messages": batch},
            headers={"Authorization": f"Bearer {ptoken}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        srv.stop()
        qdir = tmp_path / "data" / "topics" / "flip" / "0"
        flip_inside_record(qdir / "00000000000000000000.log", 100)
        if checkpoint == "removed":
            (qdir / "checkpoint.json").unlink()
        srv.start()

        before = admin_get(srv, "/mq/read", topic="flip", queue=0, offset=0, max=100)
        assert before.status_code == 200
        assert [m["message"] for m in before.json()["result"]["msgList"]] == [f"m{i}" for i in range(100)]
        around = admin_get(srv, "/mq/read", topic="flip", queue=0, offset=0, max=300)
        assert around.status_code == 200, around.text
        got = around.json()["result"]["msgList"]
        expected = [i for i in range(201) if i != 100]
        assert [m["offset"] for m in got] == expected  # the others keep their offsets
        assert [m["message"] for m in got] == [f"m{i}" for i in expected]
        bounds = admin_get(srv, "/mq/bounds", topic="flip").json()["result"]["queues"][0]
        assert bounds["max"] == 201
        # A consumer gets every good record, the damaged one skipped.
        pulled: list[str] = []
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {ctoken}"}, timeout=30) as c:
            for _ in range(20):
                body = c.get("/mq/message", params={"topic": "flip", "consumer": "flip-c", "max": 64})
                assert body.status_code == 200, body.text
                result = body.json()["result"]
                if result["status"] != "FOUND":
                    break
                pulled += [m["message"] for m in result["msgList"]]
                assert c.post("/mq/ack", json={"requestId": result["requestId"]}).status_code == 200
        assert pulled == [f"m{i}" for i in expected]

        health = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]
        (fault,) = [f for f in health["faults"] if f["kind"] == "corrupt_record_skipped"]
        assert fault["component"] == "message_log" and fault["count"] == 1
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert (
            'mqgate_storage_faults_total{component="message_log",kind="corrupt_record_skipped"} 1.0'
            in metrics
        )
    finally:
        srv.stop()


# --- offsets journal ----------------------------------------------------------------------


def test_a_damaged_journal_record_costs_that_consumer_only(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        ptoken, _ = srv.setup_topic("jt", queues=1)
        for i in range(10):
            srv.admin("POST", "/admin/consumers", name=f"c{i}", topic="jt")
        for i in range(30):
            r = httpx.post(
                srv.url + "/mq/produce",
                json={"producer": "jt-p", "message": f"m{i}"},
                headers={"Authorization": f"Bearer {ptoken}"},
                timeout=30,
            )
            assert r.status_code == 200
        for i in range(10):  # consumer c<i> commits up to offset i + 10
            srv.admin("POST", f"/admin/consumers/c{i}/reset", to="offset", queue=0, offset=i + 10)
        srv.stop()  # the journal is compacted: one table record per consumer

        journal = tmp_path / "data" / "offsets" / "journal.log"
        data = bytearray(journal.read_bytes())
        victim = None
        for pos, end, payload in scan(bytes(data)):
            assert payload is not None
            if msgspec.msgpack.decode(payload)[1] == "c3":
                victim = pos
                data[end - 2] ^= 0x01
                data[end - 3] ^= 0x40
        assert victim is not None
        journal.write_bytes(bytes(data))

        srv.start()
        for i in range(10):
            if i == 3:
                continue
            progress = srv.admin("GET", f"/admin/consumers/c{i}/progress")
            assert progress["queues"][0]["committed"] == i + 10, f"c{i} lost its offsets"
        health = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]
        (fault,) = [f for f in health["faults"] if f["component"] == "offsets_journal"]
        assert fault["kind"] == "record_dropped" and fault["count"] == 1
    finally:
        srv.stop()


# --- schedule log -------------------------------------------------------------------------


def test_a_damaged_schedule_log_record_costs_that_message_only(tmp_path: Path) -> None:
    async def go() -> tuple[list[bytes], int]:
        committer = GroupCommitter(None)
        committer.start()
        sched = EmbeddedScheduler(tmp_path / "s", committer)
        await sched.open()
        for i in range(5):
            await sched.hold([(b"held %d" % i, [Destination("t:x", 10**12, 0, 0)])])
        await sched.close()
        await committer.stop()
        log = tmp_path / "s" / "schedule.log"
        data = bytearray(log.read_bytes())
        pos = data.index(b"held 2")
        data[pos + 1] ^= 0x01
        log.write_bytes(bytes(data))

        committer = GroupCommitter(None)
        committer.start()
        sched = EmbeddedScheduler(tmp_path / "s", committer)
        await sched.open()
        kept = sorted(rec.payload for rec in sched._held.values())
        dropped = sched.health.count("schedule_log", "record_dropped")
        await sched.close()
        await committer.stop()
        return kept, dropped

    kept, dropped = asyncio.run(go())
    assert kept == [b"held 0", b"held 1", b"held 3", b"held 4"]
    assert dropped == 1


# --- registry -----------------------------------------------------------------------------


def test_an_empty_registry_beside_existing_data_refuses_to_start(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    ptoken, _ = srv.setup_topic("kept", queues=1)
    r = httpx.post(
        srv.url + "/mq/produce",
        json={"producer": "kept-p", "message": "precious"},
        headers={"Authorization": f"Bearer {ptoken}"},
        timeout=30,
    )
    assert r.status_code == 200
    srv.stop()
    (tmp_path / "data" / "registry.db").write_bytes(b"")  # truncated to 0
    try:
        with pytest.raises(AssertionError, match="holds no topics"):
            srv.start(timeout_s=20)
    finally:
        srv.stop()
    assert srv.proc is not None and srv.proc.returncode not in (0, None)
    # The data is untouched.
    assert (tmp_path / "data" / "topics" / "kept" / "0" / "00000000000000000000.log").stat().st_size > 0
