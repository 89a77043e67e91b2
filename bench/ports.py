"""Loopback ports for the servers the bench starts itself (RabbitMQ's AMQP, epmd and distribution
ports: :mod:`bench.rabbit_server`; PostgreSQL's: :mod:`bench.pg_server`; Redis':
:mod:`bench.redis_zset`), taken from below the kernel's ephemeral range.

A port that ``bind(("127.0.0.1", 0))`` hands out comes from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the range the kernel also
draws every client socket's source port from. A server that is stopped and started again on the same
port (the peers' restart figure) leaves that port free in between, and any ``connect()`` on the
machine may then be given it as its source port: the restart fails (RabbitMQ said ``eaddrinuse``
for AMQP and ``dist_port_already_used`` for its distribution port). The port cannot just change at
restart, as clients (the RabbitMQ bridges, the PostgreSQL workers) reconnect to it. A port below the
ephemeral range is never handed to a client socket: only a listener that asks for it by number can
take it, so :func:`listener_port` picks one in ``[20000, low - 1]`` that nothing holds now.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, when RANGE_FILE cannot be read
LOWEST = 20000  # above the registered ports most local services use (5432, 5672, 8080, 9092, ...)
ATTEMPTS = 200


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (``low, high``), or Linux's default if it cannot be read."""
    try:
        low, high = (int(part) for part in RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def _any_port() -> int:
    """A free port from the ephemeral range (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free(port: int) -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR off: any socket on the port, even a connection in TIME_WAIT, rules it out;
        # there are thousands of others to choose from
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def listener_port() -> int:
    """A loopback port below the ephemeral range that is free now, for a server's listener that must
    get the same port again after a restart. On a machine whose ephemeral range starts at 20000 or
    lower there is no such range to pick from: the kernel's choice then, as before."""
    low, _ = ephemeral_range()
    if low - 1 < LOWEST:
        return _any_port()
    for _ in range(ATTEMPTS):
        port = random.randint(LOWEST, low - 1)  # random: two benches on one machine rarely collide
        if _free(port):
            return port
    raise RuntimeError(f"no free loopback port in {LOWEST}-{low - 1} (below the ephemeral range) "
                       f"after {ATTEMPTS} tries")
