#!/usr/bin/env bash
# Fetches the Spark Kafka connector (spark-sql-kafka-0-10_2.13 at exactly the installed pyspark
# version, plus kafka-clients, commons-pool2 and spark-token-provider-kafka) with Maven into
# $KDS_CACHE/spark-kafka-<version>/, once. Spark jobs pass these jars as spark.jars: nothing is
# downloaded when a job runs. Idempotent: a cached, complete directory is reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
py=.venv/bin/python
[ -x "$py" ] || py=${PYTHON:-python3}
command -v mvn >/dev/null || { echo "setup: Maven (mvn) is required for the Spark Kafka connector" >&2; exit 1; }
"$py" -m spark.jars >/dev/null
echo "setup: Spark Kafka connector jars in $KDS_CACHE/spark-kafka-$("$py" -c 'from spark.jars import pyspark_version; print(pyspark_version())')"
