"""A SparkSession set up for mqgate jobs, with the `mqgate` format registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, Final

from pyspark.sql import SparkSession

DEFAULTS: Final = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Small local jobs: a handful of shuffle partitions, not 200.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
}


def register(spark: SparkSession) -> None:
    """Register the `mqgate` format (reader and writer, batch and streaming) on `spark`."""
    from mqgate.spark.source import MqgateDataSource

    spark.dataSource.register(MqgateDataSource)


def session(app_name: str, master: str | None = None, conf: Mapping[str, Any] | None = None) -> SparkSession:
    """A SparkSession on `master` (default local[*]) with the `mqgate` format registered.

    Python workers run this interpreter unless PYSPARK_PYTHON says otherwise, so they import
    the same mqgate, pyarrow and pandas as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    for key, value in {**DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
