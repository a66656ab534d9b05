"""Issue 27: the queue state history of idle queues grows by what changed, not by one row per
queue and consumer per interval (12 MB/min at thousands of queues). An interval equal to its
key's previous one extends the key's steady run, written in place; the queries still answer
single intervals, as before; tables made before runs get their column."""

from __future__ import annotations

import asyncio
from pathlib import Path

import sqlalchemy as sa

from mqgate.queuestate.diagnosis import diagnose
from mqgate.queuestate.history import QueueStateHistory
from mqgate.queuestate.recorder import QueueStateRecorder
from mqgate.queuestate.rows import ConsumerInterval, QueueInterval, Rollup, split_run
from mqgate.queuestate.sampler import QueueStateSampler
from mqgate.queuestate.tables import make_tables

IV = 60_000
B = 1_700_000_040_000
QUEUES = 200
INTERVALS = 10


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def row_counts(h: QueueStateHistory) -> tuple[int, int]:
    with h.engine.connect() as conn:
        return (
            int(conn.execute(sa.select(sa.func.count()).select_from(h.queues)).scalar_one()),
            int(conn.execute(sa.select(sa.func.count()).select_from(h.consumers)).scalar_one()),
        )


def sample_round(sampler: QueueStateSampler, now_ms: int, moved: int | None = None) -> None:
    """What the gateway's probe does every 5 s: every queue's length and every group's backlog
    (queue `moved` one message longer than it was)."""
    for q in range(QUEUES):
        length = q % 7 + (1 if q == moved else 0)
        sampler.observe_queue("shop", "orders", q, length, now_ms)
        sampler.observe_backlog("shop", "billing", "orders", q, length, now_ms)


def test_idle_queues_grow_the_history_by_what_changed(history: QueueStateHistory) -> None:
    async def scenario() -> None:
        clock = Clock(B)
        sampler = QueueStateSampler(interval_s=60, sample_every_s=5)
        recorder = QueueStateRecorder(sampler, history, clock=clock, flush_every_s=3600)
        rounds = 0
        for k in range(INTERVALS):
            for i in range(12):  # one interval of sampler rounds
                clock.now_ms = B + k * IV + i * 5_000
                sample_round(sampler, clock.now_ms)
                rounds += 1
            clock.now_ms = B + (k + 1) * IV
            await recorder.flush()  # what a reader (or the flush loop) does once it closed
            if k == 0:
                first = row_counts(history)
        assert first == (QUEUES, QUEUES)
        # Before: a row per queue and per consumer and queue for each of the 10 intervals
        # (4,000 rows); now the runs of the 400 keys, written on in place.
        assert row_counts(history) == (QUEUES, QUEUES)
        assert rounds == 12 * INTERVALS and recorder.runs is not None and recorder.runs.extended > 0

        # One queue moves: one new row for it (and its consumer), no other.
        for i in range(12):
            clock.now_ms = B + INTERVALS * IV + i * 5_000
            sample_round(sampler, clock.now_ms, moved=3)
        clock.now_ms = B + (INTERVALS + 1) * IV
        await recorder.flush()
        assert row_counts(history) == (QUEUES + 1, QUEUES + 1)

        # The queries answer single intervals, each as it was sampled.
        rows = await asyncio.to_thread(history.queue_history, "shop", queue=3)
        assert [r.start_ms for r in rows] == [B + k * IV for k in range(INTERVALS + 1)]
        assert {(r.interval_ms, r.intervals, r.covered_ms) for r in rows} == {(IV, 1, IV)}
        assert [r.avg_length for r in rows] == [3.0] * INTERVALS + [4.0]
        assert [r.max_length for r in rows] == [3] * INTERVALS + [4]
        assert sum(r.samples for r in rows) == 12 * (INTERVALS + 1)
        backlog = await asyncio.to_thread(history.consumer_history, "shop", queue=3)
        assert [r.avg_backlog for r in backlog] == [3.0] * INTERVALS + [4.0]
        # A window inside a run finds the run's intervals in it.
        inside = await asyncio.to_thread(
            history.queue_history, "shop", queue=5, since_ms=B + 4 * IV, until_ms=B + 6 * IV
        )
        assert [(r.start_ms, r.avg_length) for r in inside] == [(B + 4 * IV, 5.0), (B + 5 * IV, 5.0)]
        # The console's newest rows: single intervals too, newest first, from a run that began
        # before the window as well (it showed a run as one row, and missed one begun before).
        newest, more = await asyncio.to_thread(
            history.newest_queue_intervals, "shop", topic=None, queue=5, since_ms=B + 4 * IV, limit=3
        )
        assert [(r.start_ms, r.intervals, r.avg_length) for r in newest] == [
            (B + 10 * IV, 1, 5.0), (B + 9 * IV, 1, 5.0), (B + 8 * IV, 1, 5.0),
        ]  # fmt: skip
        assert more
        every, more = await asyncio.to_thread(
            history.newest_queue_intervals, "shop", topic="orders", queue=3, since_ms=B + 8 * IV, limit=10
        )
        assert [(r.start_ms, r.max_length) for r in every] == [
            (B + 10 * IV, 4),
            (B + 9 * IV, 3),
            (B + 8 * IV, 3),
        ]
        assert not more
        await recorder.stop()

    asyncio.run(scenario())


