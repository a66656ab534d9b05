"""A Spark standalone cluster for the tests, and a driver that runs jobs on any master.

`SparkCluster` starts a master and workers from the installed PySpark
(`$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master` / `...deploy.worker.Worker`,
SPARK_HOME = the pyspark package directory) on free 127.0.0.1 ports, each in a process group of
its own (the workers' executors and their Python workers join it), waits for the master's
JSON (`/json/`) to list every worker ALIVE, and stops them by process group.

`executor_python` makes the Python the executors run: a venv that sees the running
interpreter's site-packages (pyspark, pyarrow, httpx, psycopg...) but not the project, whose
editable install is a `.pth` file that a path listed in another `.pth` does not process. On it,
a task can import mqgate only from the zip `mqgate.spark.session()` ships to the executors.

`start_driver` runs jobs of this module (read, copy, pipeline) in a driver process of its own
with its own JVM, as `spark-submit` would: the test process keeps the suite's local
SparkSession, and a JVM holds one SparkContext at a time. A cluster driver's environment
gives mqgate to no Python process (`driver_env`), so the jobs work only if the code is shipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import site
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, ROOT, free_port, wait_until

START_TIMEOUT_S = 120.0  # two cores shared with the gateway and PostgreSQL: JVMs start slowly
DRIVER_TIMEOUT_S = 240.0
# Environment the cluster must not inherit: with the test's PYTHONPATH the executors would
# import mqgate from the source tree instead of the shipped zip.
NOT_INHERITED = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR", "CLASSPATH")
# Every JVM of the test (master, workers, drivers, executors) lives a minute or two: the C1
# compiler alone and the serial collector spend a fraction of the CPU the default tiered
# compilation and G1 threads do there, on a machine of 2 cores.
SHORT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SHORT_JVM_CONF = {"spark.driver.extraJavaOptions": SHORT_JVM, "spark.executor.extraJavaOptions": SHORT_JVM}


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def require_spark() -> None:
    """Fail in CI, skip loudly elsewhere, when Java or PySpark's launcher is missing."""
    missing = []
    if not os.environ.get("JAVA_HOME") and not any(
        Path(d, "java").is_file() for d in os.environ.get("PATH", "").split(os.pathsep)
    ):
        missing.append("Java (java on PATH or JAVA_HOME)")
    try:
        if not (spark_home() / "bin" / "spark-class").is_file():
            missing.append("pyspark's bin/spark-class")
    except ImportError:
        missing.append("pyspark")
    if missing:
        message = "a Spark standalone cluster needs " + " and ".join(missing)
        if IN_CI:
            pytest.fail(message + " (required in CI)")
        pytest.skip("SKIPPED LOUDLY: " + message)


def cluster_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    # SPARK_LOCAL_IP also binds the web UIs, which otherwise listen on 0.0.0.0.
    return {
        **env,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_JAVA_OPTS": SHORT_JVM,
    }


def mqgate_path() -> Path:
    """The directory the test process imports mqgate from (this checkout's src/)."""
    import mqgate

    return Path(mqgate.__file__).resolve().parent.parent


def python_command(module: str, *args: str) -> list[str]:
    """`python -m module args` with this checkout's tests and the test process's mqgate first on
    sys.path, put there by the process itself, not by PYTHONPATH: a driver's JVM passes its
    PYTHONPATH on to the Python workers it starts (the data source planners)."""
    bootstrap = (
        f"import runpy, sys; sys.path[:0] = {[str(ROOT), str(mqgate_path())]!r}; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", bootstrap, *args]


def driver_env(python: Path | None) -> dict[str, str]:
    """A driver's environment. local[*] (`python` None): its Python workers run this
    interpreter and import mqgate from where the test process does, as from an installed
    mqgate. On a cluster nothing in it provides mqgate: no PYTHONPATH, and `python` (the
    executors' and the driver's Python workers') does not have it, so every Python process
    Spark starts, on the driver as on the executors, can only import the shipped code."""
    env = {**cluster_env(), "PYSPARK_PYTHON": str(python or sys.executable)}
    if python is None:
        env["PYTHONPATH"] = str(mqgate_path())
    return env


