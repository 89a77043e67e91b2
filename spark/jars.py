"""The Spark Kafka connector jars, fetched once with Maven into the project cache.

Spark reads Kafka through ``org.apache.spark:spark-sql-kafka-0-10_2.13``, which must be the
*exact* version of the installed pyspark. Rather than letting Spark download it at job start
(``spark.jars.packages`` / Ivy: network at run time, a different cache, no control over
conflicts), the project's setup step fetches it once::

    $KDS_CACHE/spark-kafka-<version>/*.jar      (KDS_CACHE defaults to ~/.cache/kafka-delay-sidecar)

by running ``mvn -q dependency:copy-dependencies`` on ``spark/connector-pom.xml`` (templated with
the version). The connector's transitive dependencies come along (kafka-clients, commons-pool2,
spark-token-provider-kafka); those that pyspark already ships in its own ``jars/`` directory
(Scala, the Hadoop client, slf4j, lz4, snappy, ...) are excluded in the pom and, as a safety
net, any jar whose artifact pyspark also ships is dropped here, so that the classpath holds one
version of each library. Jobs pass the result as ``spark.jars`` (comma-separated paths) or
``spark-submit --jars``.

``python -m spark.jars`` fetches (if needed) and prints the jar paths, one per line, or with
``--csv`` comma-separated, ready for ``spark-submit --jars "$(python -m spark.jars --csv)"``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"
POM_TEMPLATE = Path(__file__).with_name("connector-pom.xml")
_STAMP = ".complete"
# artifactId-version[-qualifier].jar: the version is the last dash-separated part that starts with
# a digit (kafka-clients-3.9.2.jar, spark-sql-kafka-0-10_2.13-4.2.0.jar, guava-33.4.0-jre.jar)
_JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d[^-]*(?:-[A-Za-z][\w.]*)*)\.jar$")


class ConnectorJarsError(RuntimeError):
    """The connector jars are not cached and could not be fetched (no Maven, no network, ...)."""


def cache_root() -> Path:
    """``$KDS_CACHE`` or ``~/.cache/kafka-delay-sidecar``."""
    env = os.environ.get("KDS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kafka-delay-sidecar"


def pyspark_version() -> str:
    """The installed pyspark version (without importing pyspark, which is slow)."""
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError as exc:
        raise ConnectorJarsError("pyspark is not installed (pip install '.[spark]')") from exc


def pyspark_jars_dir() -> Path | None:
    """pyspark's bundled ``jars/`` directory (what is already on Spark's classpath)."""
    try:
        dist = metadata.distribution("pyspark")
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("pyspark"))) / "jars"
    return path if path.is_dir() else None


def connector_dir(version: str | None = None) -> Path:
    return cache_root() / f"spark-kafka-{version or pyspark_version()}"


def artifact_of(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    m = _JAR_NAME.match(jar_name)
    return m.group("artifact") if m else jar_name.removesuffix(".jar")


def shipped_artifacts(jars_dir: Path | None = None) -> set[str]:
    """Artifact ids of the jars pyspark ships itself."""
    d = jars_dir if jars_dir is not None else pyspark_jars_dir()
    if d is None:
        return set()
    return {artifact_of(p.name) for p in d.glob("*.jar")}


def render_pom(version: str) -> str:
    return POM_TEMPLATE.read_text(encoding="utf-8").replace("@SPARK_VERSION@", version)


def _cached(target: Path) -> list[Path] | None:
    if (target / _STAMP).is_file():
        jars = sorted(target.glob("*.jar"))
        if any(p.name.startswith(CONNECTOR_ARTIFACT) for p in jars):
            return jars
    return None


def ensure_connector_jars(version: str | None = None, *, offline: bool = False) -> list[Path]:
    """The connector jar and its dependencies for ``version`` (default: installed pyspark).

    Fetches them with Maven on first use (``offline=True`` raises instead). The cache
    directory is filled atomically (a temporary directory renamed into place), so a run that is
    interrupted leaves nothing half-written behind.
    """
    version = version or pyspark_version()
    target = connector_dir(version)
    jars = _cached(target)
    if jars is not None:
        return jars
    if offline:
        raise ConnectorJarsError(f"Spark Kafka connector {version} is not cached in {target}")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConnectorJarsError("Maven (mvn) is required to fetch the Spark Kafka connector")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".spark-kafka-{version}-", dir=target.parent) as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(render_pom(version), encoding="utf-8")
        out = work / "jars"
        cmd = [
            mvn, "-q", "-B", "dependency:copy-dependencies",
            f"-DoutputDirectory={out}", "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise ConnectorJarsError(
                f"mvn could not fetch {CONNECTOR_ARTIFACT}:{version} (exit {proc.returncode}):\n{tail}"
            )
        shipped = shipped_artifacts()
        for jar in out.glob("*.jar"):
            if artifact_of(jar.name) in shipped:
                jar.unlink()  # pyspark has its own (possibly newer) copy on the classpath
        if not any(p.name.startswith(CONNECTOR_ARTIFACT) for p in out.glob("*.jar")):
            raise ConnectorJarsError(f"mvn did not produce {CONNECTOR_ARTIFACT}-{version}.jar in {out}")
        (out / _STAMP).write_text(version + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    jars = _cached(target)
    assert jars is not None
    return jars


def spark_jars_conf(jars: list[Path] | None = None) -> str:
    """The ``spark.jars`` / ``--jars`` value: comma-separated absolute paths."""
    return ",".join(str(p.resolve()) for p in (jars if jars is not None else ensure_connector_jars()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark.jars",
        description="Fetch (once) and print the Spark Kafka connector jars for the installed pyspark.",
    )
    parser.add_argument("--version", help="Spark version (default: the installed pyspark's)")
    parser.add_argument("--csv", action="store_true", help="print one comma-separated line (--jars)")
    parser.add_argument("--offline", action="store_true", help="fail instead of running Maven")
    args = parser.parse_args(argv)
    try:
        jars = ensure_connector_jars(args.version, offline=args.offline)
    except ConnectorJarsError as exc:
        print(f"spark.jars: {exc}", file=sys.stderr)
        return 1
    print(spark_jars_conf(jars) if args.csv else "\n".join(str(p) for p in jars))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
