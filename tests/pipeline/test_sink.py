"""The PostgreSQL sink against the real server: ledger, isolation, dead letters, aggregates."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from mqgate.pipeline.config import PipelineConfig, parse_config
from mqgate.pipeline.executor import drain
from mqgate.pipeline.hotkeys import HotKey
from mqgate.pipeline.parsing import Event, ParseFailure
from mqgate.pipeline.schema import create_tables
from mqgate.pipeline.sink import Sink


def make_config(pg_url: str, mode: str = "concurrent", **sink: Any) -> PipelineConfig:
    raw: dict[str, Any] = {
        "job": {"name": "sinktest", "gateway": "http://127.0.0.1:1", "admin_token": "t", "mode": mode},
        "events": [
            {
                "type": "like",
                "topic": "likes",
                "key": "video",
                "table": "likes",
                "fields": {"user": "user", "n": "n"},
                "types": {"n": "bigint"},
            },
            {"type": "comment", "topic": "comments", "format": "batch", "key": "video", "table": "comments"},
        ],
        "retry": {"max_attempts": 3},
        "sink": {"url": pg_url, **sink},
        "aggregate": {"count": 5, "age_s": 3600},
    }
    return parse_config(raw, {})


def like(i: int, key: str = "v1", n: str | None = "1", attempts: int = 1, source: str = "likes") -> Event:
    return Event(f"m{i}", "like", key, {"user": f"u{i}", "n": n}, f'{{"i":{i}}}', 1000 + i, source, attempts)


def comment(i: int, key: str = "v1") -> Event:
    return Event(f"c{i}#0", "comment", key, {}, "{}", 1000 + i, "comments")


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as c:
        yield c


def setup(conn: psycopg.Connection[Any], config: PipelineConfig) -> Sink:
    create_tables(conn, config)
    create_tables(conn, config)  # idempotent
    return Sink(config)


def rows(conn: psycopg.Connection[Any], query: str) -> list[tuple[Any, ...]]:
    return conn.execute(query).fetchall()  # type: ignore[arg-type]


def test_replay_and_other_paths_write_once(conn: psycopg.Connection[Any], pg_url: str) -> None:
    sink = setup(conn, make_config(pg_url))
    events = [like(i, key=f"v{i % 3}") for i in range(10)] + [comment(1)]
    first = sink.apply_chunk(conn, events)
    assert len(first.applied) == 11 and first.duplicates == 0 and first.failed == []
    # The same events again, and via the hot and retry topics: nothing is written twice.
    again = sink.apply_chunk(conn, [*events[:5], like(7, key="v1", source="vid-hot"), like(8, attempts=2)])
    assert again.applied == [] and again.duplicates == 7
    assert rows(conn, "SELECT count(*), count(DISTINCT event_id), sum(n) FROM likes") == [(10, 10, 10)]
    assert rows(conn, "SELECT key, count(*) FROM likes GROUP BY key ORDER BY key") == [
        ("v0", 4),
        ("v1", 3),
        ("v2", 3),
    ]
    assert rows(conn, "SELECT event_id, key FROM comments") == [("c1#0", "v1")]
    assert rows(conn, "SELECT count(*) FROM mqgate_pipeline_ledger WHERE job = 'sinktest'") == [(11,)]


def test_data_errors_are_isolated_to_their_rows(conn: psycopg.Connection[Any], pg_url: str) -> None:
    sink = setup(conn, make_config(pg_url))
    events = [like(i, n="not a number" if i in (3, 11) else str(i)) for i in range(20)]
    result = sink.apply_chunk(conn, events)
    assert sorted(e.event_id for e, _ in result.failed) == ["m11", "m3"]
    assert all("InvalidTextRepresentation" in err for _, err in result.failed)
    assert len(result.applied) == 18
    # The failed rows left no ledger entry, so a corrected retry is applied.
    assert rows(conn, "SELECT count(*) FROM likes") == [(18,)]
    assert len(sink.apply_chunk(conn, [like(3, n="3", attempts=2)]).applied) == 1


def test_injected_failures_are_real_check_violations(conn: psycopg.Connection[Any], pg_url: str) -> None:
    sink = setup(conn, make_config(pg_url, fail_keys=["bad"], fail_always_keys=["doom"]))
    events = [like(i, key="bad" if i % 4 == 0 else "doom" if i == 5 else "ok") for i in range(12)]
    result = sink.apply_chunk(conn, events)
    assert sorted(e.event_id for e, _ in result.failed) == ["m0", "m4", "m5", "m8"]
    assert all("CheckViolation" in err for _, err in result.failed)
    assert len(sink.apply_chunk(conn, [like(5, key="doom", attempts=4)]).failed) == 1
    assert len(sink.apply_chunk(conn, [like(0, key="bad", attempts=2)]).applied) == 1
    assert rows(conn, "SELECT count(*) FROM mqgate_pipeline_fault_probe") == [(0,)]


def test_share_knob_is_deterministic(pg_url: str) -> None:
    sink = Sink(make_config(pg_url, fail_first_attempt_share=0.25))
    doomed = [sink.should_fail(like(i)) for i in range(4000)]
    assert 800 < sum(doomed) < 1200
    assert doomed == [sink.should_fail(like(i)) for i in range(4000)]
    assert not any(sink.should_fail(like(i, attempts=2)) for i in range(4000))


def test_lost_connection_fails_the_whole_chunk_not_the_worker(pg_url: str) -> None:
    config = make_config(pg_url.rsplit("/", 1)[0] + "/mqgate_no_such_database")
    result = drain(Sink(config), 0, [like(i) for i in range(7)], batch_rows=3, cost_ms=0)
    assert len(result.failed) == 7 and result.applied == 0
    assert "OperationalError" in result.failed[0][1]


def test_dead_letters_and_retry_bookkeeping(conn: psycopg.Connection[Any], pg_url: str) -> None:
    sink = setup(conn, make_config(pg_url))
    failure = ParseFailure("p1", "like", "garbage", "parse: body is not JSON", "likes")
    assert (
        sink.dead_letter(conn, [(like(1, attempts=3), "CheckViolation", 3), (failure, failure.error, 0)]) == 2
    )
    sink.dead_letter(conn, [(like(1, attempts=3), "again", 3)])  # replay: no second row
    assert rows(conn, "SELECT event_id, attempts, error FROM mqgate_pipeline_dead_letters ORDER BY 1") == [
        ("m1", 3, "CheckViolation"),
        ("p1", 0, "parse: body is not JSON"),
    ]
    sink.record_retries(conn, [(like(5), "e1"), (like(6), "e1")], due_ms=123)
    assert sink.pending_retries(conn) == 2
    # Event 5 failed again on attempt 2 (recorded first), event 6 succeeded on attempt 2.
    sink.record_retries(conn, [(like(5, attempts=2), "e2")], due_ms=456)
    sink.forget_retries(conn, [like(5, attempts=2), like(6, attempts=2)])
    assert rows(conn, "SELECT event_id, attempts, due_ms FROM mqgate_pipeline_retries") == [("m5", 2, 456)]
    sink.forget_retries(conn, [like(5, attempts=3)])
    assert sink.pending_retries(conn) == 0


def test_hot_key_report(conn: psycopg.Connection[Any], pg_url: str) -> None:
    sink = setup(conn, make_config(pg_url))
    hot = [HotKey("v1", 500, 380, "load"), HotKey("v2", 120, 120, "time")]
    sink.record_hot_keys(conn, "like", 7, hot)
    sink.record_hot_keys(conn, "like", 7, hot)  # a replayed batch
    assert rows(
        conn, "SELECT batch_id, key, events, moved, reason FROM mqgate_pipeline_hot_keys ORDER BY key"
    ) == [
        (7, "v1", 500, 380, "load"),
        (7, "v2", 120, 120, "time"),
    ]


def test_aggregates_exactly_once_and_flush_reasons(conn: psycopg.Connection[Any], pg_url: str) -> None:
    sink = setup(conn, make_config(pg_url, mode="aggregate"))
    events = [like(i, key="big") for i in range(6)] + [like(10 + i, key="small") for i in range(2)]
    assert len(sink.apply_chunk(conn, events).applied) == 8
    assert sink.apply_chunk(conn, events).duplicates == 8  # replay adds nothing
    assert sink.flush_pending(conn) == [("like", "big", 6, "count")]
    assert rows(conn, "SELECT key, count FROM likes") == [("big", 6)]
    conn.execute("UPDATE mqgate_pipeline_pending SET first_ms = first_ms - 3600 * 1000")
    sink.apply_chunk(conn, [like(20, key="late"), comment(1, key="v9")])
    flushed = sink.flush_pending(conn)
    assert flushed == [("like", "small", 2, "age")]
    assert sorted(sink.flush_pending(conn, shutdown=True)) == [
        ("comment", "v9", 1, "shutdown"),
        ("like", "late", 1, "shutdown"),
    ]
    assert rows(conn, "SELECT key, count FROM likes ORDER BY key") == [("big", 6), ("late", 1), ("small", 2)]
    assert rows(conn, "SELECT key, count FROM comments") == [("v9", 1)]
    assert rows(conn, "SELECT count(*) FROM mqgate_pipeline_pending") == [(0,)]
    assert rows(conn, "SELECT reason, sum(count) FROM mqgate_pipeline_flushes GROUP BY 1 ORDER BY 1") == [
        ("age", 2),
        ("count", 6),
        ("shutdown", 2),
    ]


def test_one_event_twice_in_a_chunk_counts_once(conn: psycopg.Connection[Any], pg_url: str) -> None:
    """The hot topic may hold two copies of an event (produced before a crash and again by
    the replay), and both may land in one chunk."""
    sink = setup(conn, make_config(pg_url, mode="aggregate"))
    result = sink.apply_chunk(conn, [like(1, key="v"), like(2, key="v"), like(1, key="v", source="x-hot")])
    assert len(result.applied) == 2 and result.duplicates == 1
    assert sink.flush_pending(conn, shutdown=True) == [("like", "v", 2, "shutdown")]


def test_concurrent_workers_on_one_hot_key(conn: psycopg.Connection[Any], pg_url: str) -> None:
    """Hot events of one key spread over many workers: pending counts and flushes while
    workers write stay exact, with no deadlock."""
    sink = setup(conn, make_config(pg_url, mode="aggregate"))
    per_worker = 400
    flushed: list[int] = []

    def worker(w: int) -> None:
        events = [like(w * per_worker + i, key=("hot" if i % 2 else f"k{i % 7}")) for i in range(per_worker)]
        result = drain(sink, w, events, batch_rows=25, cost_ms=0)
        assert result.failed == [] and result.applied == per_worker

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        flushed += [c for _, _, c, _ in sink.flush_pending(conn)]
    for t in threads:
        t.join()
    flushed += [c for _, _, c, _ in sink.flush_pending(conn, shutdown=True)]
    assert sum(flushed) == 8 * per_worker
    assert rows(conn, "SELECT sum(count) FROM likes") == [(8 * per_worker,)]
    assert rows(conn, "SELECT count FROM likes WHERE key = 'hot'") == [(8 * per_worker // 2,)]


def test_an_executor_process_opens_at_most_max_connections_sessions(pg_url: str) -> None:
    sink = Sink(make_config(pg_url, max_connections=2))
    lock = threading.Lock()
    in_use = peak = done = 0
    backends: set[int] = set()

    def work() -> None:
        nonlocal in_use, peak, done
        for _ in range(5):
            with sink.connection() as c:
                with lock:
                    in_use += 1
                    peak = max(peak, in_use)
                backends.add(c.execute("SELECT pg_backend_pid(), pg_sleep(0.01)").fetchone()[0])
                with lock:
                    in_use -= 1
        with lock:
            done += 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert done == 8
    assert peak == 2  # the workers did overlap, and never past the limit
    assert len(backends) <= 2  # sessions are reused, not opened per chunk
