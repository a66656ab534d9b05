"""mqgate on a real Spark standalone cluster (issue 15, item 4; SPEC D4): a master and two
workers started from the installed PySpark on free 127.0.0.1 ports (tests/spark/cluster.py),
once for the module. A batch read, a streaming copy and the event pipeline run on it and give
what they give on local[*], and they did run on the workers: the master lists the
application as FINISHED, each worker's work directory holds an executor of it with the
shipped mqgate.zip, and the tasks ran in those directories, importing mqgate from the zip,
in a Python that has the dependencies but not mqgate. The driver's own Python workers (the
data source planners, streaming ones included) run that Python too, and nothing in the
driver's environment provides mqgate: only the shipped code can (tests/spark/cluster.py).

The three jobs run in one driver process per master (a JVM holds one SparkContext; the
suite's local session stays as it is), the local[*] one alongside the cluster's start-up
and the cluster's driver, so the module takes about as long as the cluster run.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from benchmarks.zipf_events import Workload, generate
from benchmarks.zipf_events import produce as produce_events

from tests.conftest import PG_ADMIN_URL, Server, require_service
from tests.pipeline.test_end_to_end import write_config
from tests.spark.cluster import (
    Driver,
    SparkCluster,
    executor_python,
    mqgate_path,
    require_spark,
    start_driver,
)
from tests.spark.conftest import produce, read_all, unique

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    require_spark()
    started = time.monotonic()
    c = SparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    print(f"\nSpark standalone cluster up in {time.monotonic() - started:.1f}s at {c.url}")
    try:
        yield c
    finally:
        c.stop()
    assert all(p.poll() is not None for p in c.procs.values())


@pytest.fixture(scope="module")
def executor_py(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return executor_python(tmp_path_factory.mktemp("executor-python"))


def assert_ran_on_workers(cluster: SparkCluster, app_id: str) -> set[Path]:
    """The master finished `app_id` with 2 cores; each worker ran an executor of it that fetched
    the shipped mqgate.zip. Returns the executors' directories."""
    app = cluster.finished_app(app_id=app_id)
    assert app["cores"] == 2, app
    per_worker = cluster.executor_dirs(app_id)
    assert all(dirs for dirs in per_worker.values()), per_worker
    executor_dirs = {d.resolve() for dirs in per_worker.values() for d in dirs}
    for d in executor_dirs:
        assert (d / "mqgate.zip").is_file(), f"{d} has no shipped mqgate.zip"
    # The executors' own logs (INFO, unlike the driver's): tasks finished in them.
    logs = [(d / "stderr").read_text(errors="replace") for d in executor_dirs]
    assert sum(log.count("Finished task") for log in logs) > 0
    return executor_dirs


@dataclass
class Runs:
    """What the jobs were given, and the results of the driver on local[*] and on the cluster."""

    read_topic: str
    read_sent: int
    copy_sent: list[tuple[str, list[str], list[str], dict[str, str]]]
    targets: dict[str, str]
    pipeline_work: Workload
    pipeline_jobs: dict[str, str]
    databases: dict[str, str]
    workdir: Path
    local: dict[str, Any]
    remote: dict[str, Any]

    def result(self, where: str, job: str) -> dict[str, Any]:
        run = self.local if where == "local" else self.remote
        return run["results"][JOBS.index(job)]  # type: ignore[no-any-return]


