#!/usr/bin/env bash
# Installs everything the project needs, idempotently: a virtualenv with the package and its
# extras, then every scripts/setup.d/*.sh (Kafka jars, Spark connector, helm, redis, ...).
# Caches live outside the repo in $KDS_CACHE (default ~/.cache/kafka-delay-sidecar).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
mkdir -p "$KDS_CACHE"

command -v java >/dev/null || { echo "setup: Java 17+ is required (java not found)" >&2; exit 1; }
jv=$(java -version 2>&1 | awk -F'"' '/version/ {print $2}' | cut -d. -f1)
[ "${jv:-0}" -ge 17 ] || { echo "setup: Java 17+ is required, found $jv" >&2; exit 1; }

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=.venv/.kds-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77" wheel
  .venv/bin/python -m pip install -q -e ".[test,spark]"
  touch "$stamp"
fi
# The C accelerator (sidecar/native/), built in place whenever a file of it, setup.py or the
# declaration its intake_layout.h is generated from is newer than the library: the package runs
# without it, but slower, so a build failure is reported here.
so=$(ls sidecar/_native.*.so 2>/dev/null | head -1 || true)
if [ -z "$so" ] || [ -n "$(find sidecar/native setup.py sidecar/store/intake_layout.py -newer "$so" -print -quit)" ]; then
  echo "setup: building sidecar._native" >&2
  .venv/bin/python setup.py build_ext --inplace >"$KDS_CACHE/native-build.log" 2>&1 || true
  if ! ls sidecar/_native.*.so >/dev/null 2>&1; then
    cat "$KDS_CACHE/native-build.log" >&2
    echo "setup: sidecar._native did not build (gcc and the Python headers are needed)" >&2
    exit 1
  fi
fi
# KDS_SETUP_STEPS limits the steps (e.g. "10-kafka" for the demo); default: all of them.
for step in scripts/setup.d/*.sh; do
  [ -e "$step" ] || continue
  name=$(basename "$step" .sh)
  if [ -n "${KDS_SETUP_STEPS:-}" ] && [[ " $KDS_SETUP_STEPS " != *" $name "* ]]; then
    continue
  fi
  echo "setup: $name" >&2
  bash "$step"
done
