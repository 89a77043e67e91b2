"""A throwaway RabbitMQ node for the ``rabbit-ttl`` peer: its own data, log and config directory,
Erlang cookie, node name, epmd, distribution and AMQP ports on loopback; stopped (SIGTERM, RabbitMQ's
orderly shutdown) and removed at the end. :meth:`RabbitServer.kill` crashes the node and
:meth:`RabbitServer.start` starts it again on its data (the peers' restart figure).

Binaries: ``rabbitmq-server`` on PATH (``scripts/setup.d/60-rabbitmq.sh`` puts Debian's, with the
Erlang runtime it needs, into the project cache). The node is started with RabbitMQ's own
environment variables, so no file outside the temp dir is read or written:

* ``HOME`` is the temp dir, which holds the ``.erlang.cookie`` (mode 0400) that the node and
  ``rabbitmqctl`` share;
* ``ERL_EPMD_PORT``: a private epmd (the Erlang port mapper) that this class starts itself on a free
  loopback port and stops afterwards, so the node neither uses nor leaves behind a machine-wide
  epmd on 4369;
* ``RABBITMQ_NODENAME`` ``kds-<uid>@localhost``, ``RABBITMQ_DIST_PORT`` (chosen again at each
  start) and the AMQP listener (``listeners.tcp.1 = 127.0.0.1:<port>``) on free ports;
* the epmd, distribution and AMQP ports all from below the kernel's ephemeral range
  (:func:`bench.ports.listener_port`): the node listens on them again after a restart, and a port in
  the ephemeral range could meanwhile be handed to some client socket as its source port (the
  restart then failed, ``eaddrinuse``);
* ``RABBITMQ_MNESIA_BASE``, ``RABBITMQ_LOG_BASE``, ``RABBITMQ_CONFIG_FILE``,
  ``RABBITMQ_ENABLED_PLUGINS_FILE`` (no plugins: the management UI is not needed),
  ``RABBITMQ_CONF_ENV_FILE`` (an empty one instead of /etc/rabbitmq/rabbitmq-env.conf).

Durability is RabbitMQ's own: durable queues, persistent messages, and publisher confirms, which a
node sends for a persistent message only once the queues it was routed to have written it to disk
(https://www.rabbitmq.com/docs/confirms#when-publishes-are-confirmed); quorum queues fsync their log
before confirming. Nothing in the config lowers it; the one tuning beyond the defaults is the
memory high watermark (:data:`CONFIG`), raised from 0.4 to 0.6 of RAM so that a benchmark backlog
does not trip publisher flow control.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pika
import psutil

from bench.ports import listener_port
from bench.workload import BenchError, kill_tree, spawn, stop_proc, uid, wait_until

CONFIG = {
    "loopback_users": "none",
    "vm_memory_high_watermark.relative": "0.6",
    "log.console": "false",
}


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a listener binds it: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def installed() -> bool:
    return shutil.which("rabbitmq-server") is not None


def _epmd() -> str:
    """The ``epmd`` of the Erlang runtime ``rabbitmq-server`` runs: the unpacked one in the cache
    (the wrapper names it), or the machine's."""
    wrapper = shutil.which("rabbitmq-server")
    if wrapper is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for part in Path(wrapper).read_text().split('"'):
                if part.endswith("/erlang/bin:$PATH"):
                    candidate = Path(part.removesuffix(":$PATH")) / "epmd"
                    if candidate.exists():
                        return str(candidate)
    found = shutil.which("epmd")
    if found is None:
        raise BenchError("no epmd next to rabbitmq-server (scripts/setup.d/60-rabbitmq.sh installs both)")
    return found