def executor_python(directory: Path) -> Path:
    """A Python with the project's dependencies and without the project (see the module doc)."""
    venv = directory / "executor-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site_dir,) = (venv / "lib").glob("python*/site-packages")
    (site_dir / "mqgate-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import pyarrow, pyspark, psycopg, httpx, msgspec\nimport mqgate"],
        env=cluster_env(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'mqgate'" in probe.stderr, (
        "the executors' Python must have the dependencies but not mqgate, so that only the "
        f"shipped zip can provide it; got: {probe.stderr[-1500:]!r}"
    )
    return python


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group of `proc` (a JVM and what it started: executors, Python
    workers), SIGKILL after `grace_s`. Nothing if it ended already: its id may be reused."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # The leader is gone; members that did not follow it yet go now.
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class SparkCluster:
    """A standalone master and `workers` workers of 1 core and 1 GiB each, under `directory`."""

    directory: Path
    workers: int = 2
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def work_dir(self, i: int) -> Path:
        return self.directory / f"worker-{i}"

    def _spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env={**cluster_env(), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def log_tail(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def state(self) -> dict[str, Any]:
        """The master's JSON: workers, apps (active and completed), status."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def _answering(self, check: Callable[[dict[str, Any]], bool]) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
        try:
            return check(self.state())
        except (OSError, ValueError):  # not listening yet, or an empty page while it starts
            return False

    def alive_workers(self, state: dict[str, Any]) -> int:
        return sum(1 for w in state["workers"] if w["state"] == "ALIVE")

    def start(self) -> SparkCluster:
        """Start the master, then the workers; stops what it started if they do not come up."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> SparkCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        master = "org.apache.spark.deploy.master.Master"
        # No REST submission server: it would take the fixed port 6066.
        no_rest = {"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        self._spawn("master", master, "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.ui_port), env=no_rest)  # fmt: skip
        # Workers started before the master listens retry only after 5-15 s: wait for it first.
        wait_until(
            lambda: self._answering(lambda s: s["status"] == "ALIVE"),
            START_TIMEOUT_S,
            "the Spark master to be ALIVE",
            interval_s=0.2,
        )
        for i in range(self.workers):
            self.work_dir(i).mkdir()
            self._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker", self.url,
                "--host", "127.0.0.1", "--port", str(free_port()),
                "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()), "--work-dir", str(self.work_dir(i)),
            )  # fmt: skip
        wait_until(
            lambda: self._answering(lambda s: self.alive_workers(s) == self.workers),
            START_TIMEOUT_S,
            f"{self.workers} ALIVE workers on the master",
            interval_s=0.2,
        )
        return self

    def stop(self) -> None:
        for name in sorted(self.procs, reverse=True):  # workers, then the master
            stop_group(self.procs[name], grace_s=20)

    def finished_app(self, app_id: str | None = None, name: str | None = None) -> dict[str, Any]:
        """The master's record of a completed application (by id or name), once it is FINISHED."""

        def find() -> dict[str, Any] | None:
            try:
                apps = self.state()["completedapps"]
            except (OSError, ValueError):  # the master busy for a moment: ask again
                return None
            for app in apps:
                if (app["id"] == app_id or app["name"] == name) and app["state"] == "FINISHED":
                    return app  # type: ignore[no-any-return]
            return None

        return wait_until(find, 30, f"application {app_id or name} FINISHED on the master", 0.2)  # type: ignore[no-any-return]

    def executor_dirs(self, app_id: str) -> dict[int, list[Path]]:
        """Per worker, the directories of `app_id`'s executors that ran there."""
        return {i: sorted((self.work_dir(i) / app_id).glob("*")) for i in range(self.workers)}


# --- the driver: jobs run in a process of their own, on any master -------------------------


