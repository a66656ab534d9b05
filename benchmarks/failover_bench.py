"""Failover figures (issue 12, SPEC P8/E7): a project on two redis-servers of its own, one
gateway, 4 producers (batches of 5) and 4 consumers; the primary is killed -9 under load.

    PYTHONPATH=src:. .venv/bin/python benchmarks/failover_bench.py --rounds 3

Per round: time from the kill to the switch (the project's active cluster is the backup), to
the first produce stored on the backup and the first pull served after it, produce errors seen
by clients (target 0), produce p50/p99 in the second before the kill (the baseline, same run)
and in the 3 s after it, produces spooled and resent, duplicates consumed and the spool's
count of possible duplicates. Then the spool alone: both clusters down, N produces spooled
(write rate, each fsynced: group commit), then one cluster back and the time to resend them
all (replay rate). The thresholds are the tests' short ones (probe 0.1 s, send time-out 1 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine_info import machine
from tests.conftest import wait_until
from tests.failover.conftest import FailoverRedis
from tests.failover.test_gateway_failover import Traffic, failover_state, gateway, project_on


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def kill_round(root: Path) -> dict[str, float]:
    primary = FailoverRedis(root / "p").start()
    backup = FailoverRedis(root / "b").start()
    gw = gateway(root / "gw" / "data").start()
    try:
        ptoken, ctoken = project_on(gw, primary, backup)
        traffic = Traffic(gw.url, ptoken, ctoken)
        threads = traffic.run(producers=4, consumers=4)
        wait_until(lambda: len(traffic.consumed) > 1000, 60, "traffic on the primary")
        time.sleep(1.0)  # a steady second before the kill: the baseline latencies
        primary.kill9()
        killed = time.monotonic()
        wait_until(lambda: failover_state(gw)["active"] == "b", 30, "the switch")
        switched = time.monotonic() - killed
        time.sleep(3.0)
        traffic.stop.set()
        for t in threads:
            t.join(30)
        before = [d for t, d in traffic.latencies if killed - 1 <= t < killed]
        after = [d for t, d in traffic.latencies if killed <= t <= killed + 3]
        first_pull = min((t for t in traffic.found_at if t > killed), default=float("nan")) - killed
        first_b = (
            min((t for t, b in traffic.brokers if t > killed and b == "b"), default=float("nan")) - killed
        )
        primary.start()
        wait_until(lambda: not failover_state(gw)["draining"], 60, "the drain")
        rest = Traffic(gw.url, ptoken, ctoken, consumed=traffic.consumed)
        threads = rest.run(producers=0, consumers=2)
        deadline = time.monotonic() + 90
        while set(traffic.acked) - set(rest.consumed) and time.monotonic() < deadline:
            time.sleep(0.1)  # redelivered batches may wait out their backoff (SPEC S5)
        rest.stop.set()
        for t in threads:
            t.join(30)
        spool = gw.admin("GET", "/admin/spool")
        return {
            "switch_s": switched,
            "first_produce_on_backup_s": first_b,
            "first_pull_s": first_pull,
            "produce_errors": len([e for e in traffic.errors if not e[2].startswith("pull")]),
            "pull_errors": len([e for e in traffic.errors if e[2].startswith("pull")]),
            "p50_before_ms": percentile(before, 0.5) * 1000,
            "p99_before_ms": percentile(before, 0.99) * 1000,
            "p50_after_ms": percentile(after, 0.5) * 1000,
            "p99_after_ms": percentile(after, 0.99) * 1000,
            "produced": len(traffic.acked),
            "spooled": spool["spooledTotal"],
            "resent": spool["resentTotal"],
            "duplicates": sum(n - 1 for n in rest.consumed.values()),
            "possible_duplicates": spool["possibleDuplicates"],
            "not_consumed_after_90s": len(set(traffic.acked) - set(rest.consumed)),
        }
    finally:
        gw.stop()
        primary.stop()
        backup.stop()


def spool_round(root: Path, messages: int) -> dict[str, float]:
    primary = FailoverRedis(root / "p").start()
    backup = FailoverRedis(root / "b").start()
    gw = gateway(root / "gw" / "data").start()
    try:
        ptoken, _ = project_on(gw, primary, backup)
        primary.kill9()
        backup.kill9()
        wait_until(lambda: gw.admin("GET", "/admin/clusters/b")["state"] == "failed", 10, "both failed")
        per_batch = 50
        started = time.monotonic()

        def writer(n: int) -> None:
            with httpx.Client(base_url=gw.url, timeout=30) as c:
                for i in range(messages // per_batch // 8):
                    body = {
                        "producer": "orders-p",
                        "messages": [{"message": f"{n}-{i}-{k}"} for k in range(per_batch)],
                    }
                    r = c.post("/mq/produce/batch", json=body, headers={"Authorization": f"Bearer {ptoken}"})
                    assert r.status_code == 200, r.text

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        spooled_s = time.monotonic() - started
        pending = gw.admin("GET", "/admin/spool")["pending"]
        backup.start()
        back = time.monotonic()
        wait_until(lambda: gw.admin("GET", "/admin/spool")["pending"] == 0, 120, "the replay", 0.01)
        replay_s = time.monotonic() - back
        return {"spooled": pending, "spool_write_per_s": pending / spooled_s, "replay_s": replay_s,
                "replay_per_s": pending / replay_s}  # fmt: skip
    finally:
        gw.stop()
        primary.stop()
        backup.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spool-messages", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mqgate-failover-") as tmp:
        root = Path(tmp)
        info = machine(root, Path(sys.executable))
        rounds = [kill_round(root / f"kill{i}") for i in range(args.rounds)]
        spool = spool_round(root / "spool", args.spool_messages)
    print(json.dumps({"machine": info, "kill9_rounds": rounds, "spool": spool}, indent=2))


if __name__ == "__main__":
    main()
