"""Spark fixtures: one local SparkSession per test session with the real Kafka connector.

``spark`` (session): ``local[2]``, 4 shuffle partitions, UI off, driver memory 1g, the JIT
limited to C1 (short jobs), and ``spark.jars`` = the connector jars from the cache
(spark/jars.py, fetched by scripts/setup.d/20-spark.sh). When pyspark, Java or the jars are missing the Spark tests are
skipped on a laptop and *fail* under ``CI=true``.

``batch_scenario`` (session, dict): the crafted scenario of tests/spark/helpers.py produced once
into fresh topics and measured by the batch job on the local session: the scenario's fields
(``ingress``, ``pattern``, ``base``, ``since``, ``until``, ...) plus ``summary`` (what
``run_accuracy`` returned) and ``out`` (its output directory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.infra import unavailable


def _unavailable(reason: str) -> None:
    unavailable("Spark", reason)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Any]:
    # Depends on the broker so that Spark (and the Kafka producers cached in its JVM) is shut
    # down before the broker is, not left retrying a closed port after the session.
    try:
        import pyspark  # noqa: F401
        from pyspark.sql import SparkSession
    except ImportError as exc:
        _unavailable(f"pyspark is not installed: {exc}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _unavailable("java not found (Java 17+ is required)")
    from spark.jars import ConnectorJarsError, ensure_connector_jars, spark_jars_conf

    try:
        jars = ensure_connector_jars()
    except ConnectorJarsError as exc:
        _unavailable(f"Kafka connector jars: {exc}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kds-tests")
        .config("spark.jars", spark_jars_conf(jars))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        # C1 only: these short jobs finish before C2 would pay off (about 2x faster here)
        .config("spark.driver.extraJavaOptions", f"-XX:TieredStopAtLevel=1 -Dderby.system.home={warehouse}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        session.stop()
        _stop_jvm()


def _stop_jvm() -> None:
    """End the Spark JVM now (it exits when its stdin closes) instead of at interpreter exit."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except Exception:
        proc.kill()


@pytest.fixture(scope="session")
def batch_scenario(kafka_bootstrap: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from spark.accuracy import run_accuracy
    from tests.spark.helpers import produce_batch_scenario

    scenario = produce_batch_scenario(kafka_bootstrap)
    out = tmp_path_factory.mktemp("accuracy")
    summary = run_accuracy(spark, kafka_bootstrap, scenario.ingress, scenario.pattern, scenario.since,
                           scenario.until, out)
    return {**dataclasses.asdict(scenario), "summary": summary, "out": out}
