"""SparkSession construction shared by the accuracy jobs and the CLI.

Two ways a job runs:

* **local** (the default, and ``delay-sidecar accuracy``): this process starts Spark itself with
  ``master=local[2]`` and ``spark.jars`` = the connector jars from the cache (spark/jars.py), so
  nothing is downloaded at run time.
* **spark-submit** (a cluster, or local with your own settings): spark-submit already started the
  JVM with ``--master`` and ``--jars``; the session is taken as it is (``PYSPARK_GATEWAY_PORT`` in
  the environment tells the two apart) and only the job's SQL settings are applied.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"


def under_spark_submit() -> bool:
    """True when spark-submit launched this Python driver (the JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(
    app_name: str,
    *,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    jars: str | None = None,
) -> SparkSession:
    """A SparkSession for the accuracy jobs (see the module docstring)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    settings: dict[str, str] = {"spark.sql.session.timeZone": "UTC"}
    if not under_spark_submit():
        from spark.jars import spark_jars_conf

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        builder = builder.master(master or DEFAULT_MASTER)
        settings.update(
            {
                "spark.jars": jars if jars is not None else spark_jars_conf(),
                "spark.sql.shuffle.partitions": "4",
                "spark.ui.showConsoleProgress": "false",
            }
        )
    elif master:
        builder = builder.master(master)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    # pyspark warns about pandas >= 3 on start-up; these jobs do not use pandas
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("KDS_SPARK_LOG_LEVEL", "WARN"))
    return session