def test_a_consumer_that_stopped_is_diagnosed_from_its_steady_run(tmp_path: Path) -> None:
    """The consumer_down rule needs the newest intervals of a backlog nobody pulls: the most
    steady state there is, now one run."""

    async def scenario() -> None:
        history = QueueStateHistory(tmp_path / "qs.db")
        clock = Clock(B)
        sampler = QueueStateSampler(interval_s=60, sample_every_s=5)
        recorder = QueueStateRecorder(sampler, history, clock=clock, flush_every_s=3600)
        await recorder.start()
        for k in range(8):
            for i in range(12):
                clock.now_ms = B + k * IV + i * 5_000
                sampler.observe_backlog("shop", "billing", "orders", 0, 50, clock.now_ms)
            clock.now_ms = B + (k + 1) * IV
            await recorder.flush(everything=False)  # the flush loop: runs written later
        assert row_counts(history) == (0, 1)
        await recorder.flush()  # what QueueState.health does before it reads
        assert row_counts(history) == (0, 1)
        now = B + 8 * IV + 1
        window = await asyncio.to_thread(history.window, "shop", now - 10 * IV, now)
        assert [r.start_ms for r in window.consumers] == [B + k * IV for k in range(8)]
        health = diagnose(window, now)
        assert [f.rule for f in health.findings] == ["consumer_down"]
        await recorder.stop()
        history.dispose()

    asyncio.run(scenario())


def test_a_run_splits_back_into_equal_intervals() -> None:
    run = ConsumerInterval(
        "p", "c", "t", 0, B, 3 * IV, 9, 9 * 3 * IV, 3 * IV, 37, 6, 3, 3, 3, B + 2 * IV + 50, 3
    )
    pieces = split_run(run)
    assert [p.start_ms for p in pieces] == [B, B + IV, B + 2 * IV]
    assert [p.samples for p in pieces] == [12, 12, 13] and sum(p.pulls for p in pieces) == 6
    assert [p.last_pull_ms for p in pieces] == [B + 50, B + IV + 50, B + 2 * IV + 50]
    assert {(p.interval_ms, p.intervals, p.avg_backlog, p.max_backlog) for p in pieces} == {(IV, 1, 9.0, 9)}
    single = QueueInterval("p", "t", 0, B, IV, 1, IV, IV, 12, None, 0)
    assert split_run(single) == [single]


def test_tables_made_before_runs_get_their_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    _, queues, consumers, *_ = make_tables("mqgate_qstate_")
    with engine.begin() as conn:  # the tables as a gateway before runs made them
        for table in (queues, consumers):
            ddl = str(sa.schema.CreateTable(table).compile(engine))
            conn.execute(sa.text("\n".join(line for line in ddl.splitlines() if "intervals" not in line)))
        conn.execute(
            sa.text(
                "INSERT INTO mqgate_qstate_queues (project, topic, queue, start_ms, interval_ms, max_length, "
                f"length_area, covered_ms, samples, dropped) VALUES ('p','t',0,{B},{IV},2,{2 * IV},{IV},12,0)"
            )
        )
    engine.dispose()
    history = QueueStateHistory(path)
    history.create_schema()
    history.create_schema()  # idempotent
    [old] = history.queue_history("p")
    assert (old.start_ms, old.intervals, old.avg_length) == (B, 1, 2.0)
    history.write(Rollup([QueueInterval("p", "t", 0, B + IV, IV, 2, 2 * IV, IV, 12, None, 0)]))
    assert [r.start_ms for r in history.queue_history("p")] == [B, B + IV]
    history.dispose()


def test_a_run_is_pruned_once_its_last_interval_began_before_the_cutoff(history: QueueStateHistory) -> None:
    run = QueueInterval("p", "t", 0, B, 3 * IV, 2, 2 * 3 * IV, 3 * IV, 36, None, 0, 3)
    history.write(Rollup([run]))
    retention = history.retention_ms
    assert history.prune(B + 2 * IV + retention).queues == 0  # its last interval began at the cutoff
    assert len(history.queue_history("p")) == 3
    assert history.prune(B + 2 * IV + retention + 1).queues == 1
    assert history.queue_history("p") == []
