"""The batch job as users run it: ``spark-submit spark/accuracy.py`` on a Spark standalone cluster.

A master and two workers (1 core, 512 MiB each) from pyspark's own distribution
(tests/spark/cluster.py); the job is submitted in client mode with the cached connector jars as
``--jars``, so its tasks run in two executor JVMs of their own, one per worker. It reads the
session's crafted scenario (tests/spark/helpers.py, produced by the ``batch_scenario`` fixture)
from the real broker and must report exactly the figures of the local run of the same data.

What the test pins down about the driver/executor split (docs/spark.md, "Running on a cluster"):

* executors get the connector jars from the driver (``--jars``), not from the cache path: each
  executor's work directory holds its own fetched copy;
* executors run no Python: ``spark.pyspark.python`` points to a path that does not exist, and
  only the driver's Python (``spark.pyspark.driver.python``) is real;
* ``details.parquet`` is written by the executors into ``--out``, which works here because the
  directory is on the one local disk every JVM shares; ``summary.json`` and ``chart.png`` are
  written by the driver.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from spark.jars import CONNECTOR_ARTIFACT, ensure_connector_jars, spark_jars_conf
from tests.spark.cluster import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
NO_PYTHON = "/nonexistent/executors-run-no-python"


@pytest.fixture(scope="module")
def spark_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Any:
    # `spark` first: its checks (pyspark, Java, the jars) skip on a laptop and fail under CI=true
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=1, memory="512m")
    request.addfinalizer(cluster.stop)  # registered before start: a half-started cluster is stopped too
    cluster.start()
    return cluster


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in ("generated_at", "outputs")}


def _status_counts(spark: Any, details: Path) -> dict[str, int]:
    rows = spark.read.parquet(str(details)).groupBy("status").count().collect()
    return {r["status"]: int(r["count"]) for r in rows}


def test_spark_submit_on_a_standalone_cluster_matches_the_local_run(
    batch_scenario: dict[str, Any], spark_cluster: StandaloneCluster, kafka_bootstrap: str, tmp_path: Path,
    spark: Any,
) -> None:
    out = tmp_path / "out"  # local disk: the driver and both executors see the same directory
    submitted = spark_cluster.submit([
        "--deploy-mode", "client",
        "--jars", spark_jars_conf(),
        "--driver-memory", "512m",
        "--executor-memory", "512m",
        "--total-executor-cores", "2",
        "--conf", "spark.executor.cores=1",
        "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", f"spark.pyspark.driver.python={sys.executable}",
        "--conf", f"spark.pyspark.python={NO_PYTHON}",
        "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
        str(REPO / "spark" / "accuracy.py"),
        "--bootstrap-servers", kafka_bootstrap,
        "--ingress-topic", batch_scenario["ingress"],
        "--targets", batch_scenario["pattern"],
        "--since", str(batch_scenario["since"]),
        "--until", str(batch_scenario["until"]),
        "--out", str(out),
        "--json",
    ], timeout_s=300)
    assert submitted.returncode == 0, submitted.log_tail()

    local = batch_scenario["summary"]
    on_cluster = orjson.loads((out / "summary.json").read_bytes())
    assert on_cluster["totals"]["sent"] == 9 and on_cluster["totals"]["lost"] == 1  # not an empty read
    assert _comparable(on_cluster) == _comparable(local)
    assert _comparable(orjson.loads(submitted.stdout.read_bytes())) == _comparable(local)  # --json

    # one executor JVM per worker, each with the jars fetched from the driver; the tasks ran there
    connector = next(p.name for p in ensure_connector_jars() if p.name.startswith(CONNECTOR_ARTIFACT))
    tasks = 0
    for i in range(spark_cluster.workers):
        executors = [p.parent for p in spark_cluster.worker_dir(i).glob("app-*/*/stderr")]
        assert len(executors) == 1, (i, executors)
        assert (executors[0] / connector).is_file(), sorted(p.name for p in executors[0].iterdir())
        tasks += (executors[0] / "stderr").read_text(errors="replace").count("Running task")
    assert tasks > 0

    # details.parquet: written by the executors into the shared --out, same rows as the local run
    local_details = _status_counts(spark, batch_scenario["out"] / "details.parquet")
    assert _status_counts(spark, out / "details.parquet") == local_details
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
