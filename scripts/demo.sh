#!/usr/bin/env bash
# The README quickstart: install what the demo runs (a virtualenv with the package alone, no
# extras; the Kafka jars), start a local single-node Kafka and a sidecar, send a few delayed
# records, print them arriving with lateness. Everything the demo writes (the broker's data, the
# store) goes to a temporary directory that is removed when it ends, however it ends.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
KDS_EXTRAS="" KDS_SETUP_STEPS="10-kafka" bash scripts/setup.sh
tmp=$(mktemp -d -t delay-sidecar-demo.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TMPDIR="$tmp" .venv/bin/delay-sidecar demo "$@"
