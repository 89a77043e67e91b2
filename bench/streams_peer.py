"""The Kafka Streams delay queue (the Java application in bench/streams-peer/, built into the
cache by scripts/setup.d/70-kafka-streams.sh) as a process the bench and its smoke test start.

:class:`StreamsPeerProc` runs one instance: ``java -cp 'lib/*:streams-peer.jar'
kds.streamspeer.StreamsPeer`` on an ingress topic, with an application id of its own (a fresh
consumer group reading from the earliest offset, fresh changelog topics ``<id>-pending-changelog``
and ``<id>-ids-changelog``), a static group member id (``<id>-0``: restarted in place, it takes
its tasks back at once) and a state directory in the bench's work directory. It logs JSON
lines: ``warmed`` after its warm-up (when given one), ``ready`` once Kafka Streams is RUNNING,
``done`` with its counters when stopped (SIGTERM closes Kafka Streams: the last commit, then the
counters). :class:`StreamsPeerHost` runs one JVM that serves applications one after another
(``--serve``: ``start`` and ``stop`` on its stdin), each a fresh one, as the throughput rounds
use it; :class:`HostedApp` is one of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench.workload import BenchError, LogProc, uid, wait_until

MAIN_CLASS = "kds.streamspeer.StreamsPeer"
# The punctuator's wall-clock interval: a due record waits for the next punctuation, so this is
# the floor of the lateness (uniform 0..interval, mean interval / 2), and each punctuation costs a
# RocksDB iterator over the store's head even when nothing is due. 20 ms keeps that scan under
# 1 % of a core at rest (a few us per empty scan, 50 a second) and the added lateness at 10 ms
# mean, the order of the sidecar's wheel tick.
PUNCTUATE_MS = 20
# Heap: the producer's buffers (32 MB) fit many times over (the stores have no record cache);
# RocksDB's block cache and memtables live outside the heap.
JVM_OPTS = ["-Xms256m", "-Xmx1g"]
# For a short correctness run (the smoke test): the C1 compiler alone and the serial collector
# start the JVM on less CPU, where the benchmark wants the fully optimised steady state.
QUICK_START_OPTS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
STORES = ("pending", "ids")


def home() -> Path:
    cache = Path(os.environ.get("KDS_CACHE") or Path.home() / ".cache" / "kafka-delay-sidecar")
    return cache / "streams-peer"


def installed() -> bool:
    return (home() / "streams-peer.jar").is_file() and shutil.which("java") is not None


def new_app_id() -> str:
    """A fresh application id: a fresh consumer group (read from the earliest offset) and fresh
    changelog topics."""
    return f"kds-streams-peer-{uid()}"


def java_cmd(jvm_opts: list[str] | None, warm_up: tuple[str, int] | None, tmp_dir: Path, *args: str) -> list[str]:
    """``java`` running StreamsPeer with ``args``; ``warm_up``: (topic, records) the JVM runs the
    topology on first (StreamsPeer's warm-up). ``tmp_dir`` is its ``java.io.tmpdir``: RocksDB's
    JNI loader copies its 14.5 MB library there at every start and removes it only at a normal
    exit, so each SIGKILL (the restart figure, the crash test) left one in /tmp; in the process's
    own directory it goes with the work directory."""
    lib = home()
    cmd = ["java", *JVM_OPTS, *(jvm_opts or []), f"-Djava.io.tmpdir={tmp_dir}", "-cp",
           f"{lib / 'lib'}/*:{lib / 'streams-peer.jar'}", MAIN_CLASS, *args]
    if warm_up is not None:
        cmd += ["--warm-up-ingress", warm_up[0], "--warm-up-records", str(warm_up[1])]
    return cmd


def changelog_topics(app_id: str) -> list[str]:
    """The topics Kafka Streams creates for the application's stores."""
    return [f"{app_id}-{store}-changelog" for store in STORES]


class StreamsPeerProc(LogProc):
    """One instance of the application on ``ingress`` (not started); ``jvm_opts`` beside
    :data:`JVM_OPTS`; ``warm_up``: (topic, records) the JVM runs the topology on first, as an
    application of its own (``<app id>-warm``: :func:`changelog_topics` of that id), before the
    measured one starts (its ``warmed`` line, then ``ready``)."""

    def __init__(self, workdir: Path, bootstrap: str, ingress: str, tag: str = "",
                 punctuate_ms: int = PUNCTUATE_MS, jvm_opts: list[str] | None = None,
                 warm_up: tuple[str, int] | None = None) -> None:
        self.app_id = new_app_id()
        name = f"streams-peer{'-' + tag if tag else ''}-{uid()}"
        super().__init__(name, workdir / f"{name}.log")
        self.state_dir = workdir / f"{name}.state"
        self.tmp_dir = workdir / f"{name}.tmp"
        self.cmd = java_cmd(jvm_opts, warm_up, self.tmp_dir, "--bootstrap", bootstrap, "--ingress", ingress,
                            "--application-id", self.app_id, "--state-dir", str(self.state_dir),
                            "--punctuate-ms", str(punctuate_ms))

    def start(self) -> None:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.cmd)

    def finish(self, timeout_s: float = 90) -> dict[str, Any]:
        """SIGTERM, and the ``done`` event it then logs (its counters, its CPU seconds)."""
        self.stop(signal.SIGTERM, timeout_s)
        done = self.last("done")
        if done is None:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise BenchError(f"{self.name} stopped without its done line:\n{tail}")
        return done


