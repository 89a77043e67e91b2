#!/usr/bin/env bash
# redis-server for the `redis-zset` benchmark (delay-sidecar bench redis-zset): the Debian/Ubuntu
# package, installed with apt-get when `redis-server` is not on PATH. Needs root (CI runs as root).
# Without apt-get or root the step is skipped with a message: only that benchmark needs Redis, and
# it reports "redis-server is not installed" instead of running.
# The packaged service is not used: the benchmark starts its own redis-server on a free loopback
# port with persistence off, in a temp dir, and stops it afterwards.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
  echo "setup(redis): $(redis-server --version | awk '{print $3}') already installed" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup(redis): redis-server not found and apt-get is unavailable; skipping" \
       "(install Redis >= 6.2 yourself to run 'delay-sidecar bench redis-zset')" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup(redis): redis-server not found and not running as root; skipping" \
       "(run 'sudo apt-get install -y redis-server' to enable 'delay-sidecar bench redis-zset')" >&2
  exit 0
fi
echo "setup(redis): installing redis-server with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq redis-server >/dev/null
# The package enables and starts a system service on port 6379 where an init system runs; the
# benchmark does not need it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet redis-server 2>/dev/null; then
  systemctl stop redis-server >/dev/null 2>&1 || true
  systemctl disable redis-server >/dev/null 2>&1 || true
fi
echo "setup(redis): $(redis-server --version | awk '{print $3}') installed" >&2
