"""The pipeline end to end: a real gateway, PostgreSQL and Spark (`python -m mqgate.pipeline run`).

Each run is its own process (its own JVM), as `mqgate pipeline run` is in production, so it
can be killed with -9 or stopped with SIGTERM.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from benchmarks.zipf_events import Workload, generate, produce

from tests.conftest import Server, wait_until

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("pipeline") / "data").start()
    yield srv
    srv.stop()


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def write_config(path: Path, sections: dict[str, Any]) -> Path:
    lines: list[str] = []
    for name, body in sections.items():
        tables = body if isinstance(body, list) else [body]
        for table in tables:
            lines.append(f"[[{name}]]" if isinstance(body, list) else f"[{name}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Job:
    """One pipeline: its topics on the gateway, its config file, its runs."""

    name: str
    srv: Server
    pg: str
    workdir: Path
    runs: int = 0

    @property
    def sql_url(self) -> str:
        return self.pg.replace("postgresql+psycopg://", "postgresql://")

    def topics(self) -> dict[str, str]:
        return {"like": f"{self.name}-likes", "comment": f"{self.name}-comments"}

    def create_topics(self) -> None:
        for topic in self.topics().values():
            self.srv.admin("POST", "/admin/topics", name=topic, queues=8)
            self.srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)

    def produce(self, work: Workload) -> None:
        topics = self.topics()
        produce(self.srv.url, self.srv.admin_token, f"{topics['like']}-p", work.likes)
        produce(self.srv.url, self.srv.admin_token, f"{topics['comment']}-p", work.comments)

    def config(self, **overrides: dict[str, Any]) -> Path:
        topics = self.topics()
        sections: dict[str, Any] = {
            "job": {
                "name": self.name,
                "gateway": self.srv.url,
                "admin_token": self.srv.admin_token,
                "checkpoint_dir": str(self.workdir / "checkpoints"),
                "partitions": 16,
                "max_messages_per_trigger": 50_000,
                "trigger_interval_s": 0.5,
            },
            "events": [
                {
                    "type": "like",
                    "topic": topics["like"],
                    "key": "video_id",
                    "table": "likes",
                    "fields": {"user_id": "user_id", "ts": "ts"},
                    "types": {"ts": "bigint"},
                },
                {
                    "type": "comment",
                    "topic": topics["comment"],
                    "format": "batch",
                    "key": "video_id",
                    "table": "comments",
                    "fields": {"text": "text"},
                },
            ],
            "hot_keys": {"min_count": 100},
            "retry": {"delay_s": 3, "max_attempts": 2},
            "sink": {"url": self.pg},
        }
        for name, values in overrides.items():
            sections[name] = {**sections.get(name, {}), **values}
        return write_config(self.workdir / "pipeline.toml", sections)

    def start(self, config: Path, available_now: bool = True) -> subprocess.Popen[bytes]:
        self.runs += 1
        log = open(self.workdir / f"run-{self.runs}.log", "ab")  # noqa: SIM115
        command = [sys.executable, "-m", "mqgate.pipeline", "run", str(config)]
        proc = subprocess.Popen(
            [*command, "--available-now"] if available_now else command,
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and Python workers too
        )
        log.close()
        return proc

    def log_tail(self) -> str:
        return self.log_text()[-4000:]

    def log_text(self) -> str:
        return (self.workdir / f"run-{self.runs}.log").read_text(errors="replace")

    def finish(self, proc: subprocess.Popen[bytes], timeout_s: float = RUN_TIMEOUT_S) -> None:
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise AssertionError(f"pipeline still running after {timeout_s}s:\n{self.log_tail()}") from None
        assert code == 0, f"pipeline exited with {code}:\n{self.log_tail()}"

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of `sql`; none while the pipeline has not created its tables yet."""
        with psycopg.connect(self.sql_url) as conn:
            try:
                return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
            except psycopg.errors.UndefinedTable:
                return []

    def applied(self) -> int:
        rows = self.query("SELECT count(*) FROM mqgate_pipeline_ledger")
        return int(rows[0][0]) if rows else 0

    def lag(self, suffix: str) -> int:
        return int(self.srv.admin("GET", f"/admin/consumers/spark-{self.name}-{suffix}/progress")["lag"])


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@pytest.fixture
def job(gateway: Server, pg_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Job]:
    name = request.node.name.removeprefix("test_").replace("_", "-")[:24] + "-" + os.urandom(3).hex()
    j = Job(name, gateway, pg_url, tmp_path)
    j.create_topics()
    yield j