class StreamsPeerHost(LogProc):
    """One JVM that runs applications one after another (StreamsPeer's ``--serve``), as a
    deployment's JVM runs its application for long: the throughput rounds each start a fresh
    application (:meth:`run`: a fresh id, consumer group, changelogs and state) in this one JVM,
    rather than a JVM of their own: a JVM kept running went on getting faster over its first 3-4M
    records, so a JVM per round measured each round at its own point of that curve (4.0-6.0 us of
    CPU per record). ``warm_up`` as for :class:`StreamsPeerProc`, run once when the JVM starts."""

    def __init__(self, workdir: Path, bootstrap: str, tag: str = "", punctuate_ms: int = PUNCTUATE_MS,
                 jvm_opts: list[str] | None = None, warm_up: tuple[str, int] | None = None) -> None:
        self.app_id = f"kds-streams-host-{uid()}"  # the warm-up's application is ``<app_id>-warm``
        name = f"streams-host{'-' + tag if tag else ''}-{uid()}"
        super().__init__(name, workdir / f"{name}.log")
        self.state_dir = workdir / f"{name}.state"
        self.tmp_dir = workdir / f"{name}.tmp"
        self.cmd = java_cmd(jvm_opts, warm_up, self.tmp_dir, "--serve", "true", "--bootstrap", bootstrap,
                            "--application-id", self.app_id, "--state-dir", str(self.state_dir),
                            "--punctuate-ms", str(punctuate_ms))
        self.current: HostedApp | None = None

    def start(self, timeout_s: float) -> None:
        """Start the JVM and wait until it serves (its warm-up done)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.cmd, stdin_pipe=True)
        self.wait_event("serving", timeout_s)

    def command(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.check_alive()
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def app_event(self, event: str, app_id: str) -> dict[str, Any] | None:
        """The last ``event`` line of application ``app_id``; raises if it logged ``failed``."""
        ev: dict[str, Any]
        for ev in reversed(self.poll_events()):
            if ev.get("application_id") == app_id and ev.get("event") in (event, "failed"):
                if ev["event"] == "failed":
                    raise BenchError(f"{self.name}: application {app_id} failed ({ev.get('state')})")
                return ev
        return None

    def run(self, ingress: str, timeout_s: float, app_id: str) -> HostedApp:
        """A fresh application (``app_id``: :func:`new_app_id`) on ``ingress`` in this JVM, RUNNING;
        the one before it must have stopped (:meth:`HostedApp.finish`)."""
        if self.current is not None:
            raise BenchError(f"{self.name} still runs {self.current.app_id}")
        app = HostedApp(self, app_id)
        self.command(f"start {app.app_id} {ingress}")
        wait_until(f"{app.app_id} to run in {self.name}", lambda: self.app_event("ready", app.app_id) is not None,
                   timeout_s, 0.05, self.check_alive)
        self.current = app
        return app

    def finish(self, timeout_s: float = 90) -> int:
        """The end of stdin: the JVM closes what it runs and exits (SIGTERM after ``timeout_s``)."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        return self.stop(signal.SIGTERM, 30)


class HostedApp:
    """One application of a :class:`StreamsPeerHost`, with the part of :class:`StreamsPeerProc`'s
    interface a throughput round uses (``app_id``, ``pid``, ``check_alive``, ``finish``)."""

    def __init__(self, host: StreamsPeerHost, app_id: str) -> None:
        self.host, self.app_id = host, app_id

    @property
    def pid(self) -> int:
        return self.host.pid

    def check_alive(self) -> None:
        self.host.check_alive()

    def finish(self, timeout_s: float = 90) -> dict[str, Any]:
        """Stop the application (its last commit, its local state removed) and return its ``done``
        line (its counters, the JVM's CPU seconds so far)."""
        self.host.command("stop")
        found: list[dict[str, Any]] = []

        def done() -> bool:
            ev = self.host.app_event("done", self.app_id)
            if ev is not None:
                found.append(ev)
            return ev is not None

        wait_until(f"{self.app_id} to stop in {self.host.name}", done, timeout_s, 0.05, self.host.check_alive)
        self.host.current = None
        return found[0]
