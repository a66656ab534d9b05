"""Issue 27: the receipt of a spooled produce says whether the send that failed may have stored
it (`"possibleDuplicate": true` beside `"status": "spooled"`), exactly when its spool record is
`tried` (its resend is then counted and marked `mq.possible_duplicate`). Before, every spooled
receipt said `spooled` only.

Real redis-servers of the test's own; a hung primary is a SIGSTOPped one. The in-process tests
drive the data path and the failover rounds themselves (tests/failover/harness.py); the last
one goes through a gateway process's HTTP answers, single and batch."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import msgspec

from mqgate.core.failure_detection import ClusterState
from mqgate.failover.switch import SwitchEvent
from mqgate.model import Receipt
from tests.conftest import run_bounded, wait_until
from tests.failover.conftest import FailoverRedis
from tests.failover.harness import InProcess, in_process
from tests.failover.test_gateway_failover import gateway, project_on


def _answer(receipt: Receipt) -> dict[str, object]:
    """The receipt as the produce answers encode it."""
    decoded: dict[str, object] = msgspec.json.decode(msgspec.json.encode(receipt))
    return decoded


async def _replayed(h: InProcess, timeout_s: float = 30.0) -> None:
    """Run the replay round until the spool is empty. A replay waits for a serving cluster: if a
    call of the gateway's own (its lag pass, on a slow machine) also timed out on the hung
    primary, the primary is failed, and the probes a gateway's loop makes bring it back first
    (before, the replay round found nothing to do, again and again, until the deadline)."""
    deadline = time.monotonic() + timeout_s
    while h.failover.spool_stats().pending:
        assert time.monotonic() < deadline, "the spool was not replayed"
        if h.state(h.active()) in (ClusterState.HEALTHY, ClusterState.SUSPECT):
            await h.failover.replay()
        else:
            await h.probe(h.active())


def test_a_produce_that_timed_out_on_a_hung_primary_is_answered_spooled_and_possible_duplicate(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """A batch over several queues sent to the hung primary times out: every receipt is spooled
    and a possible duplicate (the primary may have stored it: it does, once resumed). A produce
    of one of those queues spooled behind it (never sent) is not; nor is a stored one."""
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url, failover_send_timeout_s=1.0) as h:
            (stored,) = await h.produce(["before"], order_key="a")
            assert stored.status == "stored" and not stored.possible_duplicate
            assert "possibleDuplicate" not in _answer(stored)

            primary.pause()
            try:
                timed_out = await h.produce(["x0", "x1", "x2"])  # round robin: queues 0, 1, 2
                behind = await h.produce(["y"], order_key="d")  # queue 0, which has spooled ones
            finally:
                primary.resume()
            assert len({r.queue for r in timed_out}) == 3
            assert [(r.status, r.possible_duplicate) for r in timed_out] == [("spooled", True)] * 3
            for r in timed_out:
                assert _answer(r) == {
                    "msgId": r.msg_id, "broker": "spool", "status": "spooled", "queue": r.queue,
                    "possibleDuplicate": True,
                }  # fmt: skip
            assert (behind[0].status, behind[0].queue, behind[0].possible_duplicate) == ("spooled", 0, False)
            assert "possibleDuplicate" not in _answer(behind[0])
            # What the receipts said is what the spool counts on resend.
            await _replayed(h)
            stats = h.failover.spool_stats()
            flagged = sum(r.possible_duplicate for r in timed_out + behind)
            assert stats.possible_duplicates == flagged == 3

    run_bounded(go(), 180)


def test_a_produce_spooled_before_it_reached_a_cluster_is_answered_spooled_without_the_flag(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """The primary is dead and the project switches to the backup, which hangs while the
    produce forces the project's declaration there: the declaration times out, nothing of the
    produce was sent, so its receipt is spooled only (and its resend is not counted)."""
    primary, backup = redis_pair
    # Two declarations time out on the hung backup: it stays suspect (serving), not failed.
    settings = {"failover_send_timeout_s": 1.0, "failover_fail_after": 10}

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url, **settings) as h:
            primary.kill9()
            h.fail("p")
            switched = h.failover.coordinator.on_switch
            assert switched is not None
            receipts: list[Receipt] = []

            async def produce_while_b_hangs(event: SwitchEvent) -> None:
                backup.pause()
                try:
                    receipts.extend(await h.produce(["y0", "y1"], order_key="k"))
                    receipts.extend(await h.produce(["z"], order_key="other"))
                finally:
                    backup.resume()
                await switched(event)

            h.failover.coordinator.on_switch = produce_while_b_hangs
            await h.failover.coordinator.check()
            assert h.active() == "b"
            assert [(r.status, r.possible_duplicate) for r in receipts] == [("spooled", False)] * 3
            assert all("possibleDuplicate" not in _answer(r) for r in receipts)
            await _replayed(h)
            assert h.failover.spool_stats().possible_duplicates == 0

    run_bounded(go(), 180)


def test_the_produce_answers_say_possible_duplicate_single_and_batch(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """Through a gateway's HTTP API, its primary hung (probes and failure thresholds set so it
    stays the project's cluster): a single produce and a batch that time out there answer
    `spooled` with `possibleDuplicate: true`; a batch of a queue with spooled messages (never
    sent) answers `spooled` only. Resumed, the primary takes the spool."""
    primary, backup = redis_pair
    gw = gateway(
        tmp_path / "gw" / "data",
        MQGATE_FAILOVER_PROBE_INTERVAL_S="3600",
        MQGATE_FAILOVER_FAIL_AFTER="1000",
        MQGATE_FAILOVER_MIN_SAMPLES="1000",
    )
    gw.start()
    try:
        ptoken, _ = project_on(gw, primary, backup)
        auth = {"Authorization": f"Bearer {ptoken}"}
        with httpx.Client(base_url=gw.url, headers=auth, timeout=30) as c:

            def single(body: str, key: str) -> dict[str, object]:
                r = c.post("/mq/produce", json={"producer": "orders-p", "message": body, "orderKey": key})
                assert r.status_code == 200, r.text
                result: dict[str, object] = r.json()["result"]
                return result

            def batch(bodies: list[str], key: str) -> list[dict[str, object]]:
                messages = [{"message": b, "orderKey": key} for b in bodies]
                r = c.post("/mq/produce/batch", json={"producer": "orders-p", "messages": messages})
                assert r.status_code == 200, r.text
                receipts: list[dict[str, object]] = r.json()["result"]["receipts"]
                return receipts

            stored = single("before", "a")
            assert stored["status"] == "stored" and "possibleDuplicate" not in stored
            primary.pause()
            try:
                one = single("one", "a")  # reaches the primary, no answer within 1 s
                two = batch(["two-0", "two-1"], "b")  # another queue ("a" is 3, "b" is 1 of 4)
                behind = batch(["three-0", "three-1"], "a")  # behind "one": never sent
            finally:
                primary.resume()
        assert (one["status"], one["broker"], one.get("possibleDuplicate")) == ("spooled", "spool", True)
        assert [(r["status"], r.get("possibleDuplicate")) for r in two] == [("spooled", True)] * 2
        assert [(r["status"], "possibleDuplicate" in r) for r in behind] == [("spooled", False)] * 2
        wait_until(lambda: gw.admin("GET", "/admin/spool")["pending"] == 0, 60, "the spool replayed")
        # Each resend of the flagged three is counted (a resend the hung primary did not answer
        # in time is a try more: the replay round runs meanwhile).
        assert gw.admin("GET", "/admin/spool")["possibleDuplicates"] >= 3
    finally:
        gw.stop()
