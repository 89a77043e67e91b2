#!/usr/bin/env bash
# The test command (README and CI): set up, lint, type-check, then the whole suite against a real
# Kafka broker started once per session. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
export PATH="$root/.venv/bin:$KDS_CACHE/bin:$PATH"
ruff check sidecar spark tests bench devkafka
mypy
exec python -m pytest "$@"