class RabbitServer:
    def __init__(self, workdir: Path) -> None:
        if not installed():
            raise BenchError("RabbitMQ (rabbitmq-server) is not installed (scripts/setup.d/60-rabbitmq.sh installs it)")
        self.dir = Path(tempfile.mkdtemp(prefix="rabbit-", dir=workdir))
        cookie = self.dir / ".erlang.cookie"
        cookie.write_text(uid() + uid())
        cookie.chmod(0o400)
        self.port = listener_port()
        self.epmd_port = listener_port()
        self.node = f"kds-{uid()}@localhost"
        self.data_dir = self.dir / "mnesia"  # the node's queues, message stores and logs
        conf = self.dir / "rabbitmq.conf"
        conf.write_text("".join(f"{k} = {v}\n" for k, v in
                                {"listeners.tcp.1": f"127.0.0.1:{self.port}", **CONFIG}.items()))
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        self.env = {
            "HOME": str(self.dir),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.data_dir),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(conf),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
        }
        # epmd in the foreground (-port, no -daemon): our child, stopped with the node
        self.epmd = spawn([_epmd(), "-port", str(self.epmd_port), "-address", "127.0.0.1"], self.dir / "epmd.log",
                          env=self.env)
        self.params = pika.ConnectionParameters(host="127.0.0.1", port=self.port, connection_attempts=1,
                                                socket_timeout=5, blocked_connection_timeout=300, heartbeat=0)
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.start()

    def start(self, timeout_s: float = 300) -> None:
        """The node on its data directory (after :meth:`kill`: what it recovers from disk); returns
        once it accepts AMQP connections (its queues recovered). Its distribution port is chosen
        afresh each start: only ``rabbitmqctl`` uses it, through epmd, so nothing depends on its
        number, and a fresh one is free now even if another listener took the old one while the
        node was down. (A client's ephemeral socket held it once, when these ports came from the
        ephemeral range: the node then refused to start, ``dist_port_already_used``.)"""
        self.env["RABBITMQ_DIST_PORT"] = str(listener_port())
        self.proc = spawn(["rabbitmq-server"], self.dir / "rabbitmq.out", env=self.env)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise BenchError(f"rabbitmq-server exited: {self.log_tail()}")
            try:
                pika.BlockingConnection(self.params).close()
                return True
            except pika.exceptions.AMQPConnectionError:
                return False

        wait_until("RabbitMQ to accept AMQP connections", up, timeout_s, 0.05)

    def restart(self) -> None:
        """An orderly stop (SIGTERM) and a start on the same data: a fresh Erlang VM, whose RSS holds
        nothing the allocators kept from earlier work."""
        with contextlib.suppress(OSError):
            stop_proc(self.proc, signal.SIGTERM, timeout_s=60)
        # the AMQP port lies below the ephemeral range, so no client socket can have been given it
        # while the node was down; but the Erlang VM may hold its listener a moment after its
        # script exits, and a start before it lets go fails with could_not_start_listener (seen in
        # the smoke test)
        wait_until(f"port {self.port} to be free", lambda: _bindable(self.port), 60, 0.05)
        self.start()

    def kill(self) -> None:
        """A crash: SIGKILL to the node's script and every process under it (the Erlang VM and its
        port programs); the private epmd, which only maps names, stays."""
        kill_tree(self.proc)

    def log_tail(self) -> str:
        logs = [*sorted((self.dir / "log").glob("*.log")), self.dir / "rabbitmq.out"]
        return "\n".join(p.read_text(errors="replace")[-400:] for p in logs if p.exists())

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.params)

    def ctl(self, *args: str) -> str:
        """``rabbitmqctl`` against this node (same cookie, node name and epmd)."""
        out = subprocess.run(["rabbitmqctl", "-n", self.node, *args], capture_output=True, text=True, check=False,
                             env={**os.environ, **self.env}, timeout=120)
        if out.returncode != 0:
            raise BenchError(f"rabbitmqctl {' '.join(args)} failed: {out.stderr[-400:]}")
        return out.stdout

    def roll_over_wal(self) -> None:
        """Close the quorum queues' write-ahead log and start a new one, as the node does by itself
        once the WAL reaches ``raft.wal_max_size_bytes`` (512 MiB): the segment writer then moves
        every queue's entries still in it into the queue's segment files (``ra_log_wal``'s
        ``force_roll_over``, through ``rabbitmqctl eval``). A throughput round calls it before its
        drain, so that every drain starts from an empty WAL: left to its size, the roll-over and
        that segment write fell into some drains and not others (back to back, 300k records each, the
        last five of six: the node's CPU per drained record 16.0-25.8 us, the rate 28.1-37.9k/s,
        spread 0.31; rolled, 24.4-27.5 us, 28.3-30.4k/s, spread 0.072)."""
        out = self.ctl("eval", "ra_log_wal:force_roll_over(ra_log_wal).")
        if out.strip() != "ok":
            raise BenchError(f"the WAL roll-over answered {out.strip()!r}")

    def queue_memory(self, queue: str) -> int:
        """The memory the node accounts to ``queue`` (``rabbitmqctl list_queues name memory``): for a
        quorum queue its Ra server process, which holds the queue's in-memory message index. Unlike
        the VM's RSS it does not depend on what the allocators kept from earlier work."""
        for line in self.ctl("list_queues", "--quiet", "--no-table-headers", "name", "memory").splitlines():
            name, _, mem = line.strip().partition("\t")
            if name == queue:
                return int(mem)
        raise BenchError(f"rabbitmqctl list_queues does not list {queue}")

    def version(self) -> str:
        with self.connect() as conn:
            props = conn._impl.server_properties  # the server's connection.start properties
        v = props.get("version", b"?")
        return v.decode() if isinstance(v, bytes) else str(v)

    def beam(self) -> psutil.Process | None:
        """The node's Erlang VM (``beam.smp``: the script ``exec``s into it, or runs it as a child)."""
        with contextlib.suppress(psutil.Error):
            main = psutil.Process(self.proc.pid)
            for p in [main, *main.children(recursive=True)]:
                if p.name().startswith("beam"):
                    return p
        return None

    def cpu_seconds(self) -> float:
        """CPU time of the node's Erlang VM so far."""
        vm = self.beam()
        if vm is None:
            return 0.0
        t = vm.cpu_times()
        return float(t.user + t.system)

    def rss_bytes(self) -> int:
        vm = self.beam()
        return int(vm.memory_info().rss) if vm is not None else 0

    def stop(self) -> None:
        # SIGTERM: RabbitMQ stops the node in order (queues closed, message stores flushed)
        with contextlib.suppress(OSError):
            stop_proc(self.proc, signal.SIGTERM, timeout_s=60)
        # the private epmd only maps this node's name: it goes with it
        with contextlib.suppress(OSError):
            stop_proc(self.epmd, signal.SIGTERM, timeout_s=10)
        shutil.rmtree(self.dir, ignore_errors=True)
