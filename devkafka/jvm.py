"""The dev broker's JVM as a child process: one at a time, started, stopped, killed and reaped.

:class:`devkafka.local.LocalKafka` decides *what* runs (the command line, the data directory);
this module owns *how* a JVM child lives and dies, so that a broker never outlives its owner:

* ``setpriv --pdeathsig TERM`` before the command, from the main thread: the kernel SIGTERMs the
  JVM when the owner dies, even by SIGKILL (:func:`die_with_parent_prefix`);
* its own session, so a Ctrl-C in the terminal reaches the owner (which stops the broker
  gracefully), not the JVM directly;
* stdout and stderr appended to ``<dir>/broker.out`` behind a dated ``=== start`` line, the
  place a JVM crash or warning shows up (:func:`log_tail` reads it with ``broker.log``);
* class-data sharing (:meth:`JvmProcess.cds_opts`): the first JVM that stops gracefully dumps an
  archive of the broker's classes beside the jars; later starts map it instead of reading the jars.
  An archive is adopted only after a graceful stop, since a killed JVM may leave half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from devkafka.jars import java_executable

__all__ = ["JvmProcess", "die_with_parent_prefix", "log_tail"]

log = logging.getLogger(__name__)

LOG_NAMES = ("broker.out", "broker.log")
"""The JVM's own output and the broker's log4j log, in the order :func:`log_tail` shows them."""


class JvmProcess:
    """At most one JVM child: :meth:`launch` it, then :meth:`terminate`, :meth:`kill` or :meth:`reap`."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self._cds_pending: tuple[Path, Path] | None = None  # (dumped at JVM exit, final name)

    @property
    def pid(self) -> int | None:
        """PID of the JVM while it runs; None otherwise."""
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def poll(self) -> int | None:
        """The exit status of the JVM if it ended and was not reaped yet; None otherwise."""
        return self.proc.poll() if self.proc is not None else None

    def cds_opts(self, jars_dir: Path, dump: bool) -> list[str]:
        """Class-data sharing: map the broker's thousands of classes from an archive, not the jars.

        Saves 1-1.5 s of every start (about a third on a 2-core box; outage tests restart a lot).
        The archive is dumped by the first broker that exits gracefully (``ArchiveClassesAtExit``)
        and kept beside the jars, keyed by the Java build; a stale or unreadable archive only makes
        the JVM print a warning to broker.out and start without it. ``KDS_KAFKA_CDS=0`` disables it.
        """
        if os.environ.get("KDS_KAFKA_CDS", "1") == "0":
            return []
        archive = jars_dir / f"broker-{_java_key()}.jsa"
        quiet = "-Xlog:cds*=error"  # dumping warns about every class it skips (old bytecode etc.)
        if archive.is_file():
            return [quiet, f"-XX:SharedArchiveFile={archive}"]
        if not dump or not os.access(jars_dir, os.W_OK):
            return []
        tmp = jars_dir / f".{archive.name}.{os.getpid()}-{id(self)}.tmp"
        self._cds_pending = (tmp, archive)
        return [quiet, f"-XX:ArchiveClassesAtExit={tmp}"]

    def launch(self, cmd: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in ``cwd``, its output appended to ``cwd/broker.out``."""
        self._out = open(cwd / "broker.out", "ab")  # noqa: SIM115 - lives as long as the JVM
        self._out.write(f"\n=== start {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode())
        self._out.flush()
        self.proc = subprocess.Popen(
            die_with_parent_prefix() + cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            # Own session: a Ctrl-C in the terminal reaches the owner (it stops the broker
            # gracefully), not the JVM directly.
            start_new_session=True,
        )
        return self.proc

    def terminate(self, timeout: float) -> bool:
        """SIGTERM (Kafka's controlled shutdown), SIGKILL once ``timeout`` passed; then reap.
        True when the JVM ended by itself within the timeout (or had already ended)."""
        proc = self.proc
        if proc is None:
            return False
        graceful = False
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
                graceful = True
            except subprocess.TimeoutExpired:
                log.warning("local kafka pid %d ignored SIGTERM for %.0fs, killing", proc.pid, timeout)
                self._kill(proc)
        self.reap(graceful=graceful)
        return graceful

    def kill(self) -> None:
        """SIGKILL and reap: a crash, not a shutdown."""
        if self.proc is not None:
            self._kill(self.proc)
            self.reap()

    def reap(self, graceful: bool = False) -> None:
        """Forget the exited JVM; adopt its class-data archive only after a graceful stop."""
        self.proc = None
        pending, self._cds_pending = self._cds_pending, None
        if pending is not None:
            tmp, archive = pending
            # A JVM that was killed or crashed may have left a half-written archive.
            with contextlib.suppress(OSError):
                if graceful and tmp.stat().st_size > 0:
                    os.replace(tmp, archive)
            with contextlib.suppress(OSError):
                tmp.unlink()
        if self._out is not None:
            self._out.close()
            self._out = None

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def log_tail(log_dir: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of ``broker.out`` and ``broker.log`` in ``log_dir``, each under a
    header naming its file; files missing or empty are left out (reads at most 256 KiB of each)."""
    parts = []
    for name in LOG_NAMES:
        path = log_dir / name
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace").splitlines()[-lines:]
            if text:
                parts.append(f"--- {path} (last {len(text)} lines) ---\n" + "\n".join(text))
    return "\n".join(parts)


def die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig TERM``: the kernel SIGTERMs the JVM when we die (even by SIGKILL).

    So a killed test session or ``delay-sidecar run`` never leaves an orphan broker holding its
    port. util-linux's setpriv instead of a ``preexec_fn`` calling prctl, which is unsafe in a
    process with threads (librdkafka's). PR_SET_PDEATHSIG fires when the *thread* that forked
    exits, hence only from the main thread (a start() from a short-lived worker thread would kill
    the broker when that thread ends); elsewhere the atexit hook is the only safety net.
    """
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def _java_key() -> str:
    """Short id of the Java build (a CDS archive only fits the JVM that wrote it)."""
    java = Path(java_executable()).resolve()
    try:
        st = java.stat()
        ident = f"{java}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        ident = str(java)
    return hashlib.sha1(ident.encode()).hexdigest()[:10]