JOBS = ["read", "copy", "pipeline"]


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    """A fresh PostgreSQL database per run (the type tables are not keyed by job), dropped after."""
    require_service("127.0.0.1", 5432, "PostgreSQL")
    names = {where: f"mqgate_{uuid.uuid4().hex[:10]}" for where in ("local", "cluster")}
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        for name in names.values():
            conn.execute(f"CREATE DATABASE {name}")
    yield {where: f"postgresql://postgres@127.0.0.1:5432/{name}" for where, name in names.items()}
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        for name in names.values():
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def read_messages() -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    for i in range(3000):
        m: dict[str, Any] = {"message": f"m{i} ü", "keys": [f"k{i % 97}"]}
        if i % 3 == 0:
            m["tags"] = ["a", f"t{i % 5}"]
        if i % 5 == 0:
            m["properties"] = {"n": str(i)}
        if i % 7 == 0:
            m["priority"] = 1
        if i % 11 == 0:
            m["ttlMs"] = 3_600_000
        sent.append(m)
    return sent


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest,
    executor_py: Path,
    gateway: Server,
    databases: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Runs:
    """The read, copy and pipeline jobs, in one driver on local[*] and one on the cluster, each
    with topics, consumer groups and a database of its own where it writes."""
    work = tmp_path_factory.mktemp("spark-jobs")
    read_topic = unique("cluster-read")
    gateway.admin("POST", "/admin/topics", name=read_topic, queues=3, maxPriority=1)
    gateway.admin("POST", "/admin/producers", name=f"{read_topic}-p", topic=read_topic)
    sent = read_messages()
    produce(gateway, f"{read_topic}-p", sent)

    source = unique("cluster-copy")
    gateway.setup_topic(source, queues=4)
    copy_sent = [
        (f"c{i}", [f"k{i % 13}"], ["x"] if i % 2 else [], {"i": str(i)} if i % 3 else {}) for i in range(2000)
    ]
    produce(
        gateway,
        f"{source}-p",
        [{"message": b, "keys": k, "tags": t, "properties": p} for b, k, t, p in copy_sent],
    )

    pipeline_work = generate(4000, keys=200, zipf_s=1.2, seed=15)
    base = unique("cluster-pipe")
    topics = {"like": f"{base}-likes", "comment": f"{base}-comments"}
    for type_name, topic in topics.items():
        gateway.admin("POST", "/admin/topics", name=topic, queues=4)
        gateway.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)
        produce_events(
            gateway.url, gateway.admin_token, f"{topic}-p", getattr(pipeline_work, f"{type_name}s")
        )

    targets, pipeline_jobs = {}, {}
    for where in ("local", "cluster"):
        targets[where] = f"{source}-to-{where}"
        gateway.setup_topic(targets[where], queues=3)
        gateway.admin("POST", "/admin/consumers", name=f"spark-{targets[where]}", topic=source)
        pipeline_jobs[where] = f"{base}-{where}"

    def jobs(where: str) -> list[tuple[str, dict[str, Any]]]:
        common = {"gateway": gateway.url, "token": gateway.admin_token}
        copy = {
            "source": source,
            "producer": f"{targets[where]}-p",
            "consumer": f"spark-{targets[where]}",
            "workdir": str(work / where / "copy"),
        }
        config = pipeline_config(
            work / where / "pipeline", pipeline_jobs[where], gateway, topics, databases[where]
        )
        return [
            ("read", {**common, "topic": read_topic}),
            ("copy", {**common, **copy}),
            ("pipeline", {"config": str(config)}),
        ]

    # local[*] needs no cluster: its driver runs while the cluster starts and runs its own.
    started = time.monotonic()
    drivers: list[Driver] = []
    try:
        drivers.append(start_driver(jobs("local"), "local[*]", work / "local", None))
        cluster: SparkCluster = request.getfixturevalue("cluster")
        drivers.append(start_driver(jobs("cluster"), cluster.url, work / "cluster", executor_py))
        local, remote = (d.result() for d in drivers)
    finally:
        for d in drivers:
            d.stop()
    print(f"\nboth drivers done {time.monotonic() - started:.1f}s after the local one started")
    for where, r in (("local[*]", local), ("cluster", remote)):
        took = ", ".join(f"{job} {res['seconds']:.1f}s" for job, res in zip(JOBS, r["results"], strict=True))
        print(f"{where} driver: {r['seconds']:.1f}s (session {r['started']:.1f}s, {took})")
    return Runs(
        read_topic,
        len(sent),
        copy_sent,
        targets,
        pipeline_work,
        pipeline_jobs,
        databases,
        work,
        local,
        remote,
    )


def test_the_jobs_ran_on_the_workers_with_the_shipped_code(
    runs: Runs, cluster: SparkCluster, executor_py: Path
) -> None:
    remote, local = runs.remote, runs.local
    executor_dirs = assert_ran_on_workers(cluster, remote["appId"])
    probe = remote["probe"]
    assert len(probe["executors"]) == 2, probe
    for task in probe["tasks"]:
        cwd = Path(task["cwd"]).resolve()
        assert cwd in executor_dirs, task
        # Imported from the zip its executor fetched (not the driver's, whose path the Python
        # functions' PYTHONPATH also lists).
        assert Path(task["mqgate"]).resolve() == cwd / "mqgate.zip" / "mqgate" / "__init__.py", task
        assert task["python"] == str(executor_py), task
    # The data source's read tasks ran in the executors' directories on the workers; on
    # local[*] in the driver's process, with the driver's mqgate.
    ran_in = {Path(d).resolve() for d in runs.result("cluster", "read")["ranIn"]}
    assert ran_in and ran_in <= executor_dirs, ran_in
    assert local["probe"]["executors"] == []
    assert runs.result("local", "read")["ranIn"] == [str(runs.workdir / "local")]
    assert {Path(t["mqgate"]).resolve().parent.parent for t in local["probe"]["tasks"]} == {mqgate_path()}


def test_batch_read_on_the_cluster_gives_the_rows_of_local(runs: Runs, gateway: Server) -> None:
    local, remote = runs.result("local", "read")["rows"], runs.result("cluster", "read")["rows"]
    assert len(remote) == runs.read_sent
    assert remote == local
    truth = read_all(gateway, runs.read_topic)
    assert sorted((r["messageId"], r["body"]) for r in remote) == sorted(
        (m["messageId"], m["message"]) for m in truth
    )
    assert {r["queue"] for r in remote} == set(range(6))  # priority lane 1: store queues 3..5
    assert sum(1 for r in remote if r["deadline"] is not None) == len(range(0, 3000, 11))
    print(f"\nbatch read: {len(local)} rows on local[*], {len(remote)} on the cluster, equal in every column")


