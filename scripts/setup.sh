#!/usr/bin/env bash
# Installs everything the project needs, idempotently: a virtualenv with the package and its
# extras, then every scripts/setup.d/*.sh (Kafka jars, Spark connector, helm, redis, postgresql, ...).
# Caches live outside the repo in $KDS_CACHE (default ~/.cache/kafka-delay-sidecar).
# KDS_EXTRAS picks the extras (default "test,spark"; "" for the package alone, as the demo does);
# KDS_SETUP_STEPS the setup.d steps (default: all).
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
# The stamp lists what is installed, one a line ("base" for the package, then its extras): a run
# that asks for no more, with pyproject.toml unchanged since, installs nothing. (An empty stamp is
# from before the list: the package with both extras.)
extras=${KDS_EXTRAS-test,spark}
stamp=.venv/.kds-installed
want=$(printf '%s\n' base ${extras//,/ } | sort -u)
have=""
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
  have=$(if [ -s "$stamp" ]; then cat "$stamp"; else printf '%s\n' base spark test; fi | sort -u)
fi
if [ -n "$(comm -23 <(echo "$want") <(echo "$have"))" ]; then
  spec=.
  [ -n "$extras" ] && spec=".[$extras]"
  echo "setup: installing the package${extras:+ with the extras $extras} into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77" wheel
  .venv/bin/python -m pip install -q -e "$spec"
  printf '%s\n' "$want" "$have" | grep . | sort -u > "$stamp"
fi
# The C accelerator (sidecar/native/), built in place whenever a file of it, setup.py or the
# declarations its intake_layout.h, layouts.h and native_args.h are generated from is newer than the library: the package runs
# without it, but slower, so a build failure is reported here.
so=$(ls sidecar/_native.*.so 2>/dev/null | head -1 || true)
if [ -z "$so" ] || [ -n "$(find sidecar/native setup.py sidecar/store/intake_layout.py sidecar/store/native_layouts.py sidecar/store/native_args.py -newer "$so" -print -quit)" ]; then
  echo "setup: building sidecar._native" >&2
  .venv/bin/python setup.py build_ext --inplace >"$KDS_CACHE/native-build.log" 2>&1 || true
  # (a failed compile only warns, the extension being optional, and an older library would stay)
  so=$(ls sidecar/_native.*.so 2>/dev/null | head -1 || true)
  if [ -z "$so" ] || [ -n "$(find sidecar/native setup.py sidecar/store/intake_layout.py sidecar/store/native_layouts.py sidecar/store/native_args.py -newer "$so" -print -quit)" ]; then
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
