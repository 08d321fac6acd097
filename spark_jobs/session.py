"""The SparkSession of the analysis: local mode by default, whatever spark-submit says otherwise.

Settings: the driver's own Python for the workers (else they may start another one),
127.0.0.1 for every socket, no UI; few shuffle partitions (the aggregated data is small).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from spark_jobs.sources import register

DEFAULT_MASTER = "local[2]"


def under_spark_submit() -> bool:
    """spark-submit starts the driver's JVM first and hands pyspark its port in this variable
    (the check pyspark's own launcher makes): the master then comes from spark-submit."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(
    master: str | None = None, *, app_name: str = "hourglass-analyze",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active session, or a new one: ``master`` if given, else spark-submit's, else
    ``local[2]``. Registers the hourglass data sources."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not under_spark_submit():
        builder = builder.master(DEFAULT_MASTER)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "8",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
