#!/usr/bin/env bash
# The Kafka Streams delay queue of the `streams-punctuator` benchmark peer (bench/streams-peer/,
# bench/streams_punctuator.py) and its smoke test: compiled with Maven from Maven Central into
# $KDS_CACHE/streams-peer (the application's jar and its runtime dependencies in lib/, run as
# `java -cp 'lib/*:streams-peer.jar'`); nothing is written into the repository or outside the cache.
# kafka-streams takes the version of the broker the cache holds (step 10-kafka), so the benchmark
# runs client and broker of one release. Idempotent: the build is skipped when its stamp holds the
# same hash of the sources and that version; a failed build leaves the previous one (or none) in place.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
src=bench/streams-peer
dest="$KDS_CACHE/streams-peer"
command -v mvn >/dev/null || { echo "setup(kafka-streams): Maven (mvn) is required to build $src" >&2; exit 1; }
ver=$(.venv/bin/python -c 'from devkafka.jars import ensure_kafka_jars, kafka_version; print(kafka_version(ensure_kafka_jars()))')
hash=$( (echo "kafka $ver"; find "$src" -type f \( -name pom.xml -o -name '*.java' \) | sort | xargs sha256sum) | sha256sum | cut -d' ' -f1)
if [ -f "$dest/.stamp" ] && [ "$(cat "$dest/.stamp")" = "$hash" ]; then
  echo "setup(kafka-streams): $dest is built from these sources (kafka-streams $ver)" >&2
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src" "$tmp/src"
echo "setup(kafka-streams): building $src with kafka-streams $ver into $dest" >&2
mvn -q -B -Dstyle.color=never -f "$tmp/src/pom.xml" package dependency:copy-dependencies -Dkafka.version="$ver" -Dkds.out="$tmp/out" >&2
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
mv "$tmp/out/streams-peer.jar" "$tmp/out/lib" "$dest.tmp/"
echo "$hash" > "$dest.tmp/.stamp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "setup(kafka-streams): built $dest (kafka-streams $ver)" >&2
