"""`mqgate check [--repair]`: every file of a stopped gateway's data directory, verified and
reported; what is safe repaired; a running gateway's directory refused."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from mqgate.durable.framing import HEADER_BYTES
from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import TopicConfig
from tests.conftest import MQGATE, Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def check(data_dir: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [MQGATE, "check", "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout + done.stderr


def by_path(data_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    rc, out = check(data_dir, "--json", *args)
    return rc, {r["path"]: r for r in json.loads(out)}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A stopped gateway's data directory: a topic of 2 queues with 40 messages, a consumer
    that acked some, a held (delayed) message."""
    srv = Server(tmp_path / "data").start()
    try:
        ptoken, ctoken = srv.setup_topic("chk", queues=2)
        auth = {"Authorization": f"Bearer {ptoken}"}
        for i in range(40):
            r = httpx.post(
                srv.url + "/mq/produce", json={"producer": "chk-p", "message": f"m{i}"}, headers=auth
            )
            assert r.status_code == 200
        r = httpx.post(
            srv.url + "/mq/produce",
            json={"producer": "chk-p", "message": "later", "delayMs": 3_600_000},
            headers=auth,
        )
        assert r.status_code == 200, r.text
        cauth = {"Authorization": f"Bearer {ctoken}"}
        pulled = httpx.get(
            srv.url + "/mq/message", params={"topic": "chk", "consumer": "chk-c", "max": 5}, headers=cauth
        ).json()["result"]
        assert httpx.post(
            srv.url + "/mq/ack", json={"requestId": pulled["requestId"]}, headers=cauth
        ).is_success
    finally:
        srv.stop()
    return tmp_path / "data"


SEGMENT = "topics/chk/0/00000000000000000000.log"


def test_a_healthy_directory_checks_clean(data_dir: Path) -> None:
    rc, reports = by_path(data_dir)
    assert rc == 0
    assert all(r["ok"] for r in reports.values()), reports
    assert reports[SEGMENT]["facts"] == ["20 records"]
    assert "offsets/journal.log" in reports and "scheduler/schedule.log" in reports
    assert reports["registry.db"]["facts"][0].endswith("topics")
    rc, text = check(data_dir)
    assert rc == 0 and f"OK   {SEGMENT}: 20 records" in text


def test_damage_is_reported_per_file_and_repair_does_what_is_safe(data_dir: Path) -> None:
    seg = data_dir / SEGMENT
    data = bytearray(seg.read_bytes())
    data[HEADER_BYTES + 5] ^= 0x10  # inside the first record
    seg.write_bytes(bytes(data) + b"\x07\x00\x00\x00torn")  # and a torn tail
    journal = data_dir / "offsets" / "journal.log"
    journal.write_bytes(journal.read_bytes() + b"\x30\x00\x00\x00half")
    (data_dir / "topics/chk/1/checkpoint.json").write_text("{not json")
    index = data_dir / "topics/chk/1/00000000000000000000.idx"
    index.write_bytes(index.read_bytes()[:-3])

    rc, reports = by_path(data_dir)
    assert rc == 1
    assert "1 damaged records kept as gaps" in reports[SEGMENT]["kept"][0]
    assert reports[SEGMENT]["problems"] == [f"torn tail of 8 bytes after byte {len(data)}"]
    assert "torn tail of 8 bytes" in reports["offsets/journal.log"]["problems"][0]
    assert "unreadable" in reports["topics/chk/1/checkpoint.json"]["problems"][0]
    assert reports["topics/chk/1/00000000000000000000.idx"]["problems"] == ["does not match its log"]

    rc, reports = by_path(data_dir, "--repair")
    assert rc == 1  # the damaged record stays: it keeps its offset
    assert reports[SEGMENT]["repaired"] and not reports[SEGMENT]["problems"]
    assert reports["offsets/journal.log"]["repaired"]
    assert seg.stat().st_size == len(data)

    rc, reports = by_path(data_dir)
    assert [path for path, r in reports.items() if not r["ok"]] == [SEGMENT]
    assert not reports[SEGMENT]["problems"]

    srv = Server(data_dir).start()  # and the gateway serves the rest
    try:
        r = httpx.get(
            srv.url + "/mq/read",
            params={"topic": "chk", "queue": 0, "offset": 0, "max": 100},
            headers={"Authorization": f"Bearer {srv.admin_token}"},
        )
        assert [m["offset"] for m in r.json()["result"]["msgList"]] == list(range(1, 20))
    finally:
        srv.stop()


def test_an_empty_registry_is_reported(data_dir: Path) -> None:
    (data_dir / "registry.db").write_bytes(b"")
    rc, reports = by_path(data_dir)
    assert rc == 1
    assert "empty while the data directory holds 4 topics" in reports["registry.db"]["problems"][0]


def test_a_running_gateway_directory_is_refused(data_dir: Path) -> None:
    srv = Server(data_dir).start()
    try:
        rc, text = check(data_dir)
        assert rc == 2 and "a gateway is running" in text
    finally:
        srv.stop()


def test_a_round_journal_left_by_a_crash_is_reported_and_kept_even_by_repair(tmp_path: Path) -> None:
    async def crash() -> None:
        store = EmbeddedStore(tmp_path / "live", journal_settle_interval_s=3600)
        await store.open()
        await store.create_topic(TopicConfig("j", 2, 3_600_000))
        for i in range(3):
            await store.append_many(
                "j",
                {
                    0: [StoredMessage(f"id{i}", 1, "p", "m", [], [], {})],
                    1: [StoredMessage(f"i{i}", 1, "p", "m", [], [], {})],
                },
            )
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")  # what kill -9 leaves
        await store.close()

    asyncio.run(crash())
    crashed = tmp_path / "crashed"
    [journal] = sorted((crashed / "journal").glob("*.jnl"))
    rel = str(journal.relative_to(crashed))
    rc, reports = by_path(crashed)
    assert rc == 0 and reports[rel]["facts"] == ["6 entries, applied by the next start"], reports[rel]
    with open(journal, "ab") as fh:
        fh.write(b"\x50\x00\x00\x00torn")
    rc, reports = by_path(crashed, "--repair")
    assert reports[rel]["kept"] == ["torn tail of 8 bytes (a round that answered nobody)"]
    assert journal.stat().st_size > 8 and reports[rel]["repaired"] == []
