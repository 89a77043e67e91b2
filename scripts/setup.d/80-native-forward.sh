#!/usr/bin/env bash
# The passthrough with librdkafka driven from C, for `KDS_BENCH_PASSTHROUGH` (docs/benchmarks.md "A
# forward path without Python objects"):
# - bench/micro/native_forward.c, the whole loop in C, built into $KDS_CACHE/bin/native-forward;
# - bench/micro/hybrid_forward.c, its produce side as a CPython module, built into
#   $KDS_CACHE/native-forward/, where `python -m bench.passthrough --native-produce` finds it.
# Both link the librdkafka the confluent-kafka wheel ships (.venv's confluent_kafka.libs), the one
# the sidecar and bench.passthrough run on, copied to $KDS_CACHE/native-forward/lib and found there
# through an $ORIGIN-relative runpath: the cache is shared by every checkout (a CI clone, a second
# tree), so the binaries must not point into one checkout's .venv, which may be gone by the next run.
# In a Python process the wheel's copy is already loaded under the same soname and is the one used.
# The header comes from Debian's librdkafka-dev (fetched with `apt-get download`, unpacked with
# `dpkg-deb -x` into $KDS_CACHE/librdkafka-dev, nothing installed). It is older than the library
# (bookworm: 2.0.2 against the wheel's 2.x): the functions the programs call are in both, with the
# same signatures. Rebuilt when a source is newer than its binary or the wheel's library is not
# the one the binaries were built against (its file name carries a hash of its content). Without apt, network or a C compiler the step is skipped with a
# message: only that option and its test need it (the test fails under CI=true, skips elsewhere).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
bin="$KDS_CACHE/bin"
dest="$KDS_CACHE/librdkafka-dev"
src="$root/bench/micro/native_forward.c"
out="$bin/native-forward"
hsrc="$root/bench/micro/hybrid_forward.c"
extdir="$KDS_CACHE/native-forward"
ext="$extdir/hybrid_forward$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
skip() {
  echo "setup(native-forward): $1; skipping (only KDS_BENCH_PASSTHROUGH=native-forward and its test need it)" >&2
  exit 0
}
libdir=$("$root/.venv/bin/python" -c 'import confluent_kafka, pathlib; p = pathlib.Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"; print(p if p.is_dir() else "")')
[ -n "$libdir" ] || skip "the confluent-kafka wheel has no bundled librdkafka (confluent_kafka.libs)"
lib=$(ls "$libdir"/librdkafka-*.so* 2>/dev/null | head -1 || true)
[ -n "$lib" ] || skip "no librdkafka in $libdir"
command -v cc >/dev/null || skip "no C compiler (cc)"
libcopy="$extdir/lib/$(basename "$lib")"
stamp="$extdir/built-against"
fresh() { [ -e "$1" ] && [ "$1" -nt "$2" ]; }
if fresh "$out" "$src" && fresh "$ext" "$hsrc" && [ -e "$libcopy" ] \
  && [ "$(cat "$stamp" 2>/dev/null)" = "$(basename "$lib")" ]; then
  echo "setup(native-forward): $out and $ext are up to date" >&2
  exit 0
fi
if [ ! -f "$dest/usr/include/librdkafka/rdkafka.h" ]; then
  DEB_STEP=native-forward
  # shellcheck source=scripts/lib/debian-packages.sh
  . "$(dirname "$0")/../lib/debian-packages.sh"
  deb_tools || skip "no apt-get/dpkg-deb on this machine"
  if ! apt-cache "${apt_opts[@]}" show librdkafka-dev >/dev/null 2>&1; then
    deb_private_lists "librdkafka-dev"
  fi
  deb_unpack "$dest" librdkafka-dev
fi
mkdir -p "$bin" "$extdir/lib"
if [ ! -e "$libcopy" ]; then
  cp "$lib" "$libcopy.tmp.$$"
  mv "$libcopy.tmp.$$" "$libcopy"
fi
# shellcheck disable=SC2016 # $ORIGIN is the dynamic loader's, not the shell's
cc -O2 -Wall -Wextra -Werror -I"$dest/usr/include" -o "$out.tmp.$$" "$src" "$libcopy" \
  -Wl,-rpath,'$ORIGIN/../native-forward/lib'
mv "$out.tmp.$$" "$out"
pyinc=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
# shellcheck disable=SC2016
cc -O2 -shared -fPIC -Wall -Wextra -Werror -I"$pyinc" -I"$dest/usr/include" -o "$ext.tmp.$$" "$hsrc" \
  "$libcopy" -Wl,-rpath,'$ORIGIN/lib'
mv "$ext.tmp.$$" "$ext"
basename "$lib" >"$stamp"
echo "setup(native-forward): built $out and $ext against $(basename "$lib") (nothing installed system-wide)" >&2
