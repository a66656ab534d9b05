"""The shared switch record and its coordinators (PostgreSQL and SQLite), the bound on two
gateways disagreeing, and the steps around a switch on real Redis servers."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from mqgate.core.failure_detection import ClusterState
from mqgate.core.layout import Layout
from mqgate.core.tokens import AckToken
from mqgate.errors import BadRequest, Conflict, Unavailable
from mqgate.failover.declare import clean_up, project_topology, redeclare, table_bounds
from mqgate.failover.pool import ClusterPool, ClusterSpec
from mqgate.failover.switch import ActiveRecord, ProjectClusters, SqlSwitchRecords, SwitchCoordinator
from mqgate.model import StoredMessage
from mqgate.registry.records import ConsumerRecord, Snapshot, TopicRecord
from mqgate.settings import Settings
from tests.failover.conftest import FailoverRedis

H, F = ClusterState.HEALTHY, ClusterState.FAILED


@pytest.fixture(params=["sqlite", "postgresql"])
def records_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'switch.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_compare_and_set(records_url: str) -> None:
    records = SqlSwitchRecords(records_url)
    records.create_schema()
    try:
        first = records.compare_and_set("shop", 0, "a", "primary", 1)
        assert first is not None and first.epoch == 1
        assert records.compare_and_set("shop", 0, "b", "lost", 2) is None  # row exists
        assert records.compare_and_set("shop", 2, "b", "stale epoch", 2) is None
        second = records.compare_and_set("shop", 1, "b", "a failed", 3)
        assert second is not None and second.epoch == 2
        assert records.read_all() == {"shop": second}
    finally:
        records.dispose()


def test_backup_equal_to_primary_is_refused() -> None:
    with pytest.raises(BadRequest) as caught:
        ProjectClusters("shop", "a", "a")
    assert caught.value.field == "backup"


def test_two_coordinators_racing_agree(pg_url: str) -> None:
    projects = {f"p{i}": ProjectClusters(f"p{i}", "a", "b") for i in range(20)}

    async def go() -> None:
        rec1, rec2 = SqlSwitchRecords(pg_url), SqlSwitchRecords(pg_url)
        rec1.create_schema()
        states = {"a": H, "b": H}
        one = SwitchCoordinator(rec1, lambda: states, lambda: projects, check_s=0.5)
        two = SwitchCoordinator(rec2, lambda: states, lambda: projects, check_s=0.5)
        try:
            for round_ in range(3):
                if round_ == 1:
                    states.update(a=F, b=H)
                if round_ == 2:  # manual fail-backs racing with each other
                    states.update(a=H, b=H)
                    got = await asyncio.gather(*(c.failback(p) for p in projects for c in (one, two)))
                    assert all(r.cluster == "a" for r in got)
                ev1, ev2 = await asyncio.gather(one.check(), two.check())
                for p in projects:
                    assert one.active(p) == two.active(p), p
                    won = [e for e in ev1 + ev2 if e.project == p and e.won]
                    if round_ < 2:
                        assert len(won) == 1, (round_, p, ev1, ev2)  # exactly one writer per switch
                expected = {0: ("a", 1), 1: ("b", 2), 2: ("a", 3)}[round_]
                assert {(r.cluster, r.epoch) for r in rec1.read_all().values()} == {expected}
        finally:
            rec1.dispose()
            rec2.dispose()

    asyncio.run(go())


def test_a_fail_back_from_a_move_made_since_is_refused(records_url: str) -> None:
    """An operator confirms a fail-back of the move they looked at (its epoch): a switch another
    gateway made since is not undone unseen (the console compared with its own view only)."""
    projects = {"p": ProjectClusters("p", "a", "b")}

    async def go() -> None:
        rec1, rec2 = SqlSwitchRecords(records_url), SqlSwitchRecords(records_url)
        rec1.create_schema()
        states = {"a": H, "b": H}
        one = SwitchCoordinator(rec1, lambda: states, lambda: projects, check_s=60)
        two = SwitchCoordinator(rec2, lambda: states, lambda: projects, check_s=60)
        try:
            await one.check()
            seen = await one.switch_to("p", "b", "operator")  # the move the operator looks at
            await two.switch_to("p", "a", "another gateway")  # epoch 3, unseen by `one`
            await two.switch_to("p", "b", "and back")  # epoch 4: on the backup again
            with pytest.raises(Conflict) as refused:
                await one.failback("p", seen.epoch)
            assert refused.value.field == "epoch"
            assert rec1.read_all()["p"].epoch == 4  # nothing written
            back = await one.failback("p", 4)
            assert (back.cluster, back.epoch) == ("a", 5)
        finally:
            rec1.dispose()
            rec2.dispose()

    asyncio.run(go())


def test_gateways_disagree_for_at_most_the_lease(pg_url: str) -> None:
    """Gateway A never sees the primary fail; B does and switches. A follows within the lease
    (check_s 0.2 s, lease 0.4 s) without any notice."""
    projects = {"shop": ProjectClusters("shop", "a", "b")}

    async def go() -> None:
        rec_a, rec_b = SqlSwitchRecords(pg_url), SqlSwitchRecords(pg_url)
        rec_a.create_schema()
        a = SwitchCoordinator(rec_a, lambda: {"a": H, "b": H}, lambda: projects, check_s=0.2)
        seen_by_b = {"a": H, "b": H}
        b = SwitchCoordinator(rec_b, lambda: seen_by_b, lambda: projects, check_s=0.2)
        await a.start()
        await b.start()

        def writes_to(c: SwitchCoordinator) -> str | None:
            try:
                return c.active("shop")
            except Unavailable:
                return None  # a view past its lease: that gateway spools, writes nowhere

        try:
            # Both views fresh before the primary fails (on a loaded machine, B's start can take
            # longer than A's lease: A's next check then brings its view back).
            ready_by = time.monotonic() + 10
            while not writes_to(a) == writes_to(b) == "a":
                assert time.monotonic() < ready_by, "the gateways never both read cluster a"
                await asyncio.sleep(0.01)
            seen_by_b["a"] = F
            b.notice()

            differ_since: float | None = None
            longest = 0.0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                now = time.monotonic()
                to_a, to_b = writes_to(a), writes_to(b)
                if to_a is not None and to_b is not None and to_a != to_b:
                    differ_since = differ_since or now
                    longest = max(longest, now - differ_since)
                else:
                    differ_since = None
                await asyncio.sleep(0.005)
            print(f"\ntwo gateways disagreed for {longest * 1000:.0f} ms (lease {a.lease_s * 1000:.0f} ms)")
            assert {writes_to(a), writes_to(b)} <= {"b", None}
            assert 0 < longest <= a.lease_s
        finally:
            await a.stop()
            await b.stop()
            rec_a.dispose()
            rec_b.dispose()

    asyncio.run(go())


def test_stop_waits_for_a_database_call_under_way(tmp_path: Path) -> None:
    """A check that stop() cancels leaves its read running in a thread: stop() returns once it
    is done, so the `dispose()` after it finds every connection back in the pool (else the
    read's connection outlives the engine: a ResourceWarning, once failing CI on PostgreSQL)."""
    records = SqlSwitchRecords(f"sqlite:///{tmp_path / 'switch.db'}")
    records.create_schema()
    read_all, entered, release = records.read_all, threading.Event(), threading.Event()
    finished: list[bool] = []

    def late_read() -> dict[str, ActiveRecord]:  # a database that answers late
        entered.set()
        release.wait(10)
        try:
            return read_all()
        finally:
            finished.append(True)

    async def go() -> list[bool]:
        coordinator = SwitchCoordinator(records, lambda: {}, lambda: {}, check_s=0.05)
        await coordinator.start()
        records.read_all = late_read  # type: ignore[method-assign]
        assert await asyncio.to_thread(entered.wait, 5)
        stopping = asyncio.ensure_future(coordinator.stop())
        at_stop: list[bool] = []
        stopping.add_done_callback(lambda _: at_stop.append(bool(finished)))
        done, _ = await asyncio.wait({stopping}, timeout=0.3)
        assert not done  # still reading
        release.set()
        await stopping
        return at_stop

    try:
        assert asyncio.run(go()) == [True]  # the read was over when stop() returned
    finally:
        release.set()
        records.dispose()


def test_a_view_not_read_again_expires(tmp_path: Path) -> None:
    """The lease is measured on the coordinator's own clock from the start of the read that
    saw the record: a clock of the test's (a busy machine cannot stretch it)."""
    (tmp_path / "db").mkdir()
    records = SqlSwitchRecords(f"sqlite:///{tmp_path / 'db' / 'switch.db'}")
    records.create_schema()
    now = [1000.0]

    async def go() -> None:
        c = SwitchCoordinator(
            records,
            lambda: {"a": H},
            lambda: {"s": ProjectClusters("s", "a")},
            check_s=0.1,
            clock=lambda: now[0],
        )
        await c.check()  # read at 1000.0
        assert c.active("s") == "a"
        records.dispose()
        (tmp_path / "db").rename(tmp_path / "moved")  # the database is away
        with pytest.raises(Exception):  # noqa: B017 (the driver's error: any)
            await c.check()
        now[0] = 1000.0 + c.lease_s - 0.001
        assert c.active("s") == "a"  # still within the lease of the last good read
        now[0] = 1000.0 + c.lease_s
        with pytest.raises(Unavailable):
            c.active("s")
        await c.stop()

    asyncio.run(go())


def _snapshot() -> Snapshot:
    topics = {
        "orders": TopicRecord("orders", 3, 3_600_000, None, 0, project="shop"),
        "%DLQ%orders-c": TopicRecord("%DLQ%orders-c", 1, 3_600_000, None, 0),
        "other": TopicRecord("other", 2, 3_600_000, None, 0, project="else"),
    }
    consumers = {
        n: ConsumerRecord(n, t, mode, "latest", 30.0, 16, False, 0.0, 0, "h", 0)
        for n, t, mode in (
            ("orders-c", "orders", "cluster"),
            ("orders-b", "orders", "broadcast"),
            ("o", "other", "cluster"),
        )
    }
    return Snapshot(1, topics, {}, consumers)


def test_redeclare_on_the_backup_and_clean_up_the_primary(tmp_path: Path) -> None:
    primary = FailoverRedis(tmp_path / "p").start()
    backup = FailoverRedis(tmp_path / "b").start()
    topology = project_topology(_snapshot(), "shop")
    assert set(topology.topics) == {"orders", "%DLQ%orders-c"} and set(topology.consumers) == {
        "orders-c",
        "orders-b",
    }

    async def go() -> None:
        pool = ClusterPool(Settings(data_dir=tmp_path / "gw"))
        await pool.add(ClusterSpec("p", primary.url))
        await pool.add(ClusterSpec("b", backup.url))
        await pool.start()
        try:
            p, b = pool.get("p").backends, pool.get("b").backends
            now = int(time.time() * 1000)
            # The backup gets the project: topics, side topics, the cluster consumer's table.
            report = await redeclare(topology, b.store, b.offsets, now)
            assert report.tables_created == ["orders-c"]
            assert sorted(report.topics) == ["%DLQ%orders-c", "%INBOX%orders-b", "%INBOX%orders-c",
                                             "%RETRY%orders-b", "%RETRY%orders-c", "orders"]  # fmt: skip
            table = await b.offsets.table("orders-c", "")
            assert table is not None and [e.committed for e in table] == [0] * 5
            assert len(await b.store.bounds("orders")) == 3
            assert (await redeclare(topology, b.store, b.offsets, now)).tables_created == []
            # The primary: 5 messages, one queue locked by a pull served before the switch.
            await redeclare(topology, p.store, p.offsets, now)
            msgs = [StoredMessage(f"m{i}", now, "pp", "x", [], [], {}) for i in range(5)]
            await p.store.append("orders", 0, msgs)
            layout = Layout("orders-c", "orders", topology.topics["orders"].grid)
            bounds = await table_bounds(p.store, layout)
            lease = await p.offsets.lease(
                "orders-c",
                "",
                bounds,
                now_ms=now,
                max_count=10,
                lock_timeout_ms=60_000,
                max_attempts=16,
                owner="gw1",
            )
            assert lease is not None and (lease.offset, lease.next_offset) == (0, 5)
            later = await clean_up(topology, p.store, p.offsets, now_ms=now + 1, locked_before_ms=now)
            assert later.released == [] and later.backlog[("orders-c", "")] == 5  # a drain's lock stays
            switched = now + 1
            report2 = await clean_up(topology, p.store, p.offsets, now_ms=now + 2, locked_before_ms=switched)
            assert report2.released == [("orders-c", "", lease.queue)] and not report2.drained
            # Drained: pulled again (the lock was free at once) and acked.
            again = await p.offsets.lease(
                "orders-c",
                "",
                bounds,
                now_ms=now + 3,
                max_count=10,
                lock_timeout_ms=60_000,
                max_attempts=16,
                owner="gw2",
            )
            assert again is not None and again.attempts == 2  # delivered again, counted
            token = AckToken(
                "orders-c", "", p.store.broker, again.queue, again.offset, again.next_offset, again.lock_ts
            )
            assert await p.offsets.ack(token, now + 4) is None
            assert (
                await clean_up(topology, p.store, p.offsets, now_ms=now + 5, locked_before_ms=switched)
            ).drained
        finally:
            await pool.stop()

    try:
        asyncio.run(go())
    finally:
        primary.stop()
        backup.stop()
