"""The pipeline's pure parts, tested directly: dispatch, hot keys, flush rule, batch stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqgate.pipeline.aggregate import REASON_AGE, REASON_COUNT, REASON_SHUTDOWN, FlushRule, flush_reason
from mqgate.pipeline.dispatch import (
    partition_tags,
    spark_hash_int,
    spread_of,
    stable_hash,
    task_of,
    worker_of,
    workers_of_task,
)
from mqgate.pipeline.hotkeys import (
    REASON_LOAD,
    REASON_TIME,
    HotKey,
    HotKeyRule,
    KeyTimes,
    hot_keys,
    take_moved,
)
from mqgate.pipeline.parsing import Event


class TestDispatch:
    def test_hash_is_fixed(self) -> None:
        # Pinned values: a change of hash function would move keys between workers of a
        # running pipeline, so it must be a deliberate, visible change.
        assert stable_hash("v1") == 0x1C8A073540FE0BDA
        assert [worker_of(k, 16) for k in ("v1", "v2", "v3", "video-42")] == PINNED

    def test_same_in_other_processes(self) -> None:
        code = (
            "from mqgate.pipeline.dispatch import worker_of\n"
            "print([worker_of(k, 16) for k in ('v1', 'v2', 'v3', 'video-42')])"
        )
        for seed in ("1", "2"):
            out = subprocess.run(
                [sys.executable, "-c", code],
                env={**os.environ, "PYTHONHASHSEED": seed},
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
            assert json.loads(out) == PINNED

    @given(st.text(min_size=1), st.integers(1, 1024))
    def test_worker_in_range_and_stable(self, key: str, n: int) -> None:
        w = worker_of(key, n)
        assert 0 <= w < n and w == worker_of(key, n)

    def test_spread_is_even(self) -> None:
        counts = Counter(spread_of(f"m{i}", 16) for i in range(16_000))
        assert len(counts) == 16 and max(counts.values()) < 1.15 * 1000 and min(counts.values()) > 0.85 * 1000
        keys = Counter(worker_of(f"v{i}", 16) for i in range(16_000))
        assert max(keys.values()) < 1.15 * 1000

    def test_spark_hash_of_ints(self) -> None:
        # Values of Spark's `SELECT hash(v)` for int v (Spark 4.x; the same since Spark 2).
        got = [spark_hash_int(v) for v in (0, 1, -1, 42, 2**31 - 1)]
        assert got == [933211791, -559580957, -1604776387, 29417773, 133916647]

    @pytest.mark.parametrize("tasks", [1, 2, 3, 16, 64])
    def test_partition_tags_name_each_partition_once(self, tasks: int) -> None:
        tags = partition_tags(tasks)
        assert len(set(tags)) == tasks
        assert [spark_hash_int(s) % tasks for s in tags] == list(range(tasks))

    def test_tasks_cover_workers_once(self) -> None:
        for tasks in (1, 2, 3, 16):
            owned = [w for t in range(tasks) for w in workers_of_task(t, tasks, 16)]
            assert sorted(owned) == list(range(16))
            assert all(task_of(w, tasks) == t for t in range(tasks) for w in workers_of_task(t, tasks, 16))


PINNED = [10, 15, 1, 9]


WORKERS = {"a": 0, "b": 0, "s": 0, "c": 1, "d": 2, "e": 3, "f": 3}
RULE = HotKeyRule(partitions=4, min_count=10, min_share=0.05, max_keys=8, time_share=0.5, load_limit=1.25)


def hot(
    counts: dict[str, int], times: dict[str, float] | None = None, rule: HotKeyRule = RULE
) -> list[HotKey]:
    return hot_keys(counts, sum(counts.values()), times or {}, rule, lambda k, n: WORKERS[k])


class TestHotKeys:
    def test_balanced_batch_moves_nothing(self) -> None:
        assert hot({"a": 100, "c": 100, "d": 100, "e": 110}) == []

    def test_overloaded_worker_moves_just_enough_of_its_biggest_key(self) -> None:
        # 400 events over 4 workers: fair share 100, limit 125; worker 0 has 220.
        assert hot({"a": 200, "b": 20, "c": 60, "d": 60, "e": 60}) == [HotKey("a", 200, 95, REASON_LOAD)]

    def test_second_key_moves_when_the_first_is_not_enough(self) -> None:
        # Fair share 250, limit 312.5; worker 0 has 150 + 600 + 10 = 760: moving 448 of its
        # biggest key b is enough.
        assert hot({"a": 150, "b": 600, "s": 10, "c": 100, "d": 100, "e": 40}) == [
            HotKey("b", 600, 448, REASON_LOAD)
        ]
        # Worker 0 with two keys of 300 (limit 192.2 of 615): all of a and 108 of b move.
        counts = {"a": 300, "b": 300, "c": 5, "d": 5, "e": 5}
        assert hot(counts) == [HotKey("a", 300, 300, REASON_LOAD), HotKey("b", 300, 108, REASON_LOAD)]

    def test_small_keys_never_move(self) -> None:
        # Worker 0 carries 90 of 150 events (limit 46.9), but in keys below min_count.
        counts = {"a": 30, "b": 30, "s": 30, "c": 20, "d": 20, "e": 20}
        assert hot(counts, rule=HotKeyRule(4, 40, 0.05, 8, 0.5, 1.25)) == []
        # ... or below min_share of the batch (here 25 %).
        assert hot(counts, rule=HotKeyRule(4, 10, 0.25, 8, 0.5, 1.25)) == []
        assert [h.key for h in hot(counts)] == ["a", "b"]

    def test_processing_time_makes_a_key_hot_whole(self) -> None:
        # f is a fair share by count, but took 60 % of the time in earlier batches.
        counts = {"a": 100, "c": 100, "d": 100, "e": 50, "f": 50}
        assert hot(counts, {"f": 0.6, "a": 0.1}) == [HotKey("f", 50, 50, REASON_TIME)]

    def test_max_keys_keeps_the_most_moved(self) -> None:
        counts = {"a": 300, "b": 300, "c": 5, "d": 5, "e": 5}
        one = HotKeyRule(4, 10, 0.05, 1, 0.5, 1.25)
        assert hot(counts, rule=one) == [HotKey("a", 300, 300, REASON_LOAD)]
        assert hot(counts, rule=HotKeyRule(4, 10, 0.05, 0, 0.5, 1.25)) == []
        assert hot({}) == []

    def test_zipf_batch_ends_with_every_worker_under_the_limit(self) -> None:
        from benchmarks.zipf_events import generate

        work = generate(40_000, keys=1000, zipf_s=1.2, like_share=1.0)
        counts = {key: n for (_, key), n in work.totals.items()}
        rule = HotKeyRule(16, 100, 0.25 / 16, 8, 0.5, 1.25)
        found = hot_keys(counts, 40_000, {}, rule, worker_of)
        assert found[0].key == "v1" and found[0].reason == REASON_LOAD
        moved = {h.key: h.moved for h in found}
        loads = Counter[int]()
        for key, n in counts.items():
            loads[worker_of(key, 16)] += n - moved.get(key, 0)
        assert max(loads.values()) <= 1.25 * 40_000 / 16 + 1
        assert sum(moved.values()) < 0.5 * 40_000  # only the excess moves, not whole keys

    def test_key_times_decay(self) -> None:
        times = KeyTimes(decay=0.5)
        times.add({"a": 4.0, "b": 4.0})
        times.add({"b": 2.0})
        assert times.seconds == {"a": 2.0, "b": 4.0}
        assert times.shares() == pytest.approx({"a": 1 / 3, "b": 2 / 3})
        for _ in range(30):
            times.add({})
        assert times.seconds == {} and times.shares() == {}


FLUSH = FlushRule(count=100, age_s=300)


class TestFlushRule:
    def test_by_count(self) -> None:
        assert flush_reason(100, 0, 1, FLUSH, shutdown=False) == REASON_COUNT
        assert flush_reason(99, 0, 1, FLUSH, shutdown=False) is None

    def test_by_age(self) -> None:
        assert flush_reason(1, 1000, 301_000, FLUSH, shutdown=False) == REASON_AGE
        assert flush_reason(1, 1000, 300_999, FLUSH, shutdown=False) is None

    def test_on_shutdown_everything_goes(self) -> None:
        assert flush_reason(1, 1000, 1001, FLUSH, shutdown=True) == REASON_SHUTDOWN
        assert flush_reason(0, 1000, 1001, FLUSH, shutdown=True) is None


class TestTakeMoved:
    def test_take_moved_moves_about_the_share_and_always_the_same_events(self) -> None:
        def queues() -> dict[int, list[Event]]:
            events = [
                Event(f"m{i}", "like", "hot" if i % 2 else f"k{i}", {}, "{}", 0, "likes") for i in range(4000)
            ]
            return {0: events[:2000], 1: events[2000:]}

        hot = [HotKey("hot", 2000, 500, REASON_LOAD)]
        first = queues()
        moved = take_moved(first, hot)
        assert all(e.key == "hot" for e in moved) and 430 < len(moved) < 570
        assert sum(len(q) for q in first.values()) + len(moved) == 4000
        assert not set(map(id, moved)) & {id(e) for q in first.values() for e in q}
        again = queues()
        assert [e.event_id for e in take_moved(again, hot)] == [e.event_id for e in moved]  # a replay
        assert len(take_moved(queues(), [HotKey("hot", 2000, 2000, REASON_TIME)])) == 2000
