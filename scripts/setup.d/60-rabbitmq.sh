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
DEB_STEP=rabbitmq
# shellcheck source=scripts/lib/debian-packages.sh
. "$(dirname "$0")/../lib/debian-packages.sh"
deb_tools || skip "no apt-get/dpkg-deb on this machine"
known() { apt-cache "${apt_opts[@]}" show rabbitmq-server >/dev/null 2>&1; }
if ! known; then
  deb_private_lists "rabbitmq-server package"
  known || skip "apt knows no rabbitmq-server package"
fi
# rabbitmq-server and every erlang-* package below it (the rest of its dependencies -- adduser,
# logrotate, socat, python3 -- serve the system service, which is not used), and the library
# dependencies of the Erlang runtime that are not installed here (the others are the machine's)
erlang=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances rabbitmq-server | grep -E '^erlang-[a-z0-9-]+$' | sort -u)
# shellcheck disable=SC2086  # one word per package
deb_unpack "$dest" rabbitmq-server $erlang $(deb_missing_libs $erlang)
mkdir -p "$bin"
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
