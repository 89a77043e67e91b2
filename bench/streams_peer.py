"""The Kafka Streams delay queue (the Java application in bench/streams-peer/, built into the
cache by scripts/setup.d/70-kafka-streams.sh) as a process the bench and its smoke test start.

:class:`StreamsPeerProc` runs one instance: ``java -cp 'lib/*:streams-peer.jar'
kds.streamspeer.StreamsPeer`` on an ingress topic, with an application id of its own (a fresh
consumer group reading from the earliest offset, fresh changelog topics ``<id>-pending-changelog``
and ``<id>-ids-changelog``), a static group member id (``<id>-0``: restarted in place, it takes
its tasks back at once) and a state directory in the bench's work directory. It logs JSON
lines: ``warmed`` after its warm-up (when given one), ``ready`` once Kafka Streams is RUNNING,
``done`` with its counters when stopped (SIGTERM closes Kafka Streams: the last commit, then the
counters).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

from bench.workload import BenchError, LogProc, uid

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
        self.app_id = f"kds-streams-peer-{uid()}"
        name = f"streams-peer{'-' + tag if tag else ''}-{uid()}"
        super().__init__(name, workdir / f"{name}.log")
        lib = home()
        self.state_dir = workdir / f"{name}.state"
        self.cmd = ["java", *JVM_OPTS, *(jvm_opts or []), "-cp", f"{lib / 'lib'}/*:{lib / 'streams-peer.jar'}",
                    MAIN_CLASS,
                    "--bootstrap", bootstrap, "--ingress", ingress, "--application-id", self.app_id,
                    "--state-dir", str(self.state_dir), "--punctuate-ms", str(punctuate_ms)]
        if warm_up is not None:  # (topic, records): the JVM warmed on them first (StreamsPeer's warm-up)
            self.cmd += ["--warm-up-ingress", warm_up[0], "--warm-up-records", str(warm_up[1])]

    def start(self) -> None:
        self._spawn(self.cmd)

    def finish(self, timeout_s: float = 90) -> dict[str, Any]:
        """SIGTERM, and the ``done`` event it then logs (its counters, its CPU seconds)."""
        self.stop(signal.SIGTERM, timeout_s)
        done = self.last("done")
        if done is None:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise BenchError(f"{self.name} stopped without its done line:\n{tail}")
        return done