@dataclass
class Driver:
    """A driver process running jobs of this module (see `start_driver`)."""

    proc: subprocess.Popen[bytes]
    workdir: Path
    master: str
    started: float = field(default_factory=time.monotonic)

    def result(self) -> Any:
        """Wait for the driver (DRIVER_TIMEOUT_S from its start); its JSON result."""
        try:
            code = self.proc.wait(max(0.0, self.started + DRIVER_TIMEOUT_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_group(self.proc, grace_s=5)
        tail = (self.workdir / "driver.log").read_text(errors="replace")[-4000:]
        assert code == 0, f"driver on {self.master} ended with {code}:\n{tail}"
        return json.loads((self.workdir / "result.json").read_text())

    def stop(self) -> None:
        stop_group(self.proc, grace_s=5)


def start_driver(
    jobs: list[tuple[str, dict[str, Any]]], master: str, workdir: Path, python: Path | None
) -> Driver:
    """Start a driver that runs `jobs` (name, params) of this module one after the other in one
    application on `master`; `Driver.result()`: their JSON results under "results", with the
    application's id and a probe. `python`: the Python of the executors and of the driver's
    Python workers (PYSPARK_PYTHON); None = this interpreter (local[*])."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = workdir / "spec.json"
    spec.write_text(json.dumps({"jobs": jobs, "master": master, "out": str(workdir / "result.json")}))
    with open(workdir / "driver.log", "ab") as log:
        proc = subprocess.Popen(
            python_command("tests.spark.cluster", str(spec)),
            cwd=workdir,
            env=driver_env(python),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Driver(proc, workdir, master)


def read_topic(spark: Any, gateway: str, token: str, topic: str) -> dict[str, Any]:
    """Batch read of `topic`: every row (timestamps as epoch ms) and, per row, the working
    directory of the Python worker that read it (an executor's directory on a cluster)."""
    from pyspark.sql import functions as F

    def ran_in(queue: int) -> str:  # nested: cloudpickle ships it by value
        import os

        return os.getcwd()

    df = (
        spark.read.format("mqgate").option("gateway", gateway).option("token", token)
        .option("topic", topic).option("readBatchSize", 500).load()
    )  # fmt: skip
    times = ("timestamp", "deliverAt", "deadline")
    columns = [F.unix_millis(c).alias(c) if c in times else F.col(c) for c in df.columns]
    where = F.udf(ran_in, "string")("queue").alias("ranIn")
    rows = [r.asDict(recursive=True) for r in df.select(*columns, where).collect()]
    return {
        "rows": sorted(
            ({k: v for k, v in r.items() if k != "ranIn"} for r in rows),
            key=lambda r: (r["queue"], r["offset"]),
        ),
        "ranIn": sorted({r["ranIn"] for r in rows}),
    }


def copy_topic(
    spark: Any, gateway: str, token: str, source: str, producer: str, consumer: str, workdir: str
) -> dict[str, Any]:
    """Streaming copy of `source` to `producer`'s topic (Trigger.AvailableNow, 700 messages per
    micro-batch), committing `consumer`'s progress after each batch; the batch sizes."""
    q = (
        spark.readStream.format("mqgate").option("gateway", gateway).option("token", token)
        .option("topic", source).option("maxMessagesPerTrigger", 700).load()
        .writeStream.format("mqgate").option("gateway", gateway).option("token", token)
        .option("producer", producer).option("progressConsumer", consumer)
        .option("progressStateDir", f"{workdir}/progress")
        .option("checkpointLocation", f"{workdir}/checkpoint")
        .trigger(availableNow=True).start()
    )  # fmt: skip
    q.awaitTermination()
    return {"batches": [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]}


def probe(spark: Any) -> dict[str, Any]:
    """Where tasks run: each task's working directory, the file mqgate was imported from and
    the Python; and the executors the driver knows (host:port, the driver itself excluded)."""
    sc = spark.sparkContext

    def where(_: Any) -> Any:
        import os
        import sys

        import mqgate

        yield {"cwd": os.getcwd(), "mqgate": os.path.abspath(mqgate.__file__), "python": sys.executable}

    tasks = sc.parallelize(range(8), 8).mapPartitions(where).collect()
    ids = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc._jsc.sc().getExecutorIds())
    unique = {tuple(sorted(t.items())) for t in tasks}
    return {"tasks": [dict(t) for t in sorted(unique)], "executors": sorted(str(i) for i in ids)}


def run_pipeline(spark: Any, config: str) -> dict[str, Any]:
    """The event pipeline of `config` (`--available-now`) in this application, as
    `mqgate pipeline run` runs it in one of its own."""
    from mqgate.pipeline.config import load_config
    from mqgate.pipeline.job import run_pipeline as run

    summary = run(load_config(Path(config)), available_now=True, spark=spark)
    return {"batches": summary.batches, "events": summary.report.events}


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "read": read_topic,
    "copy": copy_topic,
    "pipeline": run_pipeline,
}


def main(spec_path: str) -> None:
    import mqgate.spark

    spec = json.loads(Path(spec_path).read_text())
    started = time.monotonic()
    name = "mqgate-test-" + "-".join(job for job, _ in spec["jobs"])
    spark = mqgate.spark.session(name, spec["master"], SHORT_JVM_CONF)
    try:
        result: dict[str, Any] = {"started": time.monotonic() - started, "results": []}
        for job, params in spec["jobs"]:
            began = time.monotonic()
            result["results"].append({**JOBS[job](spark, **params), "seconds": time.monotonic() - began})
        result["probe"] = probe(spark)
        result["appId"] = spark.sparkContext.applicationId
    finally:
        spark.stop()
    result["seconds"] = time.monotonic() - started
    Path(spec["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
