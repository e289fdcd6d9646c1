"""The Spark session the jobs run in: local mode by default, the cluster under spark-submit."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from pipeline.source import register

__all__ = ["DEFAULT_MASTER", "spark_session"]

DEFAULT_MASTER = "local[2]"

# Small jobs: Spark's default of 200 shuffle partitions costs seconds of scheduling for
# nothing here; adaptive execution merges partitions further where it can.
_CONFIG = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(master: str | None = None, *, app: str = "evq-pipeline") -> SparkSession:
    """A session with the ``evq`` data source registered.

    ``master`` None: keep what spark-submit configured, else local mode with two cores.
    """
    # The Python workers must run the interpreter that has evq installed (PLATFORM.md).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    elif not _submitted():
        builder = builder.master(DEFAULT_MASTER)
    if not _submitted():
        # Local mode runs the executors in the driver's JVM: Spark's default of 1 GiB ran out
        # of heap on a 10M-event log (loadtest/RESULTS.md, "Pipeline").
        memory = os.environ.get("EVQ_SPARK_DRIVER_MEMORY", "4g")
        builder = builder.config("spark.driver.memory", memory)
    for key, value in _CONFIG.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def _submitted() -> bool:
    """Whether spark-submit started this driver (its JVM runs and chose the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ
