"""The connector jar cache: exact version, no jar that pyspark already ships."""

from __future__ import annotations

from importlib import metadata

import pytest

from spark.jars import (
    CONNECTOR_ARTIFACT,
    ConnectorJarsError,
    artifact_of,
    ensure_connector_jars,
    render_pom,
    shipped_artifacts,
)
from tests.infra import unavailable


def test_artifact_of() -> None:
    assert artifact_of("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert artifact_of("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert artifact_of("scala-library-2.13.18.jar") == "scala-library"
    assert artifact_of("commons-pool2-2.13.1.jar") == "commons-pool2"
    assert artifact_of("guava-33.4.0-jre.jar") == "guava"
    assert artifact_of("jetty-util-9.4.56.v20240826.jar") == "jetty-util"


def test_pom_is_templated() -> None:
    pom = render_pom("9.9.9")
    assert "@SPARK_VERSION@" not in pom
    assert f"<artifactId>{CONNECTOR_ARTIFACT}</artifactId>\n      <version>9.9.9</version>" in pom


@pytest.mark.spark
def test_cached_jars_match_pyspark() -> None:
    try:
        version = metadata.version("pyspark")
        jars = ensure_connector_jars()
    except (metadata.PackageNotFoundError, ConnectorJarsError) as exc:
        unavailable("connector jars", str(exc))
    names = {artifact_of(p.name): p.name for p in jars}
    assert names[CONNECTOR_ARTIFACT] == f"{CONNECTOR_ARTIFACT}-{version}.jar"
    assert names["spark-token-provider-kafka-0-10_2.13"].endswith(f"-{version}.jar")
    assert {"kafka-clients", "commons-pool2"} <= set(names)
    assert not set(names) & shipped_artifacts(), "a jar duplicates one pyspark ships"
    assert ensure_connector_jars(offline=True) == jars  # cached: no Maven run
