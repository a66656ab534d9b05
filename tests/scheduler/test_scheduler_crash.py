"""Crash safety of the embedded scheduler (SPEC S6): `kill -9` a process that holds and settles
messages in a loop, recover, and check that nothing acknowledged is lost or resurrected.

The child prints `H seq:count:payload-hex ...` after each hold returned (durable), `s seq:idx ...`
before each settle and `S seq:idx ...` after it returned. It compacts online far more often
than the default (so kills also land in compactions). After each kill this process recovers
the directory itself and checks:
- every acknowledged hold is there with its payload, minus the destinations whose settle was
  acknowledged (those are gone) and possibly minus ones whose settle was in flight;
- a message whose destinations were all settled is gone;
- the log was rewritten as the compacted live set (one mark record, then one add per message);
- sequence numbers never repeat across restarts.
Some rounds also append a torn record to the log first: recovery must cut it off.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from mqgate.durable.framing import frame, iter_payloads
from mqgate.durable.group_commit import GroupCommitter
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.backends.embedded.log import Add, Mark
from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.slow

KILLS = 6
TEST_BUDGET_S = 18.0

CHILD = r"""
import asyncio, random, sys
from pathlib import Path
from mqgate.durable.group_commit import GroupCommitter
from mqgate.scheduler.backends.embedded import scheduler as embedded
from mqgate.scheduler.interface import Destination

embedded.COMPACT_MIN_RECORDS = 300  # compact often: kills must also hit compactions

async def main(directory, seed):
    rng = random.Random(seed)
    committer = GroupCommitter(None)
    committer.start()
    s = embedded.EmbeddedScheduler(Path(directory), committer)
    await s.open()
    print("ready", flush=True)
    live = []  # (seq, index) held by this run and not settled yet
    while True:
        items = []
        for _ in range(rng.randint(1, 8)):
            size = rng.choice([0, 3, 40, rng.randint(100, 3000)])
            dests = [Destination(f"t{j}", rng.randint(0, 10**6), 0, rng.randint(0, 9))
                     for j in range(rng.randint(1, 3))]
            items.append((rng.randbytes(size), dests))
        seqs = await s.hold(items)
        print("H " + " ".join(f"{q}:{len(d)}:{p.hex()}" for q, (p, d) in zip(seqs, items)), flush=True)
        live += [(q, j) for q, (_, d) in zip(seqs, items) for j in range(len(d))]
        rng.shuffle(live)
        cut = rng.randint(0, len(live) * 3 // 4)
        pairs, live = live[:cut], live[cut:]
        if pairs:
            text = " ".join(f"{q}:{j}" for q, j in pairs)
            print("s " + text, flush=True)
            await s.settle(pairs)
            print("S " + text, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@dataclass
class Ledger:
    """What the child acknowledged, over every run."""

    holds: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # seq -> (count, payload)
    settled: set[tuple[int, int]] = field(default_factory=set)  # acknowledged
    tried: set[tuple[int, int]] = field(default_factory=set)  # issued, maybe not acknowledged
    run_seqs: list[list[int]] = field(default_factory=list)

    def read(self, lines: list[str]) -> None:
        seqs: list[int] = []
        for line in lines:
            if not line.endswith("\n"):
                continue  # cut by the kill: not acknowledged
            kind, _, rest = line.strip().partition(" ")
            if kind == "H":
                for word in rest.split():
                    seq, count, payload = word.split(":")
                    assert int(seq) not in self.holds, f"seq {seq} handed out twice"
                    self.holds[int(seq)] = (int(count), bytes.fromhex(payload))
                    seqs.append(int(seq))
            elif kind in ("s", "S"):
                pairs = {(int(q), int(j)) for q, j in (w.split(":") for w in rest.split())}
                (self.tried if kind == "s" else self.settled).update(pairs)
        self.run_seqs.append(seqs)


def run_child(directory: Path, seed: int, run_for_s: float) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(seed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: lines or proc.poll() is not None, 15, "the child to open the scheduler")
        assert lines and lines[0] == "ready\n", proc.stderr.read() if proc.stderr else ""
        time.sleep(run_for_s)  # the kill lands at a random moment of the loop
        assert proc.poll() is None, f"child died: {proc.stderr.read() if proc.stderr else ''}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        reader.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
        proc.stdout.close()
    return lines[1:]


def recover_and_check(directory: Path, ledger: Ledger) -> int:
    """Recover in this process, check the ledger against what is held; return the highest seq."""

    async def go() -> dict[int, Add]:
        committer = GroupCommitter(None)
        committer.start()
        s = EmbeddedScheduler(directory, committer)
        await s.open()
        held = dict(s._held)
        stats = await s.stats()
        assert stats.log_records == len(held) + 1
        assert stats.log_bytes == (directory / "schedule.log").stat().st_size
        await s.close()
        await committer.stop()
        return held

    held = asyncio.run(go())
    touched = ledger.settled | ledger.tried
    for seq, (count, payload) in ledger.holds.items():
        rec = held.get(seq)
        if all((seq, j) in ledger.settled for j in range(count)):
            assert rec is None, f"message {seq} was settled but came back"
            continue
        if rec is None:  # fine only if its last destinations' settle was in flight
            lost = [j for j in range(count) if (seq, j) not in touched]
            assert not lost, f"acknowledged message {seq} lost"
            continue
        assert rec.payload == payload
        assert len(rec.dests) == count
        for j, d in enumerate(rec.dests):
            if (seq, j) in ledger.settled:
                assert d is None, f"settled destination {seq}:{j} came back"
            elif (seq, j) not in ledger.tried:
                assert d is not None, f"destination {seq}:{j} lost"
    # The log on disk is exactly the compacted live set.
    data = (directory / "schedule.log").read_bytes()
    decode = msgspec.msgpack.Decoder(Mark | Add).decode
    records = [decode(p) for _, p in iter_payloads(data)]
    assert isinstance(records[0], Mark)
    assert {r.seq for r in records[1:] if isinstance(r, Add)} == set(held)
    assert len(records) == len(held) + 1
    return max([*held, *ledger.holds, 0])


def test_kill9_loses_nothing_acknowledged_and_recovers_compacted(tmp_path: Path) -> None:
    directory = tmp_path / "scheduler"
    ledger = Ledger()
    rng = random.Random(11)
    deadline = time.monotonic() + TEST_BUDGET_S
    highest = 0
    rounds = 0
    for round_no in range(KILLS):
        if time.monotonic() > deadline:
            break
        lines = run_child(directory, round_no, rng.uniform(0.3, 1.2))
        ledger.read(lines)
        if ledger.run_seqs[-1]:
            assert min(ledger.run_seqs[-1]) > highest, "a sequence number was reused after a restart"
        if round_no % 2 == 1:  # a torn write at the tail, as a power cut could leave
            with open(directory / "schedule.log", "ab") as fh:
                fh.write(frame(b"\x93\xa1a\x01\xc4\x05hello")[: rng.randint(1, 12)])
        highest = recover_and_check(directory, ledger)
        rounds += 1
    assert rounds >= 3, "too few kill rounds within the time budget"
    assert len(ledger.holds) > 100 and len(ledger.settled) > 50, "the child did too little to prove anything"
