"""Damage never moves an offset (SPEC S6): bytes overwritten across several records in the
middle of a segment, and index entries overwritten, then the gateway restarted, with or without
`mqgate check --repair` first. Every receipt's offset reads its own message or is a gap where
the damaged bytes were; the queue's end does not go back; the next produce gets a new offset."""

from __future__ import annotations

import json
import random
import subprocess
from array import array
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MQGATE, Server

QUEUES = 2
PER_QUEUE = 200
SEGMENT = "00000000000000000000"


def produce(srv: Server, ptoken: str, bodies: list[str]) -> list[dict[str, Any]]:
    receipts: list[dict[str, Any]] = []
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {ptoken}"}, timeout=30) as c:
        for i in range(0, len(bodies), 50):
            r = c.post(
                "/mq/produce/batch",
                json={"producer": "dmg-p", "messages": [{"message": b} for b in bodies[i : i + 50]]},
            )
            assert r.status_code == 200, r.text
            receipts += r.json()["result"]["receipts"]
    return receipts


def read_all(srv: Server, queue: int) -> dict[int, str]:
    r = httpx.get(
        srv.url + "/mq/read",
        params={"topic": "dmg", "queue": queue, "offset": 0, "max": 10_000},
        headers={"Authorization": f"Bearer {srv.admin_token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return {m["offset"]: m["messageId"] for m in r.json()["result"]["msgList"]}


def spans(qdir: Path) -> list[tuple[int, int]]:
    """Each record's byte span in the segment, from the intact index written at shutdown."""
    positions = array("Q")
    positions.frombytes((qdir / f"{SEGMENT}.idx").read_bytes())
    size = (qdir / f"{SEGMENT}.log").stat().st_size
    assert len(positions) == PER_QUEUE
    return [(a, b) for a, b in zip(positions, [*positions[1:], size], strict=True)]


def overwrite(path: Path, start: int, length: int, seed: int) -> None:
    data = bytearray(path.read_bytes())
    data[start : start + length] = random.Random(seed).randbytes(length)
    path.write_bytes(bytes(data))


def damage(data_dir: Path) -> dict[int, set[int]]:
    """Overwrite ~1.5 KiB across several records of queue 0's segment and one record of queue
    1's, and eight index entries of each; return the offsets whose bytes were hit, per queue."""
    hit: dict[int, set[int]] = {}
    for q, (first, length) in enumerate([(60, 1500), (150, 40)]):
        qdir = data_dir / "topics" / "dmg" / str(q)
        records = spans(qdir)
        start = records[first][0] + 17  # from inside a record's payload
        overwrite(qdir / f"{SEGMENT}.log", start, length, seed=q)
        hit[q] = {o for o, (a, b) in enumerate(records) if a < start + length and b > start}
        assert len(hit[q]) == 1 if q else len(hit[q]) >= 4, hit[q]
        overwrite(qdir / f"{SEGMENT}.idx", 8 * 100 + 3, 8 * 8, seed=10 + q)
    return hit


@pytest.mark.parametrize("then", ["repair", "start", "start-unverified"])
def test_damage_keeps_every_offset(tmp_path: Path, then: str) -> None:
    data_dir = tmp_path / "data"
    srv = Server(data_dir).start()
    try:
        ptoken, _ = srv.setup_topic("dmg", queues=QUEUES)
        sizes = random.Random(7)
        bodies = [f"message {i} " + "x" * sizes.randrange(60, 200) for i in range(QUEUES * PER_QUEUE)]
        receipts = produce(srv, ptoken, bodies)
        assert sorted({(r["queue"], r["offset"]) for r in receipts}) == [
            (q, o) for q in range(QUEUES) for o in range(PER_QUEUE)
        ]
        srv.stop()

        hit = damage(data_dir)
        if then == "repair":
            done = subprocess.run(
                [MQGATE, "check", "--repair", "--json", "--data-dir", str(data_dir)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 1, done.stdout + done.stderr  # the damaged records stay, as gaps
            reports = {r["path"]: r for r in json.loads(done.stdout)}
        elif then == "start-unverified":
            for q in range(QUEUES):
                (data_dir / "topics" / "dmg" / str(q) / "checkpoint.json").unlink()

        srv.start()
        gaps: dict[int, set[int]] = {}
        for q in range(QUEUES):
            got = read_all(srv, q)
            mine = {r["offset"]: r["msgId"] for r in receipts if r["queue"] == q}
            wrong = {o: (got[o], mine[o]) for o in got if got[o] != mine.get(o)}
            some = list(wrong.items())[:3]
            assert not wrong, f"queue {q}: {len(wrong)} offsets read another message: {some}"
            gaps[q] = set(mine) - set(got)
        assert gaps == hit  # exactly the damaged records are missing: nothing else
        if then == "repair":
            for q in range(QUEUES):  # and the check named them
                kept = reports[f"topics/dmg/{q}/{SEGMENT}.log"]["kept"]
                named = f"offsets {min(hit[q])}-{max(hit[q])}" if len(hit[q]) > 1 else f"offset {min(hit[q])}"
                assert f"{len(hit[q])} damaged records kept as gaps" in kept[0] and named in kept[0], kept
        bounds = srv.admin("GET", "/mq/bounds?topic=dmg")["queues"]
        assert [b["max"] for b in bounds] == [PER_QUEUE] * QUEUES
        health = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]
        skipped = [f for f in health["faults"] if f["kind"] == "corrupt_record_skipped"]
        assert skipped and sum(f["count"] for f in skipped) == sum(map(len, hit.values())), health

        more = produce(srv, ptoken, [f"after {i}" for i in range(10)])
        assert all(r["offset"] >= PER_QUEUE for r in more), more
        for q in range(QUEUES):
            got = read_all(srv, q)
            assert {o: got[o] for o in got if o >= PER_QUEUE} == {
                r["offset"]: r["msgId"] for r in more if r["queue"] == q
            }
    finally:
        srv.stop()
