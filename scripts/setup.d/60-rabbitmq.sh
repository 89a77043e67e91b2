#!/usr/bin/env bash
# RabbitMQ and the Erlang runtime for the `rabbit-ttl` benchmark peer (delay-sidecar bench
# rabbit-ttl) and its smoke test. Nothing is installed outside the project's cache:
# - a `rabbitmq-server` already on PATH is used as it is (the step says which);
# - else Debian's rabbitmq-server and the erlang-* packages it depends on (with any of their library
#   dependencies the machine lacks) are fetched with `apt-get download` (no root needed, nothing
#   installed) and unpacked with `dpkg-deb -x` into $KDS_CACHE/rabbitmq; Erlang's `erl` and `start`
#   scripts, which hardcode ROOTDIR=/usr/lib/erlang, are pointed at the unpacked runtime, and
#   wrappers in $KDS_CACHE/bin run RabbitMQ's own `rabbitmq-server` / `rabbitmqctl` scripts (they
#   find their Erlang applications relative to themselves) with that runtime first on PATH;
# - without apt or network the step is skipped with a message: only that benchmark and its smoke
#   test need RabbitMQ (the test fails under CI=true, skips elsewhere).
# The benchmark starts its own node (bench/rabbit_server.py: its own data dir, cookie, node name,
# AMQP, distribution and epmd ports on loopback) and stops it afterwards; no service is installed or
# started. Re-running the step does nothing once the wrappers are in place.
set -euo pipefail
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
bin="$KDS_CACHE/bin"
dest="$KDS_CACHE/rabbitmq"

if PATH="$bin:$PATH" command -v rabbitmq-server >/dev/null; then
  echo "setup(rabbitmq): using $(PATH="$bin:$PATH" command -v rabbitmq-server)" >&2
  exit 0
fi
skip() {
  echo "setup(rabbitmq): $1; skipping (only 'delay-sidecar bench rabbit-ttl' and its smoke test need" \
       "RabbitMQ: put rabbitmq-server and erl on PATH to run them)" >&2
  exit 0
}
command -v apt-get >/dev/null && command -v apt-cache >/dev/null && command -v dpkg-deb >/dev/null \
  || skip "no apt-get/dpkg-deb on this machine"
apt_opts=()
known() { apt-cache "${apt_opts[@]}" show rabbitmq-server >/dev/null 2>&1; }
if ! known; then
  # a machine whose package lists were cleaned (container images are): read the sources' lists
  # into the cache, as any user, without touching the machine's own lists
  lists="$KDS_CACHE/apt/lists"
  mkdir -p "$lists/partial" "$KDS_CACHE/apt/archives/partial"
  apt_opts=(-o "Dir::State::Lists=$lists" -o "Dir::Cache=$KDS_CACHE/apt" -o "Dir::Cache::archives=$KDS_CACHE/apt/archives"
            -o Debug::NoLocking=true)
  echo "setup(rabbitmq): apt knows no rabbitmq-server package; reading the package lists into $lists" >&2
  apt-get -q "${apt_opts[@]}" update >&2 || skip "apt-get update failed (no network?)"
  known || skip "apt knows no rabbitmq-server package"
fi
# rabbitmq-server and every erlang-* package below it (the rest of its dependencies -- adduser,
# logrotate, socat, python3 -- serve the system service, which is not used)
erlang=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances rabbitmq-server | grep -E '^erlang-[a-z0-9-]+$' | sort -u)
want=(rabbitmq-server $erlang)
# library dependencies of the Erlang runtime that are not installed here (the others are the machine's)
libs=$(apt-cache "${apt_opts[@]}" depends $erlang | awk '/^ *\|?Depends: lib/ {print $2}' | sort -u)
for l in $libs; do
  dpkg-query -W -f='${Status}' "$l" 2>/dev/null | grep -q "install ok installed" || want+=("$l")
done
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
chmod 755 "$dl"  # apt's _apt user writes the downloads when this runs as root
echo "setup(rabbitmq): fetching ${want[*]} from Debian's packages into $dest" >&2
(cd "$dl" && apt-get download -q "${apt_opts[@]}" "${want[@]}" >&2) || skip "apt-get download ${want[*]} failed (no network?)"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp" "$bin"
for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$dest.tmp"; done
rm -rf "$dest"
mv "$dest.tmp" "$dest"
root="$dest/usr/lib/erlang"
sbin=$(ls -d "$dest"/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin | tail -1)
[ -x "$sbin/rabbitmq-server" ] || skip "the unpacked rabbitmq-server has no sbin/rabbitmq-server"
# Debian's erl and start scripts hardcode ROOTDIR=/usr/lib/erlang: point them at the unpacked runtime
sed -i "s|/usr/lib/erlang|$root|g" "$root"/bin/erl "$root"/bin/start "$root"/erts-*/bin/erl "$root"/erts-*/bin/start
for tool in rabbitmq-server rabbitmqctl; do
  cat >"$bin/$tool.tmp" <<WRAP
#!/bin/sh
# written by scripts/setup.d/60-rabbitmq.sh: Debian's rabbitmq-server unpacked into $dest; its
# scripts run the erl (and escript) of the unpacked Erlang runtime
PATH="$root/bin:\$PATH" exec "$sbin/$tool" "\$@"
WRAP
  chmod 755 "$bin/$tool.tmp"
  mv "$bin/$tool.tmp" "$bin/$tool"
done
echo "setup(rabbitmq): RabbitMQ $(basename "$(dirname "$sbin")" | sed 's/rabbitmq_server-//') and Erlang" \
     "$(cat "$root"/releases/*/OTP_VERSION 2>/dev/null | head -1) in $dest (nothing installed system-wide)" >&2
