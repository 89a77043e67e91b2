#!/usr/bin/env bash
# The README quickstart: install what the demo needs (virtualenv, Kafka jars), start a local
# single-node Kafka and a sidecar, send a few delayed records, print them arriving with lateness.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
KDS_SETUP_STEPS="10-kafka" bash scripts/setup.sh
exec .venv/bin/delay-sidecar demo "$@"
