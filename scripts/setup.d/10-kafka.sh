#!/usr/bin/env bash
# Fetches the Apache Kafka broker jars once (Maven Central, scripts/kafka-pom.xml) into
# $KDS_CACHE/kafka-<version>/, the classpath LocalKafka runs a single-node KRaft broker from
# (`delay-sidecar dev-kafka`, the embedded default, the test session fixture). Idempotent: a
# complete cache (marker file) returns at once; an interrupted download is redone. Uses the very
# function the runtime uses, so CI proves the same code path a laptop takes.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
command -v mvn >/dev/null || { echo "setup: Maven (mvn) is required to fetch the Kafka jars" >&2; exit 1; }
dir=$(.venv/bin/python -c 'from devkafka.jars import ensure_kafka_jars; print(ensure_kafka_jars())')
ver=$(.venv/bin/python -c 'import sys; from pathlib import Path; from devkafka.jars import kafka_version; print(kafka_version(Path(sys.argv[1])))' "$dir")
echo "setup: Kafka $ver broker jars in $dir"