def test_streaming_copy_on_the_cluster_gives_the_copy_of_local(runs: Runs, gateway: Server) -> None:
    local, remote = runs.result("local", "copy"), runs.result("cluster", "copy")
    # Same micro-batches (700 messages, cut over the queues by backlog), every message once.
    assert remote["batches"] == local["batches"] and sum(remote["batches"]) == len(runs.copy_sent)
    assert remote["batches"] == [700, 700, 600]
    print(f"\ncopy micro-batches on local[*] {local['batches']}, on the cluster {remote['batches']}")

    def copied(where: str) -> list[tuple[str, list[str], list[str], dict[str, str]]]:
        stored = read_all(gateway, runs.targets[where])
        return sorted((m["message"], m["keys"], m["tags"], m["properties"]) for m in stored)

    assert copied("cluster") == copied("local") == sorted(runs.copy_sent)
    for where in ("local", "cluster"):
        consumer = f"spark-{runs.targets[where]}"
        assert gateway.admin("GET", f"/admin/consumers/{consumer}/progress")["lag"] == 0, where


# --- the event pipeline ----------------------------------------------------------------------


def pipeline_config(path: Path, job: str, gateway: Server, topics: dict[str, str], db: str) -> Path:
    path.mkdir(parents=True)
    return write_config(
        path / "pipeline.toml",
        {
            "job": {
                "name": job,
                "gateway": gateway.url,
                "admin_token": gateway.admin_token,
                "checkpoint_dir": str(path / "checkpoints"),  # one machine: a shared file system
                "partitions": 8,
                # Independent of the core count, so both runs cut and spread alike: one batch
                # per event type, 2 worker tasks.
                "tasks": 2,
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
            # Hot keys by load only (by measured time would depend on the machine's speed).
            "hot_keys": {"min_count": 50, "time_share": 0},
            "sink": {"url": db},
        },
    )


def tables(db: str, job: str) -> dict[str, Any]:
    """What the pipeline wrote, with the job's own name (in the hot topic's) taken out."""
    with psycopg.connect(db) as conn:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            found = conn.execute(sql).fetchall()  # type: ignore[arg-type]
            return sorted(tuple("<job>-hot" if v == f"{job}-hot" else v for v in row) for row in found)

        return {
            "likes": rows("SELECT event_id, key, user_id, ts, payload, attempts, source FROM likes"),
            "comments": rows("SELECT event_id, key, text, payload, attempts, source FROM comments"),
            "ledger": rows("SELECT type, source, count(*) FROM mqgate_pipeline_ledger GROUP BY 1, 2"),
            "hot_keys": rows("SELECT type, key, events, moved, reason FROM mqgate_pipeline_hot_keys"),
            "dead_letters": rows("SELECT count(*) FROM mqgate_pipeline_dead_letters"),
        }


def test_event_pipeline_on_the_cluster_gives_the_tables_of_local(runs: Runs, gateway: Server) -> None:
    """The same events through two jobs of their own (consumer groups, hot and retry topics,
    databases): one on local[*], one on the cluster; the tables must match row for row."""
    results: dict[str, dict[str, Any]] = {}
    for where, job in runs.pipeline_jobs.items():
        summary = runs.result(where, "pipeline")
        print(f"\npipeline on {where}: {summary['seconds']:.1f}s, {summary}")
        results[where] = tables(runs.databases[where], job)
        for suffix in ("like", "comment", "hot", "retry"):
            lag = gateway.admin("GET", f"/admin/consumers/spark-{job}-{suffix}/progress")["lag"]
            assert lag == 0, (where, suffix)

    local, remote = results["local"], results["cluster"]
    totals: Counter[tuple[str, str]] = Counter()
    for type_name, table in (("like", "likes"), ("comment", "comments")):
        totals.update((type_name, row[1]) for row in remote[table])
    assert totals == runs.pipeline_work.totals
    assert remote["dead_letters"] == [(0,)]
    # Part of the hottest videos' events took the hot path (produced by executors, read
    # back by the hot query), on both.
    assert any(source == "<job>-hot" for _, source, _ in remote["ledger"]), remote["ledger"]
    assert remote["hot_keys"]
    for name in ("likes", "comments", "ledger", "hot_keys", "dead_letters"):
        assert remote[name] == local[name], name
    print(
        f"pipeline tables, the same on both: likes {len(remote['likes'])}, comments "
        f"{len(remote['comments'])}, ledger {remote['ledger']}, hot keys {len(remote['hot_keys'])}"
    )