def totals(job: Job, aggregate: bool = False) -> Counter[tuple[str, str]]:
    got: Counter[tuple[str, str]] = Counter()
    for type_name, table in (("like", "likes"), ("comment", "comments")):
        sql = (
            f"SELECT key, count FROM {table}"
            if aggregate
            else f"SELECT key, count(*) FROM {table} GROUP BY key"
        )
        for key, n in job.query(sql):
            got[(type_name, key)] += int(n)
    return got


def test_exactly_once_with_zipf_keys_and_hot_key_isolation(job: Job) -> None:
    work = generate(100_000, keys=1000, zipf_s=1.2, seed=5)
    job.produce(work)
    proc = job.start(job.config())
    job.finish(proc)

    assert totals(job) == work.totals
    assert job.query("SELECT count(*) FROM mqgate_pipeline_ledger") == [(100_000,)]
    assert job.query("SELECT count(*) FROM mqgate_pipeline_dead_letters") == [(0,)]
    # The hottest video was reported and part of its events came through the hot topic,
    # spread over the workers.
    hottest, _ = work.hottest()
    reported = job.query("SELECT key, sum(events), sum(moved) FROM mqgate_pipeline_hot_keys GROUP BY key")
    assert hottest in {key for key, _, moved in reported if moved > 0}, reported
    via_hot = job.query(
        "SELECT count(*) FROM (SELECT source, key FROM likes UNION ALL SELECT source, key FROM comments) t "
        "WHERE source = %s AND key = %s",
        f"{job.name}-hot",
        hottest,
    )[0][0]
    # Which events of a hot key move is chosen by a hash of the event id, so the number
    # moved is the rule's target only approximately.
    moved = sum(int(m) for key, _, m in reported if key == hottest)
    assert via_hot > 0 and abs(via_hot - moved) <= 0.05 * moved, (via_hot, moved)
    assert f"hot keys {hottest} (" in job.log_text()
    # Offsets were committed after the sink: every group of the job has nothing left.
    for suffix in ("like", "comment", "hot", "retry"):
        assert job.lag(suffix) == 0, suffix


def test_kill_9_at_a_random_point_then_run_again(job: Job) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    work = generate(12_000, keys=300, zipf_s=1.2, seed=seed)
    job.produce(work)
    config = job.config(
        job={"mode": "aggregate", "max_messages_per_trigger": 4000},
        aggregate={"count": 500, "age_s": 3600},
    )
    proc = job.start(config)
    target = rng.randrange(1, 8_000)
    try:
        wait_until(
            lambda: proc.poll() is not None or job.applied() >= target,
            RUN_TIMEOUT_S,
            f"{target} events applied (seed {seed})",
            interval_s=0.1,
        )
    finally:
        kill_group(proc)
    assert proc.returncode == -signal.SIGKILL, (
        f"the run ended before the kill (seed {seed}):\n{job.log_tail()}"
    )
    applied = job.applied()
    assert applied < work.events, f"seed {seed}"

    job.finish(job.start(config))
    assert totals(job, aggregate=True) == work.totals, f"seed {seed}, killed after {applied} events"
    assert job.query("SELECT count(*) FROM mqgate_pipeline_pending") == [(0,)]
    reasons = {r for (r,) in job.query("SELECT DISTINCT reason FROM mqgate_pipeline_flushes")}
    assert reasons <= {"count", "shutdown"} and "shutdown" in reasons
    for suffix in ("like", "comment", "hot", "retry"):
        assert job.lag(suffix) == 0, suffix


