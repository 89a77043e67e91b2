"""A throwaway Spark standalone cluster from pyspark's own distribution, for tests.

The pyspark package ships ``bin/spark-class`` and ``bin/spark-submit``, so no separate Spark
download is needed: :class:`StandaloneCluster` starts one master
(``org.apache.spark.deploy.master.Master``) and N workers (``org.apache.spark.deploy.worker.Worker``)
bound to 127.0.0.1 on free ports, each in its own process group with its log in ``root/logs``.
Workers start executors as child JVMs in their work directories (``root/work/worker-<i>/app-*/<id>``),
which therefore stay in the worker's process group. :meth:`StandaloneCluster.submit` runs
``spark-submit`` (client mode: the driver is a JVM plus the Python process it starts) in a
process group of its own too.

:meth:`StandaloneCluster.stop` sends SIGTERM to every group it started, waits, sends SIGKILL to
what is left, and raises if any process of those groups is still alive afterwards (it reads
``/proc``), so a test that fails, times out or is interrupted leaves no JVM behind as long as the
fixture's finalizer runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.harness import free_port

HOST = "127.0.0.1"


def spark_home() -> Path:
    """pyspark's installation directory, which has the ``bin/`` scripts and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def live_group_members(pgid: int) -> list[int]:
    """PIDs (not zombies) whose process group is ``pgid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@dataclass
class Submitted:
    returncode: int
    stdout: Path
    stderr: Path
    seconds: float

    def log_tail(self, lines: int = 60) -> str:
        text = self.stderr.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


class StandaloneCluster:
    """A master and ``workers`` workers with ``cores`` cores and ``memory`` each (see module docs)."""

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "512m") -> None:
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.logs = root / "logs"
        self.master_port = 0
        self.master_ui_port = 0
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def worker_dir(self, i: int) -> Path:
        return self.root / "work" / f"worker-{i}"

    def env(self) -> dict[str, str]:
        conf_dir = self.root / "conf"  # empty: nothing from a spark-defaults.conf elsewhere applies
        conf_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.pop("PYTHONPATH", None)  # the job must find its own package, as it does for users
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": "256m",  # master and worker daemons (executors get --memory)
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
        })
        return env

    def _launch(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.out").open("wb") as out, (self.logs / f"{name}.err").open("wb") as err:
            proc = subprocess.Popen(
                list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env or self.env(),
                cwd=self.root, start_new_session=True,  # its own process group, killed as a whole
            )
        self._procs.append((name, proc))
        return proc

    def _state(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.master_ui_port}/json/", timeout=5) as r:
                state: dict[str, Any] = json.load(r)
                return state
        except OSError:
            return None

    def alive_workers(self) -> int:
        state = self._state() or {}
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def _log_tails(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-20:])
            for p in sorted(self.logs.glob("*.err"))
        )

    def start(self, timeout_s: float = 120.0) -> None:
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.master_port, self.master_ui_port = free_port(), free_port()
        self._launch("master", [
            spark_class, "org.apache.spark.deploy.master.Master",
            "--host", HOST, "--port", str(self.master_port), "--webui-port", str(self.master_ui_port),
        ])
        for i in range(self.workers):
            self.worker_dir(i).mkdir(parents=True, exist_ok=True)
            self._launch(f"worker-{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker",
                "--host", HOST, "--webui-port", str(free_port()), "--cores", str(self.cores),
                "--memory", self.memory, "--work-dir", str(self.worker_dir(i)), self.master_url,
            ])
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            dead = [name for name, p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"exited: {dead}" if dead else f"not up after {timeout_s:.0f} s"
                raise RuntimeError(f"Spark standalone cluster {why}\n{self._log_tails()}")
            time.sleep(0.5)

    def submit(self, args: Sequence[str], *, name: str = "submit", timeout_s: float = 300.0) -> Submitted:
        """``spark-submit --master <this cluster> ARGS``, waited for (killed after ``timeout_s``)."""
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url, *args]
        t0 = time.monotonic()
        proc = self._launch(name, cmd)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_group(proc)
            raise
        return Submitted(rc, self.logs / f"{name}.out", self.logs / f"{name}.err", time.monotonic() - t0)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
        """SIGTERM the process group of ``proc``, then SIGKILL it if anything is left."""
        pgid = proc.pid  # start_new_session: the group id is the leader's pid

        def gone() -> bool:
            return proc.poll() is not None and not live_group_members(pgid)

        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if gone():
                return
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not gone():
                time.sleep(0.2)
        if proc.poll() is None:
            proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop every process group started here (spark-submit, workers, then the master)."""
        for _, proc in reversed(self._procs):
            self._kill_group(proc)
        survivors = {name: live_group_members(p.pid) for name, p in self._procs}
        survivors = {k: v for k, v in survivors.items() if v}
        if survivors:
            raise RuntimeError(f"Spark processes survived SIGKILL: {survivors}")
