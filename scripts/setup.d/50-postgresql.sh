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
DEB_STEP=postgresql
# shellcheck source=scripts/lib/debian-packages.sh
. "$(dirname "$0")/../lib/debian-packages.sh"
deb_tools || skip "no apt-get/dpkg-deb on this machine"
newest() {  # the newest server package apt offers (bookworm: postgresql-15)
  apt-cache "${apt_opts[@]}" pkgnames postgresql- 2>/dev/null | grep -E '^postgresql-[0-9]+$' | sort -t- -k2 -n | tail -1 || true
}
pkg=$(newest)
if [ -z "$pkg" ]; then
  deb_private_lists "postgresql-NN package"
  pkg=$(newest)
fi
[ -n "$pkg" ] || skip "apt knows no postgresql-NN package"
major=${pkg#postgresql-}
# the server, with the library dependencies that are not installed here (the others are the machine's)
# shellcheck disable=SC2046  # one word per package
deb_unpack "$dest" "$pkg" $(deb_missing_libs "$pkg")
mkdir -p "$bin"
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