def ms_now(job: Job) -> int:
    return int(job.query("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint")[0][0])


def test_retry_dead_letters_and_aggregate_flushes_until_sigterm(job: Job) -> None:
    likes = [("big", 120), ("small", 5), ("flaky", 3), ("doom", 2)]
    config = job.config(
        job={"mode": "aggregate"},
        hot_keys={"enabled": False},
        sink={"fail_keys": ["flaky"], "fail_always_keys": ["doom"]},
        aggregate={"count": 50, "age_s": 6},
    )
    proc = job.start(config, available_now=False)
    try:
        messages = [{"message": json.dumps({"video_id": k, "ts": i})} for k, n in likes for i in range(n)]
        messages.append({"message": "not json"})
        job.produce(Workload(likes=messages))

        # The first attempt of "flaky" failed: it waits in the retry topic for delay_s (3 s).
        def retried() -> list[tuple[Any, ...]]:
            return job.query(
                "SELECT due_ms FROM mqgate_pipeline_retries WHERE type = 'like' AND attempts = 1"
            )

        recorded = wait_until(lambda: len(rows := retried()) >= 3 and rows, RUN_TIMEOUT_S, "retries recorded")
        due_ms = min(r[0] for r in recorded)
        flaky_sql = (
            "SELECT attempts, (extract(epoch from applied_at) * 1000)::bigint "
            "FROM mqgate_pipeline_ledger WHERE key = 'flaky'"
        )
        while ms_now(job) < due_ms - 300:
            assert job.query(flaky_sql) == [], "a failed event came back before its retry delay"
            time.sleep(0.2)
        applied = wait_until(
            lambda: len(job.query(flaky_sql)) == 3 and job.query(flaky_sql), 60, "flaky retried"
        )
        assert all(attempts == 2 and at_ms >= due_ms - 50 for attempts, at_ms in applied), (applied, due_ms)

        # "doom" fails every time: after max_attempts (2) it is a dead letter, as is the
        # message that is not JSON (at once, attempts 0).
        def dead() -> list[tuple[Any, ...]]:
            return job.query("SELECT attempts, error FROM mqgate_pipeline_dead_letters ORDER BY attempts")

        rows = wait_until(lambda: len(dead()) == 3 and dead(), 60, "three dead letters")
        assert rows[0][0] == 0 and rows[0][1].startswith("parse:")
        assert [r[0] for r in rows[1:]] == [2, 2] and all("CheckViolation" in r[1] for r in rows[1:])

        # Aggregates: "big" (120 >= 50) is flushed by count, the small ones by age (6 s).
        def flushes() -> dict[str, set[str]]:
            out: dict[str, set[str]] = {}
            for key, reason in job.query("SELECT key, reason FROM mqgate_pipeline_flushes"):
                out.setdefault(key, set()).add(reason)
            return out

        wait_until(lambda: {"big", "small", "flaky"} <= flushes().keys(), 60, "flushes of big, small, flaky")
        got = flushes()
        assert "count" in got["big"] and got["small"] == {"age"} and got["flaky"] == {"age"}, got

        # A last few events, then SIGTERM: the pipeline stops and flushes them on the way out.
        job.produce(Workload(likes=[{"message": json.dumps({"video_id": "late"})} for _ in range(3)]))
        late = "SELECT count(*) FROM mqgate_pipeline_pending WHERE key = 'late'"
        wait_until(lambda: job.query(late) == [(1,)], 60, "late events pending")
        proc.send_signal(signal.SIGTERM)
        job.finish(proc, timeout_s=90)
    finally:
        kill_group(proc)
    assert flushes()["late"] == {"shutdown"}
    assert dict(job.query("SELECT key, count FROM likes")) == {"big": 120, "small": 5, "flaky": 3, "late": 3}
    assert job.query("SELECT count(*) FROM mqgate_pipeline_pending") == [(0,)]
    assert job.lag("retry") == 0 and job.lag("like") == 0
