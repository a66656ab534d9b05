"""A full disk, for real: a gateway on a 30 MiB tmpfs (mounted by the test, as root).

Nothing acknowledged is lost and nothing is silent: a produce that does not fit gets 507 with
Retry-After and takes no offset; an ack that cannot be journaled gets 507 and is not applied;
the gateway starts on a full disk, resumes by itself once space is freed, keeps every offset
it handed out across kill -9, refuses new messages below its free-space floor, and a
checkpoint that fails is reported while the next SIGTERM still stops it cleanly.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server, wait_until

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

DISK_MB = 30
MIB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("SKIPPED LOUDLY: mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def journal_bytes(data_dir: Path) -> int:
    """What the message store's round journal holds (0: settled)."""
    return sum(p.stat().st_size for p in (data_dir / "journal").glob("*.jnl"))


def fill(path: Path) -> int:
    """Write `path` until the disk refuses even one more byte; return its size."""
    size = 0
    with open(path, "ab", buffering=0) as fh:
        chunk = MIB
        while chunk >= 1:
            try:
                size += fh.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                chunk //= 2
    return size


def gateway(disk: Path, floor: int = 0, **env: str) -> Server:
    # The data directory is the tmpfs itself; the gateway's log goes next to it, not on it.
    return Server(disk, env={"MQGATE_DISK_FREE_FLOOR_BYTES": str(floor), **env})


# One client for the module: a new one per call costs tens of ms (it builds a TLS context).
HTTP = httpx.Client(timeout=30)


@pytest.fixture(autouse=True, scope="module")
def _close_http() -> Iterator[None]:
    yield
    HTTP.close()


