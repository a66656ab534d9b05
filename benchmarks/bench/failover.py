"""Failover figures (issue 12, SPEC P8/E7; `run.py failover`): a project on two redis-servers
of its own, one gateway, 4 producers (batches of 5) and 4 consumers; the primary is killed -9
under load.

Per round: time from the kill to the switch (the project's active cluster is the backup), to
the first produce stored on the backup and the first pull served after it, produce errors seen
by clients (target 0), produce p50/p99 in the second before the kill (the baseline, same run)
and in the 3 s after it, produces spooled and resent, duplicates consumed and the spool's
count of possible duplicates. Then the spool alone: both clusters down, N produces spooled
(write rate, each fsynced: group commit), then one cluster back and the time to resend them
all (replay rate). The thresholds are the tests' short ones (probe 0.1 s, send time-out 1 s).
The servers and the traffic are the failover tests' own (tests/failover/).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import results
from .common import ROOT, percentile


def kill_round(root: Path) -> dict[str, float]:
    from tests.conftest import wait_until
    from tests.failover.conftest import FailoverRedis
    from tests.failover.test_gateway_failover import Traffic, failover_state, gateway, project_on

    primary, backup = FailoverRedis(root / "p").start(), FailoverRedis(root / "b").start()
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
    import httpx
    from tests.conftest import wait_until
    from tests.failover.conftest import FailoverRedis
    from tests.failover.test_gateway_failover import gateway, project_on

    primary, backup = FailoverRedis(root / "p").start(), FailoverRedis(root / "b").start()
    gw = gateway(root / "gw" / "data").start()
    try:
        ptoken, _ = project_on(gw, primary, backup)
        primary.kill9()
        backup.kill9()
        wait_until(lambda: gw.admin("GET", "/admin/failover/b")["state"] == "failed", 10, "both failed")
        per_batch = 50
        started = time.monotonic()

        def writer(n: int) -> None:
            with httpx.Client(
                base_url=gw.url, timeout=30, headers={"Authorization": f"Bearer {ptoken}"}
            ) as c:
                for i in range(messages // per_batch // 8):
                    body = {
                        "producer": "orders-p",
                        "messages": [{"message": f"{n}-{i}-{k}"} for k in range(per_batch)],
                    }
                    r = c.post("/mq/produce/batch", json=body)
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
        return {
            "spooled": pending,
            "spool_write_per_s": pending / spooled_s,
            "replay_s": replay_s,
            "replay_per_s": pending / replay_s,
        }
    finally:
        gw.stop()
        primary.stop()
        backup.stop()


def main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="mqgate-failover-") as tmp:
        root = Path(tmp)
        m = results.machine(root)
        rounds = [kill_round(root / f"kill{i}") for i in range(args.rounds)]
        spool = spool_round(root / "spool", args.spool_messages)
    rows = [
        results.Row(
            "failover.switch" if r is max(rounds, key=lambda x: x["switch_s"]) else "",
            f"kill -9 of a project's primary under load → the backup active (round {i + 1} of "
            f"{len(rounds)}, worst kept)",
            f"{r['switch_s'] * 1000:.0f} ms",
            f"produce p50 / p99 the second before the kill: {r['p50_before_ms']:.1f} / "
            f"{r['p99_before_ms']:.1f} ms",
            "—",
            f"p50 / p99 in the 3 s after: {r['p50_after_ms']:.1f} / {r['p99_after_ms']:.1f} "
            f"ms; produce errors {r['produce_errors']} (target 0)",
            f"first produce on b {r['first_produce_on_backup_s'] * 1000:.0f} ms, first pull "
            f"{r['first_pull_s'] * 1000:.0f} ms; "
            f"pull errors {r['pull_errors']}; produced {r['produced']:,}; spooled / resent "
            f"{r['spooled']:,} / {r['resent']:,}; "
            f"duplicates consumed {r['duplicates']} (spool's possible {r['possible_duplicates']}); not "
            f"consumed after 90 s "
            f"{r['not_consumed_after_90s']}",
        )
        for i, r in enumerate(rounds)
    ]
    rows.append(
        results.Row(
            "failover.spool",
            f"spool with both clusters down: {spool['spooled']:,} produces (8 writers × "
            "batches of 50, each fsynced)",
            f"{spool['spool_write_per_s']:,.0f}/s",
            notes=f"one cluster back: all resent in {spool['replay_s']:.2f} s "
            f"({spool['replay_per_s']:,.0f}/s)",
        )
    )
    results.record(args, "failover: kill -9 of a project's primary under load; the spool", rows, m=m)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    p = results.subcommand(
        sub,
        common,
        "failover",
        __doc__,
        help="kill -9 of a project's primary under load; the spool (needs redis-server)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spool-messages", type=int, default=20_000)
    p.set_defaults(func=main)
