#!/usr/bin/env bash
# PostgreSQL server binaries for the `pg-poll` benchmark peer (delay-sidecar bench pg-poll) and its
# smoke test. Nothing is installed outside the project's cache:
# - `initdb` and `postgres` already on PATH are used as they are (the step says which);
# - else Debian's server package (the newest postgresql-NN the machine's apt knows, with libpq5
#   and any of the package's library dependencies the machine lacks) is fetched with
#   `apt-get download` (no root needed, nothing installed) and unpacked with `dpkg-deb -x` into
#   $KDS_CACHE/postgresql; wrappers in $KDS_CACHE/bin run its initdb/postgres/pg_ctl with
#   LD_LIBRARY_PATH pointing at the unpacked libraries. PostgreSQL finds its share/ and lib/
#   relative to its binaries, so the unpacked tree runs where it lies;
# - without apt or network the step is skipped with a message: only that benchmark and its smoke
#   test need PostgreSQL (the test fails under CI=true, skips elsewhere).
# The benchmark starts its own server (initdb in a temp dir, a free loopback port) and stops it
# afterwards; no service is installed or started. As root the server runs in a user namespace
# (`unshare --user`), since postgres refuses to run as root (bench/pg_server.py).
set -euo pipefail
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
bin="$KDS_CACHE/bin"
dest="$KDS_CACHE/postgresql"

if PATH="$bin:$PATH" command -v initdb >/dev/null && PATH="$bin:$PATH" command -v postgres >/dev/null; then
  found=$(PATH="$bin:$PATH" command -v postgres)
  echo "setup(postgresql): using $found ($("$found" --version))" >&2
  exit 0
fi
skip() {
  echo "setup(postgresql): $1; skipping (only 'delay-sidecar bench pg-poll' and its smoke test need" \
       "PostgreSQL: put initdb and postgres on PATH to run them)" >&2
  exit 0
}
command -v apt-get >/dev/null && command -v apt-cache >/dev/null && command -v dpkg-deb >/dev/null \
  || skip "no apt-get/dpkg-deb on this machine"
newest() {  # the newest server package apt offers (bookworm: postgresql-15)
  apt-cache "${apt_opts[@]}" pkgnames postgresql- 2>/dev/null | grep -E '^postgresql-[0-9]+$' | sort -t- -k2 -n | tail -1 || true
}
apt_opts=()
pkg=$(newest)
if [ -z "$pkg" ]; then
  # a machine whose package lists were cleaned (container images are): read the sources' lists
  # into the cache, as any user, without touching the machine's own lists
  lists="$KDS_CACHE/apt/lists"
  mkdir -p "$lists/partial" "$KDS_CACHE/apt/archives/partial"
  apt_opts=(-o "Dir::State::Lists=$lists" -o "Dir::Cache=$KDS_CACHE/apt" -o "Dir::Cache::archives=$KDS_CACHE/apt/archives"
            -o Debug::NoLocking=true)
  echo "setup(postgresql): apt knows no postgresql-NN package; reading the package lists into $lists" >&2
  apt-get -q "${apt_opts[@]}" update >&2 || skip "apt-get update failed (no network?)"
  pkg=$(newest)
fi
[ -n "$pkg" ] || skip "apt knows no postgresql-NN package"
major=${pkg#postgresql-}
# library dependencies of the server that are not installed here (the others are the machine's)
libs=$(apt-cache "${apt_opts[@]}" depends "$pkg" | awk '/^ *\|?Depends: lib/ {print $2}' | sort -u)
want=("$pkg")
for l in $libs; do
  dpkg-query -W -f='${Status}' "$l" 2>/dev/null | grep -q "install ok installed" || want+=("$l")
done
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
chmod 755 "$dl"  # apt's _apt user writes the downloads when this runs as root
echo "setup(postgresql): fetching ${want[*]} from Debian's packages into $dest" >&2
(cd "$dl" && apt-get download -q "${apt_opts[@]}" "${want[@]}" >&2) || skip "apt-get download ${want[*]} failed (no network?)"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp" "$bin"
for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$dest.tmp"; done
rm -rf "$dest"
mv "$dest.tmp" "$dest"
pgbin="$dest/usr/lib/postgresql/$major/bin"
libdir="$dest/usr/lib/x86_64-linux-gnu:$dest/usr/lib/postgresql/$major/lib"
for tool in initdb postgres pg_ctl; do
  cat >"$bin/$tool.tmp" <<EOF
#!/bin/sh
# written by scripts/setup.d/50-postgresql.sh: Debian's $pkg unpacked into $dest
LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$pgbin/$tool" "\$@"
EOF
  chmod 755 "$bin/$tool.tmp"
  mv "$bin/$tool.tmp" "$bin/$tool"
done
echo "setup(postgresql): $("$bin/postgres" --version) in $dest (nothing installed system-wide)" >&2