def produce(srv: Server, token: str, topic: str, body: str) -> httpx.Response:
    return HTTP.post(
        srv.url + "/mq/produce",
        json={"producer": f"{topic}-p", "message": body},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def read_queue(srv: Server, topic: str, queue: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        r = HTTP.get(
            srv.url + "/mq/read",
            params={"topic": topic, "queue": queue, "offset": len(out), "max": 100},
            headers={"Authorization": f"Bearer {srv.admin_token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        got = r.json()["result"]["msgList"]
        if not got:
            return out
        out += got


def health(srv: Server) -> dict[str, Any]:
    r = HTTP.get(srv.url + "/healthz", timeout=10)
    assert r.status_code == 200
    result: dict[str, Any] = r.json()["result"]
    return result


def fault_count(srv: Server, component: str, kind: str) -> int:
    return sum(f["count"] for f in health(srv)["faults"] if (f["component"], f["kind"]) == (component, kind))


def assert_stored_exactly(srv: Server, topic: str, receipts: dict[tuple[int, int], str]) -> None:
    """Every queue holds offsets 0..n-1 and each acknowledged one holds its own body."""
    for queue in (0, 1):
        records = read_queue(srv, topic, queue)
        assert [m["offset"] for m in records] == list(range(len(records)))
        acked = sorted(o for q, o in receipts if q == queue)
        assert acked == list(range(len(acked))), "an acknowledged offset is missing or phantom"
        assert len(records) == len(acked), "records nobody was told about"
        for m in records:
            assert m["message"] == receipts[(queue, m["offset"])]


def test_a_full_disk_refuses_with_507_loses_nothing_and_resumes_across_kill_9(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 4 * MIB)  # freed later, as an operator frees space
    srv = gateway(small_disk).start()
    try:
        ptoken, _ = srv.setup_topic("full", queues=2)
        rng = random.Random(7)
        receipts: dict[tuple[int, int], str] = {}
        refused: list[httpx.Response] = []
        for i in range(2000):
            body = f"{i}:" + "x" * rng.randint(10_000, 100_000)
            r = produce(srv, ptoken, "full", body)
            assert r.status_code in (200, 507), r.text
            if r.status_code == 200:
                receipt = r.json()["result"]
                receipts[(receipt["queue"], receipt["offset"])] = body
            else:
                refused.append(r)
                if len(refused) >= 20:
                    break
        assert len(refused) == 20 and len(receipts) > 50
        for r in refused:
            assert r.json()["result"]["code"] == "disk_full"
            assert "disk full" in r.json()["message"] and int(r.headers["retry-after"]) > 0
        assert fault_count(srv, "message_log", "disk_full") >= 20
        assert_stored_exactly(srv, "full", receipts)

        srv.kill9()  # on the full disk, and start again on it
        srv.start()
        assert_stored_exactly(srv, "full", receipts)

        ballast.unlink()
        for i in range(20):
            body = f"after:{i}"
            r = produce(srv, ptoken, "full", body)
            assert r.status_code == 200, r.text
            receipt = r.json()["result"]
            receipts[(receipt["queue"], receipt["offset"])] = body
        assert_stored_exactly(srv, "full", receipts)  # the offsets go on where they stopped

        srv.kill9()
        srv.start()
        assert_stored_exactly(srv, "full", receipts)
    finally:
        srv.stop()


def test_an_ack_on_a_full_disk_is_journaled_or_refused_never_lost(small_disk: Path) -> None:
    srv = gateway(small_disk).start()
    try:
        ptoken, ctoken = srv.setup_topic("acks", queues=1)
        for i in range(400):
            assert produce(srv, ptoken, "acks", f"m{i}").status_code == 200
        # The round journal's settle deletes its copy of the messages: space freed after the fill.
        wait_until(lambda: journal_bytes(small_disk) == 0, 15, "the round journal settled")
        fill(small_disk / "ballast")
        http = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {ctoken}"}, timeout=30)
        acked = 0
        refused = None
        for _ in range(400):
            pulled = http.get("/mq/message", params={"topic": "acks", "consumer": "acks-c", "max": 1})
            assert pulled.status_code == 200, pulled.text
            body = pulled.json()["result"]
            assert body["msgList"][0]["offset"] == acked
            ack = http.post("/mq/ack", json={"requestId": body["requestId"]})
            assert ack.status_code in (200, 507), ack.text
            if ack.status_code == 507:
                refused = ack
                break
            acked += 1
        assert refused is not None, "the journal never filled the disk"
        assert refused.json()["result"]["code"] == "disk_full" and acked > 0
        assert fault_count(srv, "offsets_journal", "disk_full") == 1
        http.close()

        srv.kill9()
        srv.start()
        progress = srv.admin("GET", "/admin/consumers/acks-c/progress")
        assert progress["queues"][0]["committed"] == acked  # every 200 survived, the 507 did not apply
    finally:
        srv.stop()


def test_below_the_free_space_floor_new_messages_are_refused_and_resume_by_themselves(
    small_disk: Path,
) -> None:
    floor = 12 * MIB
    srv = gateway(small_disk, floor=floor).start()
    try:
        ptoken, ctoken = srv.setup_topic("floor", queues=2)
        ballast = small_disk / "ballast"
        ballast.write_bytes(b"\0" * (DISK_MB * MIB - floor - 2 * MIB))
        assert health(srv)["status"] == "ok"
        receipts = 0
        while True:
            r = produce(srv, ptoken, "floor", "y" * 200_000)
            if r.status_code == 507:
                break
            assert r.status_code == 200, r.text
            receipts += 1
            assert receipts < 100
        assert "disk_free_floor_bytes" in r.json()["message"] and r.headers["retry-after"]
        free = shutil.disk_usage(small_disk).free
        assert free >= floor - 400_000  # refused before the disk is full, with room to spare
        state = health(srv)
        assert state["status"] == "degraded" and "disk_below_floor" in state["degraded"]
        # Consumers go on below the floor: acks are small and keep the system moving.
        pulled = HTTP.get(
            srv.url + "/mq/message",
            params={"topic": "floor", "consumer": "floor-c", "max": 1},
            headers={"Authorization": f"Bearer {ctoken}"},
            timeout=30,
        ).json()["result"]
        ack = HTTP.post(
            srv.url + "/mq/ack",
            json={"requestId": pulled["requestId"]},
            headers={"Authorization": f"Bearer {ctoken}"},
            timeout=30,
        )
        assert ack.status_code == 200, ack.text

        ballast.unlink()
        wait_until(lambda: produce(srv, ptoken, "floor", "back").status_code == 200, 5, "writes to resume")
        assert health(srv)["status"] == "ok"
    finally:
        srv.stop()


def test_a_failing_checkpoint_is_reported_and_sigterm_still_stops_cleanly(small_disk: Path) -> None:
    srv = gateway(small_disk, MQGATE_CHECKPOINT_INTERVAL_S="1").start()
    try:
        ptoken, _ = srv.setup_topic("ckpt", queues=2)
        sent = []
        for i in range(10):
            assert produce(srv, ptoken, "ckpt", f"before {i}").status_code == 200
            sent.append(f"before {i}")
        wait_until(lambda: (small_disk / "topics/ckpt/0/checkpoint.json").exists(), 10, "a first checkpoint")
        # A full disk may not stop a checkpoint: the round journal's settle frees its copy of the
        # messages just before. A directory where its temporary file goes does.
        for q in (0, 1):
            (small_disk / f"topics/ckpt/{q}/checkpoint.tmp").mkdir()
        for i in range(10):  # news for the checkpoint
            assert produce(srv, ptoken, "ckpt", f"news {i}").status_code == 200
            sent.append(f"news {i}")
        fill(small_disk / "ballast")
        while True:  # fill the last pages too, with messages: the checkpoint now has news
            r = produce(srv, ptoken, "ckpt", "z" * 3000)
            if r.status_code != 200:
                assert r.status_code == 507, r.text
                break
            sent.append("z" * 3000)
        wait_until(
            lambda: fault_count(srv, "message_log", "checkpoint_failed") > 0, 10, "a checkpoint to fail"
        )
        assert health(srv)["status"] in ("ok", "degraded")  # still serving
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(15) in (0, -signal.SIGTERM), srv.log_tail()  # uvicorn re-raises it
        log = srv.log_tail()
        assert "checkpoint_failed" in log and "Application shutdown complete" in log
        assert "Traceback" not in log, log

        srv.start()
        stored = [m["message"] for q in (0, 1) for m in read_queue(srv, "ckpt", q)]
        assert sorted(stored) == sorted(sent)
    finally:
        srv.stop()


HELD_MS = 20_000  # the messages' delay: they come due after the restart


def test_a_delayed_produce_on_a_full_disk_is_refused_or_delivered_after_kill_9(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    srv = gateway(small_disk).start()
    try:
        ptoken, _ = srv.setup_topic("later", queues=2)
        ballast.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 256 * 1024))
        started = time.monotonic()
        held: list[str] = []
        refused = 0
        for i in range(2000):  # held messages go to the schedule log until it fills too
            body = f"held {i} " + "h" * 2000
            r = HTTP.post(
                srv.url + "/mq/produce",
                json={"producer": "later-p", "message": body, "delayMs": HELD_MS},
                headers={"Authorization": f"Bearer {ptoken}"},
                timeout=30,
            )
            assert r.status_code in (200, 507), r.text
            if r.status_code == 507:
                refused += 1
                if refused == 5:
                    break
            else:
                held.append(body)
        assert refused == 5 and len(held) > 20
        assert fault_count(srv, "schedule_log", "disk_full") == 5
        # Due after the restart below, on the full disk (a loaded CI machine took over 4 s here
        # with 8 s to spare; the restart takes about 1).
        assert time.monotonic() - started < HELD_MS / 1000 - 5, "too slow: they come due before the restart"

        srv.kill9()
        srv.start()  # on the full disk
        ballast.unlink()

        def delivered() -> list[str]:
            return sorted(m["message"] for q in (0, 1) for m in read_queue(srv, "later", q))

        wait_until(
            lambda: len(delivered()) >= len(held), HELD_MS / 1000 + 20, "the held messages to be delivered"
        )
        assert delivered() == sorted(held)
    finally:
        srv.stop()


BATCH_CHILD = r"""
import asyncio, json, resource, signal, sys
from pathlib import Path
from mqgate.errors import MqgateError
from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import TopicConfig

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing


def msg(i, size):
    return StoredMessage(f"id{i}", 1000 + i, "p", "x" * size, [], [], {})


async def main():
    root = Path(sys.argv[1])
    store = EmbeddedStore(root)
    await store.open()
    await store.create_topic(TopicConfig("t", 2, 7 * 24 * 3600 * 1000))
    await store.append_many("t", {0: [msg(0, 10)], 1: [msg(1, 10)]})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # queue 1's write crosses it
    try:
        await store.append_many("t", {0: [msg(2, 100)], 1: [msg(3, 8000)]})
        error = None
    except MqgateError as exc:
        error = [exc.http_status, exc.message]
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    after = await store.append_many("t", {0: [msg(4, 10)], 1: [msg(5, 10)]})
    got = {q: [m.msg_id for _, m in await store.read("t", q, 0, 10)] for q in (0, 1)}
    await store.close()
    print(json.dumps({"error": error, "after": after, "got": got}))


asyncio.run(main())
"""


def test_a_batch_whose_write_fails_on_one_queue_leaves_nothing_on_the_others(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BATCH_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["error"] == [503, "write failed: File too large"]
    assert got["after"] == {"0": 1, "1": 1}  # queue 0's part of the failed batch took no offset
    assert got["got"] == {"0": ["id0", "id4"], "1": ["id1", "id5"]}


ROUND_CHILD = BATCH_CHILD.replace(
    """    try:
        await store.append_many("t", {0: [msg(2, 100)], 1: [msg(3, 8000)]})
        error = None
    except MqgateError as exc:
        error = [exc.http_status, exc.message]""",
    """    outcomes = await asyncio.gather(
        store.append_many("t", {0: [msg(2, 100)]}), store.append_many("t", {1: [msg(3, 8000)]}),
        return_exceptions=True,
    )
    error = [[o.http_status, o.message] if isinstance(o, MqgateError) else o for o in outcomes]""",
)


def test_a_round_whose_write_fails_refuses_every_writer_of_it_and_takes_no_offset(tmp_path: Path) -> None:
    """With fsync=always the records of a group-commit round are written by the round, one
    write per queue file: if one fails, every record of the round is taken back and every
    writer of it refused (queue 0's writer too, though its own write would have fitted), and
    the next writes take the same offsets: nothing is acknowledged that is not stored, nothing
    stored that was refused, no offset skipped."""
    assert ROUND_CHILD != BATCH_CHILD
    done = subprocess.run(
        [sys.executable, "-c", ROUND_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["error"] == [[503, "write failed: File too large"]] * 2
    assert got["after"] == {"0": 1, "1": 1}
    assert got["got"] == {"0": ["id0", "id4"], "1": ["id1", "id5"]}
