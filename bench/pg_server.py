"""A throwaway PostgreSQL server for the ``pg-poll`` peer: ``initdb`` in a temp dir, ``postgres`` on
a free loopback port, stopped (fast shutdown) and removed at the end; :meth:`PgServer.kill` and
:meth:`PgServer.start` crash and restart it on the same data directory. The port comes from below
the kernel's ephemeral range (:func:`bench.ports.listener_port`): the server listens on it again
after the restart, where the workers reconnect, and a port in the ephemeral range could meanwhile
be handed to some client socket as its source port.

Binaries: ``initdb`` and ``postgres`` on PATH (``scripts/setup.d/50-postgresql.sh`` puts Debian's
into the project cache when the machine has none). Durability is PostgreSQL's default and is said
explicitly so that no configuration file can lower it: ``fsync=on``, ``synchronous_commit=on``,
``full_page_writes=on`` (a commit returns once its WAL is flushed to disk, as the sidecar's
``fsync: batch`` checkpoint does). Tuning beyond the defaults: ``shared_buffers=256MB`` (the whole
benchmark table and its index stay cached), ``max_wal_size=2GB`` (no checkpoint forced by WAL
volume mid-round) and ``checkpoint_timeout=30min`` (each throughput round starts after a
``CHECKPOINT`` of its own and no timed one falls into a drain: bench/pg_poll.py); autovacuum stays
on, as every queue-table library relies on it to reclaim deleted rows.

PostgreSQL refuses to run as root; as root both programs run in a new user namespace
(``unshare --user --map-user``) where the process is an ordinary user that owns its data dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil
import psycopg

from bench.ports import listener_port
from bench.workload import BenchError, kill_tree, spawn, stop_proc, wait_until

SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "256MB",
    "max_wal_size": "2GB",
    "checkpoint_timeout": "30min",
    "autovacuum": "on",
}
USER = "postgres"


def installed() -> bool:
    return shutil.which("initdb") is not None and shutil.which("postgres") is not None


def _as_user() -> list[str]:
    """The command prefix that runs a program as a non-root user (empty when not root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("unshare") is None:
        raise BenchError("running as root and no unshare(1) to leave it: postgres refuses to run as root")
    return ["unshare", "--user", "--map-user=1000", "--map-group=1000"]


class PgServer:
    def __init__(self, workdir: Path) -> None:
        if not installed():
            raise BenchError("PostgreSQL (initdb, postgres) is not installed "
                             "(scripts/setup.d/50-postgresql.sh installs it)")
        self.dir = Path(tempfile.mkdtemp(prefix="pg-", dir=workdir))
        data = self.dir / "data"
        init = subprocess.run([*_as_user(), "initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
                               "--no-locale", "--no-sync"], capture_output=True, text=True, check=False)
        if init.returncode != 0:
            raise BenchError(f"initdb failed: {init.stderr[-500:]}")
        self.data = data
        self.port = listener_port()
        self.conninfo = f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres"
        self.start()

    def start(self) -> None:
        """Start the server on its data directory (after a :meth:`kill`: crash recovery replays
        the WAL from the last checkpoint) and wait until it accepts connections."""
        conf = [f"--{k}={v}" for k, v in SETTINGS.items()]
        self.proc = spawn([*_as_user(), "postgres", "-D", str(self.data), "-p", str(self.port),
                           "--listen_addresses=127.0.0.1", f"--unix_socket_directories={self.dir}", *conf],
                          self.dir / "postgres.log")

        def up() -> bool:
            if self.proc.poll() is not None:
                raise BenchError(f"postgres exited: {self.log_tail()}")
            try:
                with psycopg.connect(self.conninfo, connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                return False

        wait_until("postgres to accept connections", up, 60, 0.05)

    def kill(self) -> None:
        """A crash: SIGKILL to the postmaster and every process of the server, nothing flushed
        beyond what committed transactions already made durable."""
        kill_tree(self.proc)

    def log_tail(self) -> str:
        return (self.dir / "postgres.log").read_text(errors="replace")[-500:]

    def connect(self, autocommit: bool = True) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.conninfo, autocommit=autocommit)

    def version(self) -> str:
        with self.connect() as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def cpu_seconds(self) -> float:
        """CPU time of the whole server so far: the postmaster, its live processes (backends,
        WAL writer, checkpointer, autovacuum) and the ones that exited (counted in the
        postmaster's children times once reaped)."""
        main = psutil.Process(self.proc.pid)
        t = main.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in main.children():
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
        return float(total)

    def maintenance(self, table: str) -> dict[str, int]:
        """What the server's background work has done so far: ``table``'s autovacuums and
        autoanalyzes, and the checkpoints (timed or requested)."""
        with self.connect() as conn:
            t = conn.execute("SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
                             "WHERE relname = %s", (table,)).fetchone()
            c = conn.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()
        return {"autovacuums": int(str(t[0])) if t else 0, "autoanalyzes": int(str(t[1])) if t else 0,
                "checkpoints": int(str(c[0])) if c else 0}

    def stop(self) -> None:
        # SIGINT: PostgreSQL's fast shutdown (sessions ended, a final checkpoint)
        with contextlib.suppress(OSError):
            stop_proc(self.proc, signal.SIGINT, timeout_s=60)
        shutil.rmtree(self.dir, ignore_errors=True)
