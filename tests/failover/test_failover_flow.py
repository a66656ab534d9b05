"""The pieces together, as the produce path will use them: producers write to the project's
active cluster, spool what it cannot take, the primary is killed -9, every gateway view moves
to the backup, the project is declared there and the spool replayed. Nothing acknowledged is
lost; duplicates are counted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from mqgate.core.failure_detection import DetectionRules
from mqgate.errors import MqgateError
from mqgate.failover.declare import project_topology, redeclare
from mqgate.failover.pool import ClusterPool, ClusterSpec
from mqgate.failover.replay import Replayer
from mqgate.failover.spool import QueueKey, Spool, SpoolRecord
from mqgate.failover.switch import ProjectClusters, SqlSwitchRecords, SwitchCoordinator, SwitchEvent
from mqgate.model import StoredMessage
from mqgate.registry.records import Snapshot, TopicRecord
from mqgate.settings import Settings
from tests.conftest import run_bounded
from tests.failover.conftest import FailoverRedis

QUEUES = 4


def test_kill9_of_the_primary_under_load(tmp_path: Path) -> None:
    primary = FailoverRedis(tmp_path / "p").start()
    backup = FailoverRedis(tmp_path / "b").start()
    snapshot = Snapshot(
        1, {"orders": TopicRecord("orders", QUEUES, 3_600_000, None, 0, project="shop")}, {}, {}
    )
    topology = project_topology(snapshot, "shop")
    projects = {"shop": ProjectClusters("shop", "p", "b")}

    async def go() -> None:
        rules = DetectionRules(send_timeout_s=1.0, fail_after=2)
        pool = ClusterPool(
            Settings(data_dir=tmp_path / "gw"), rules, probe_interval_s=0.1, probe_timeout_s=0.3
        )
        await pool.add(ClusterSpec("p", primary.url))
        await pool.add(ClusterSpec("b", backup.url))
        await pool.start()
        for name in ("p", "b"):
            c = pool.get(name).backends
            await redeclare(topology, c.store, c.offsets, 0)
        spool = Spool(tmp_path / "spool", 64 << 20)
        await spool.open()
        replayer = Replayer(spool)
        records = SqlSwitchRecords(f"sqlite:///{tmp_path / 'switch.db'}")
        records.create_schema()
        served: dict[str, float] = {}

        async def send(key: QueueKey, batch: list[SpoolRecord]) -> None:
            active = coordinator.active(key[0])
            msgs = [
                StoredMessage(r.msg_id, r.spooled_ms, "pp", r.payload.decode(), [], [], {}) for r in batch
            ]
            store = pool.get(active).store
            await pool.guarded(active, lambda: store.append(key[1], int(key[2]), msgs))

        async def switched(event: SwitchEvent) -> None:
            target = pool.get(event.after).backends
            await redeclare(topology, target.store, target.offsets, int(time.time() * 1000))
            await replayer.replay(send, event.project)

        coordinator = SwitchCoordinator(
            records, pool.states, lambda: projects, check_s=0.2, on_switch=switched
        )
        pool.listen(lambda _t: coordinator.notice())
        await coordinator.start()
        acked: list[str] = []
        spooled = 0
        killed_at: list[float] = []  # when the primary was killed

        def sending(i: int) -> bool:
            """400 each, and on after the kill until the backup took one (or 20 s passed): a
            loaded machine's slow switch must not leave the load over before it."""
            if i < 400:
                return True
            return bool(killed_at) and "b" not in served and time.monotonic() - killed_at[0] < 20

        async def producer(n: int) -> None:
            nonlocal spooled
            i = 0
            while sending(i):
                msg_id = f"w{n}-{i}"
                key = ("shop", "orders", str(i % QUEUES))
                try:
                    if spool.has_pending(*key):
                        raise MqgateError("behind spooled records", code="order")
                    cluster = coordinator.active("shop")
                    msg = StoredMessage(msg_id, 0, "pp", msg_id, [], [], {})
                    store = pool.get(cluster).store
                    queue = int(key[2])
                    await pool.guarded(cluster, lambda s=store, q=queue, m=msg: s.append("orders", q, [m]))
                    served.setdefault(cluster, time.monotonic())
                except MqgateError as exc:
                    # A send that reached the cluster and failed may have been stored.
                    await spool.append(*key, msg_id, msg_id.encode(), tried=exc.code != "order")
                    spooled += 1
                acked.append(msg_id)
                i += 1
                await asyncio.sleep(0.005)

        try:
            load = asyncio.gather(*(producer(n) for n in range(4)))
            while len(acked) < 400:
                await asyncio.sleep(0.01)
            primary.kill9()
            killed = time.monotonic()
            killed_at.append(killed)
            await load
            # The last spooled ones: replayed by the next check (run_bounded bounds the wait:
            # how long a loaded machine takes is the failover benchmark's figure, not this test's).
            while spool.stats().pending:
                await replayer.replay(send, "shop")
            assert "b" in served, "the backup served nothing in the 20 s after the kill"
            first_on_backup = served["b"] - killed
            dups = spool.stats().possible_duplicates
            print(f"\nkill -9 of the primary: first produce on the backup after {first_on_backup:.2f}s, "
                  f"{spooled} spooled and replayed, possible duplicates {dups}")  # fmt: skip
            assert coordinator.active("shop") == "b"
        finally:
            await coordinator.stop()
            await spool.close()
            records.dispose()
        # Every acknowledged message is on the backup, or was on the primary before it died.
        primary.start()
        await _wait_opened(pool)
        found: list[str] = []
        for name in ("p", "b"):
            store = pool.get(name).store
            for q in range(QUEUES):
                found += [m.msg_id for _, m in await store.read("orders", q, 0, 100_000)]
        await pool.stop()
        missing = set(acked) - set(found)
        assert not missing, f"{len(missing)} acknowledged messages lost"
        assert len(found) - len(set(found)) <= spool.stats().possible_duplicates

    try:
        run_bounded(go(), 120)  # it takes ~5 s; it hung once in CI (600 s, no clue where)
    finally:
        primary.stop()
        backup.stop()


async def _wait_opened(pool: ClusterPool) -> None:
    deadline = time.monotonic() + 10
    while pool.get("p").state.value != "healthy":
        assert time.monotonic() < deadline, "primary did not rejoin"
        await asyncio.sleep(0.02)
