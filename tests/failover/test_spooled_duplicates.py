"""Issue 27 item 2: a message acknowledged with a `spooled` receipt was delivered twice, both
acks answered 200. The cause: its produce reached the primary, which stored it, but the answer
never came (the send time-out, or the connection lost as the primary died); the gateway spooled
it (a possible duplicate, counted) and resent it to the backup after the switch; once the
primary was back, the drain copied the primary's unconsumed backlog, that message included,
into the consumer's inbox on the backup.

Deterministic: the primary is hung (SIGSTOP) while a produce is sent to it; the produce times
out and is spooled; the primary, resumed, executes the append it had received; then it is
killed -9, the project switches, the spool is replayed to the backup, the primary comes back
and is drained. Each step is driven by the test."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from mqgate.errors import MqgateError
from mqgate.failover.config import SqlFailoverConfig
from mqgate.failover.service import POSSIBLE_DUPLICATE
from mqgate.failover.switch import SwitchEvent
from mqgate.model import Receipt
from tests.conftest import run_bounded
from tests.failover.conftest import FailoverRedis
from tests.failover.harness import InProcess, in_process


async def _drain_left(h: InProcess, timeout_s: float = 30.0) -> None:
    """Run the drain round until the primary is drained (it may need a round or two)."""
    deadline = time.monotonic() + timeout_s
    while h.failover.project("shop").draining:
        assert time.monotonic() < deadline, "the primary was not drained"
        try:
            await h.failover.drain_left()
        except MqgateError:
            continue  # a connection of before the restart: the next round


async def stored_on_p_and_resent_to_b(h: InProcess, primary: FailoverRedis) -> Receipt:
    """A produce that reached p (hung) and timed out: spooled, stored on p once p runs again;
    p killed, the project on b, the spool replayed there. Its receipt."""
    before = await h.produce([f"m{i}" for i in range(5)], order_key="k")
    assert {r.status for r in before} == {"stored"}
    assert sorted(m for m, _ in await h.consume_all()) == sorted(r.msg_id for r in before)

    primary.pause()
    (spooled,) = await h.produce(["x"], order_key="k")  # reaches p; no answer in time
    assert spooled.status == "spooled"
    primary.resume()
    p_store = h.pool.get("p").backends.store
    deadline = time.monotonic() + 30
    while sum(b.max for b in await p_store.bounds("orders")) < 6:  # p executed the append
        assert time.monotonic() < deadline, "the primary never stored the timed-out append"
    primary.kill9()
    h.fail("p")
    await h.failover.coordinator.check()
    assert h.active() == "b"
    await h.failover.replay()
    stats = h.failover.spool_stats()
    assert (stats.pending, stats.possible_duplicates) == (0, 1)
    return spooled


def test_a_spooled_produce_stored_on_the_primary_is_delivered_once(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url, failover_send_timeout_s=1.0) as h:
            spooled = await stored_on_p_and_resent_to_b(h, primary)
            first = await h.consume_all()  # the resent copy, from the backup
            assert [m for m, _ in first] == [spooled.msg_id]

            primary.start()
            await h.rejoin("p")
            await _drain_left(h)
            second = await h.consume_all()  # what the drain moved to the inbox
            deliveries = [m for m, _ in first + second]
            print(f"\ndeliveries of the spooled message: {deliveries.count(spooled.msg_id)}")
            assert deliveries == [spooled.msg_id], deliveries
            # The copy a consumer got says it may be a second one (it was resent after a send
            # that may have stored it): a consumer that has seen its id can drop it.
            assert first[0][1].get(POSSIBLE_DUPLICATE) == "1"

    run_bounded(go(), 180)


def test_the_resent_copy_moved_by_a_drain_is_not_skipped_by_a_later_one(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """The resent copy is on b, unconsumed; p returns and is drained (its own copy skipped);
    fail-back to p: b's backlog, the resent copy included, moves to the inbox on p; p fails
    again and is drained into b: that copy, in p's inbox, is the one left to deliver."""
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url, failover_send_timeout_s=1.0) as h:
            spooled = await stored_on_p_and_resent_to_b(h, primary)
            primary.start()
            await h.rejoin("p")
            await _drain_left(h)  # p's own copy skipped
            await h.failover.failback("shop")
            await _drain_left(h)  # b's backlog (the resent copy) into the inbox on p
            primary.kill9()
            h.fail("p")
            await h.failover.coordinator.check()
            assert (h.active(), h.epoch()) == ("b", 4)
            primary.start()
            await h.rejoin("p")
            await _drain_left(h)  # p's inbox into the inbox on b
            deliveries = [m for m, _ in await h.consume_all()]
            assert deliveries == [spooled.msg_id], deliveries

    run_bounded(go(), 180)


def test_a_produce_spooled_before_it_reached_a_cluster_is_not_a_possible_duplicate(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    """Spooled because the project could not be declared on its new cluster (hung): nothing was
    sent, so its resend is its first: not counted, not marked."""
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url, failover_send_timeout_s=1.0) as h:
            primary.kill9()
            h.fail("p")
            switched = h.failover.coordinator.on_switch
            assert switched is not None
            receipts: list[Receipt] = []

            async def produce_while_b_hangs(event: SwitchEvent) -> None:
                backup.pause()
                receipts.extend(await h.produce(["y"]))  # the declaration times out: spooled
                backup.resume()
                await switched(event)

            h.failover.coordinator.on_switch = produce_while_b_hangs
            await h.failover.coordinator.check()
            assert [r.status for r in receipts] == ["spooled"]
            await h.failover.replay()
            stats = h.failover.spool_stats()
            assert (stats.pending, stats.possible_duplicates) == (0, 0)
            (got,) = await h.consume_all()
            assert got[0] == receipts[0].msg_id and POSSIBLE_DUPLICATE not in got[1]

    run_bounded(go(), 180)


@pytest.fixture(params=["sqlite", "postgresql"])
def config_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'config.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_resent_ids_keep_the_latest_cluster_and_go_after_retention(config_url: str) -> None:
    engine = sa.create_engine(config_url)
    try:
        config = SqlFailoverConfig(engine)
        config.create_schema()
        config.record_resent("shop", "b", ["x", "y"], 1_000)
        config.record_resent("shop", "p", ["y"], 2_000)  # resent again, to p: its latest copy
        config.record_resent("other", "b", ["x"], 1_000)
        assert config.resent_to("shop", "b") == {"x"}
        assert config.resent_to("shop", "p") == {"y"}
        assert config.forget_resent("shop", 1_500) == 1
        assert config.resent_to("shop", "b") == set() and config.resent_to("other", "b") == {"x"}
    finally:
        engine.dispose()
