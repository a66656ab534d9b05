"""A SparkSession set up for mqgate jobs, with the `mqgate` format registered."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pyspark.sql import SparkSession

DEFAULTS: Final = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Small local jobs: a handful of shuffle partitions, not 200.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
}
SHIPPED_ZIP: Final = "mqgate.zip"


def register(spark: SparkSession) -> None:
    """Register the `mqgate` format (reader and writer, batch and streaming) on `spark`."""
    from mqgate.spark.source import MqgateDataSource

    spark.dataSource.register(MqgateDataSource)


def runs_in_this_process(master: str) -> bool:
    """local / local[N] / local[N,F]: the executors are threads of the driver's JVM and their
    Python workers import what the driver imports. local-cluster[...] and real clusters start
    executor processes that need the package shipped."""
    return master == "local" or master.startswith("local[")


def package_zip(directory: Path) -> Path:
    """The running mqgate package (the one the driver imported) as `directory/mqgate.zip`."""
    package = Path(__file__).resolve().parent.parent
    target = directory / SHIPPED_ZIP
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, Path("mqgate") / path.relative_to(package))
    return target


def ship_package(spark: SparkSession) -> None:
    """Send this mqgate to every Python process the SparkContext starts, once per context.
    Must precede register(): the data source's Python function takes the includes and the
    environment there are when it is registered.

    - Executors: `addPyFile`. Their Python workers put the fetched zip ahead of site-packages,
      so they run the driver's code even where another mqgate (or none) is installed.
    - The driver's own Python workers (the data source planners: batch read planning, the
      streaming reader's offsets and partitions, the streaming writer's commits): the zip is
      put on the PYTHONPATH of the context's Python functions, which the driver's JVM gives
      them. The includes alone do not reach them all: the streaming source's planner looks
      its includes up in `<SparkFiles root>/streaming_job/` (pyspark 4's
      PythonStreamingSourceRunner), where addPyFile puts nothing, so without this it cannot
      import mqgate unless the driver's Python has it installed. On the executors this
      driver path comes after the shipped zip (or does not exist).
    """
    sc = spark.sparkContext
    if SHIPPED_ZIP in (sc._python_includes or []):
        return
    directory = Path(tempfile.mkdtemp(prefix="mqgate-ship-"))
    atexit.register(shutil.rmtree, directory, True)
    zipped = str(package_zip(directory))
    sc.addPyFile(zipped)
    pythonpath = [zipped, *filter(None, sc.environment.get("PYTHONPATH", "").split(os.pathsep))]
    sc.environment["PYTHONPATH"] = os.pathsep.join(pythonpath)


def session(app_name: str, master: str | None = None, conf: Mapping[str, Any] | None = None) -> SparkSession:
    """A SparkSession on `master` (default local[*]) with the `mqgate` format registered.

    Python workers run this interpreter unless PYSPARK_PYTHON says otherwise, so they import
    the same mqgate, pyarrow and pandas as the driver. On a cluster (any master but local /
    local[...]) the mqgate package is shipped to the executors; its dependencies (the `spark`
    and `postgres` extras) must be installed in their Python.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or "local[*]"
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in {**DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not runs_in_this_process(master):
        ship_package(spark)
    register(spark)
    return spark
