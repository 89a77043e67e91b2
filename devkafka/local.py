"""A real single-node Kafka broker (KRaft, broker+controller in one JVM) for dev, CI and tests.

Why a real broker and not a fake: the sidecar's guarantees (no early delivery, no loss across
restarts, transactions, consumer-group rebalances, a broker outage in the middle of a batch) are
properties of the interaction with Kafka; a mock would only test our assumptions about it. So
``delay-sidecar dev-kafka``, the embedded default of ``delay-sidecar run`` (docs/design.md 6) and the
test session all run this class.

Two ways to get the broker, picked at :meth:`LocalKafka.start`:

* Docker (``prefer_docker`` and a Docker engine answers ``ping``): testcontainers'
  ``KafkaContainer`` in KRaft mode on a fixed host port, so that a stop/start of the same
  container keeps its address; the bootstrap is what the container advertises (usually
  ``localhost:PORT``) and ``data_dir`` is unused (data lives in the container until close()).
  Not exercised on machines without an engine (:mod:`devkafka.container`).
* Jars (the fallback, and what CI here runs): the Apache Kafka jars fetched once with Maven
  (:mod:`devkafka.jars`), started as ``java -cp 'DIR/*' kafka.Kafka server.properties``, a child
  that dies with its owner (:mod:`devkafka.jvm`).
  The data directory holds everything, so a stop/start keeps every record::

      <data_dir>/server.properties   generated on each start (same ports on a restart)
      <data_dir>/log4j2.properties   broker logging -> broker.log (never the caller's stdout)
      <data_dir>/broker.log          the broker's own log (read this when something fails)
      <data_dir>/broker.out          the JVM's stdout/stderr (crashes, JVM warnings)
      <data_dir>/kraft-logs/         log.dirs: topic partitions + the KRaft metadata log

Settings are for tests, not production: replication factor 1 for internal topics, no initial
rebalance delay, one partition by default and ``auto.create.topics.enable=false`` (the sidecar
creates its own topics; a target topic that does not exist must stay missing so the DLQ path is
real). Listeners bind 127.0.0.1 only (PLAINTEXT for clients, CONTROLLER on a second port).

Readiness means a real client answered: the port accepts and a confluent_kafka ``AdminClient``
gets metadata *from this broker* (the cluster id must match the one we formatted, so a stale
broker that happens to hold the port is never mistaken for ours).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import importlib
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from devkafka.container import DOCKER_IMAGE, docker_available, start_container, wait_container
from devkafka.jars import ensure_kafka_jars, java_executable, kafka_version
from devkafka.jvm import JvmProcess, log_tail
from devkafka.secure import SecureBroker, SecureBrokerError

__all__ = ["LocalKafka", "LocalKafkaError", "docker_available", "main_dev_kafka"]

log = logging.getLogger(__name__)

HEAP_OPTS = ("-Xms128m", "-Xmx512m")
JVM_OPTS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
# A broker whose collector never stops it for long (``LocalKafka(gc="zgc")``): ZGC's pauses are
# under a millisecond, its marking concurrent. The bench's scale scenario runs the broker beside
# the sidecar on two vCPUs, where G1's young collections stopped it for up to 316 ms (the
# threads' CPU shared with everything else): that was the broker's figure, not the sidecar's
# (the scale scenario's ``broker_gc_pause_max_ms``, docs/benchmarks.md). A fixed heap: ZGC is not
# generational on Java 17.
ZGC_OPTS = ("-Xms1g", "-Xmx1g", "-XX:+UseZGC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
GCS = ("g1", "zgc")

BROKER_SETTINGS: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    # The log cleaner allocates its dedupe buffer up front (128 MiB by default): too much for a
    # 512 MiB heap on a shared 2-core CI box; compacted topics still work with 32 MiB.
    "log.cleaner.dedupe.buffer.size": "33554432",
}
"""Broker settings fit for tests; ``LocalKafka(extra_config=...)`` overrides or adds to them."""

_NODE_ID = 1
_STOP_TIMEOUT_S = 30.0
_instances: weakref.WeakSet[LocalKafka] = weakref.WeakSet()


class LocalKafkaError(RuntimeError):
    """The local broker could not be started (the message carries the tail of its log)."""


class LocalKafka:
    """A single-node KRaft Kafka broker on 127.0.0.1, as a context manager or by explicit calls.

    ``port=0`` picks a free port (kept for the lifetime of the object, so :meth:`restart` and
    ``stop()``/``start()`` come back on the same address). ``data_dir=None`` uses a temporary
    directory that is removed by :meth:`close` / leaving the ``with`` block; a given directory is
    kept and reused (a second ``LocalKafka`` on it sees the earlier topics and records).
    """

    def __init__(
        self,
        port: int = 0,
        data_dir: Path | None = None,
        prefer_docker: bool = True,
        *,
        extra_config: Mapping[str, str] | None = None,
        gc_log: bool = False,
        gc: str = "g1",
        secure: SecureBroker | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port out of range: {port}")
        if gc not in GCS:
            raise ValueError(f"gc {gc!r}: one of {', '.join(GCS)}")
        self._gc = gc  # the broker's collector (jars mode): G1 as Kafka's scripts run it, or ZGC
        self._requested_port = port
        self._port = port
        self._controller_port = 0
        self._own_data_dir = data_dir is None
        self._data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._prefer_docker = prefer_docker
        self._extra_config = dict(extra_config or {})
        self._gc_log = gc_log  # the broker's GC pauses logged to ``gc_log_path`` (jars mode)
        self._lock = threading.RLock()
        self._mode: str | None = None  # "jars" | "docker", fixed at the first start
        self._jvm = JvmProcess()  # the broker JVM (jars mode)
        self._container: Any = None
        self._cluster_id: str | None = None
        self._jars_dir: Path | None = None
        self._bootstrap: str | None = None
        # SASL_SSL + ACLs (devkafka/secure.py); jars mode only
        self.secure = secure
        self.last_start_seconds: float | None = None
        """Wall time of the last successful :meth:`start` (JVM launch to metadata answered)."""
        _instances.add(self)

    # ----------------------------------------------------------------------------------------------
    # public API

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the running broker (raises if it was never started)."""
        if self._bootstrap is None:
            raise LocalKafkaError("broker not started")
        return self._bootstrap

    @property
    def pid(self) -> int | None:
        """PID of the broker JVM (jars mode, while running); None otherwise."""
        return self._jvm.pid

    @property
    def port(self) -> int:
        """The client port (0 until the first start picked one)."""
        return self._port

    @property
    def data_dir(self) -> Path | None:
        """Where config, logs and partitions live (jars mode); None before the first start."""
        return self._data_dir

    @property
    def log_path(self) -> Path | None:
        """``<data_dir>/broker.log`` — the first place to look when the broker misbehaves."""
        return self._data_dir / "broker.log" if self._data_dir is not None else None

    @property
    def gc_log_path(self) -> Path | None:
        """``<data_dir>/gc.log``, the broker JVM's GC log (one line per pause, wall-clock stamped)
        when started with ``gc_log=True`` in jars mode; None otherwise."""
        if not self._gc_log or self._data_dir is None or self._mode == "docker":
            return None
        return self._data_dir / "gc.log"

    @property
    def mode(self) -> str | None:
        """``"jars"`` or ``"docker"`` once started."""
        return self._mode

    @property
    def kafka_version(self) -> str | None:
        """Apache Kafka version of the jars (jars mode)."""
        return kafka_version(self._jars_dir) if self._jars_dir is not None else None

    @property
    def running(self) -> bool:
        """True while the broker process (or container) is alive."""
        if self._jvm.proc is not None:
            return self._jvm.proc.poll() is None
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.get_wrapped_container().reload()
                return bool(self._container.get_wrapped_container().status == "running")
        return False

    @property
    def exited(self) -> int | None:
        """The exit status of a broker JVM that ended by itself (a crash, its log directory
        failed): not stopped, killed or restarted through this object. None while it runs, before
        a start, in Docker mode, and while a stop or restart through this object is under way."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._jvm.poll()
        finally:
            self._lock.release()

    def describe(self) -> str:
        """One line for logs and test headers: how the broker runs and where to look."""
        if self._mode == "docker":
            return f"Kafka {DOCKER_IMAGE} (Docker) at {self._bootstrap}"
        where = f"at {self._bootstrap}, pid {self.pid}, log {self.log_path}"
        return f"Apache Kafka {self.kafka_version} (jars, KRaft) {where}"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of ``broker.out`` (the JVM's own output: a crash, a JVM
        warning) and ``broker.log``, each under a header naming its file (jars mode; "" before the
        first start or in Docker mode)."""
        return log_tail(self._data_dir, lines) if self._data_dir is not None else ""

    def start(self, timeout: float = 90) -> str:
        """Start the broker (no-op if running); return the bootstrap once a client gets metadata."""
        with self._lock:
            if self.running and self._bootstrap is not None:
                return self._bootstrap
            if self._mode is None:
                docker = self._prefer_docker and self.secure is None and docker_available()
                self._mode = "docker" if docker else "jars"
            if self._mode == "docker":
                return self._start_docker(timeout)
            return self._start_jars(timeout)

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Graceful shutdown (SIGTERM, controlled shutdown), SIGKILL once ``timeout`` passed."""
        with self._lock:
            if self._container is not None:
                with contextlib.suppress(Exception):
                    self._container.get_wrapped_container().stop(timeout=max(1, int(timeout)))
                return
            self._jvm.terminate(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown (the next start recovers the logs)."""
        with self._lock:
            if self._container is not None:
                with contextlib.suppress(Exception):
                    self._container.get_wrapped_container().kill()
                return
            self._jvm.kill()

    def restart(self, timeout: float = 90) -> str:
        """Stop gracefully, then start again on the same port and data directory."""
        with self._lock:
            self.stop()
            return self.start(timeout)

    def close(self) -> None:
        """Stop the broker and drop what this object owns (the temp data dir, the container)."""
        with self._lock:
            self.stop()
            if self._container is not None:
                with contextlib.suppress(Exception):
                    self._container.stop()
                self._container = None
            if self._own_data_dir and self._data_dir is not None:
                shutil.rmtree(self._data_dir, ignore_errors=True)
            _instances.discard(self)

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------
    # jars mode

    def _start_jars(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        if self._jars_dir is None:
            self._jars_dir = ensure_kafka_jars()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="kds-kafka-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        if self.secure is not None:
            self.secure.prepare(self._data_dir)

        self._jvm.reap()  # a JVM that died on its own since the last start
        auto_ports = self._requested_port == 0 and self._controller_port == 0
        attempts = 3 if auto_ports else 1
        for attempt in range(1, attempts + 1):
            if self._port == 0 or (auto_ports and attempt > 1):
                self._port = _free_port()
            if self._controller_port == 0 or (auto_ports and attempt > 1):
                self._controller_port = _free_port(avoid={self._port})
            for p in (self._port, self._controller_port):
                if not _port_is_free(p):
                    raise LocalKafkaError(f"port 127.0.0.1:{p} is already in use (another broker running?)")
            self._write_config()
            self._format_storage(deadline)
            try:
                return self._launch_and_wait(deadline)
            except LocalKafkaError as exc:
                if attempt < attempts and "Address already in use" in str(exc):
                    log.warning("local kafka: port race on %d, retrying", self._port)
                    continue
                raise
        raise AssertionError("unreachable")

    def _write_config(self) -> None:
        assert self._data_dir is not None
        d = self._data_dir
        props = {
            "process.roles": "broker,controller",
            "node.id": str(_NODE_ID),
            "controller.quorum.voters": f"{_NODE_ID}@127.0.0.1:{self._controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self._port},CONTROLLER://127.0.0.1:{self._controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self._port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(d / "kraft-logs"),
            **BROKER_SETTINGS,
            **(self.secure.broker_properties(self._port, self._controller_port) if self.secure else {}),
            **self._extra_config,
        }
        lines = ["# generated by devkafka.local.LocalKafka on every start; edits are lost"]
        lines += [f"{k}={v}" for k, v in props.items()]
        (d / "server.properties").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (d / "log4j2.properties").write_text(_log4j2_config(d / "broker.log"), encoding="utf-8")

    def _java_cmd(self, *args: str, heap: tuple[str, ...] | None = None, dump_cds: bool = False) -> list[str]:
        assert self._data_dir is not None and self._jars_dir is not None
        jvm = (*(heap or HEAP_OPTS), *JVM_OPTS) if self._gc == "g1" or heap else ZGC_OPTS
        return [
            java_executable(),
            *jvm,
            *self._jvm.cds_opts(self._jars_dir, dump=dump_cds),
            f"-Dlog4j2.configurationFile={self._data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self._data_dir}",
            "-cp",
            f"{self._jars_dir}/*",
            *args,
        ]

    def _format_storage(self, deadline: float) -> None:
        """``kafka-storage format`` once per data dir; afterwards the cluster id is read back."""
        assert self._data_dir is not None
        meta = self._data_dir / "kraft-logs" / "meta.properties"
        if not meta.is_file():
            cluster_id = _new_cluster_id()
            cmd = self._java_cmd(
                "kafka.tools.StorageTool",
                "format",
                "--config",
                str(self._data_dir / "server.properties"),
                "--cluster-id",
                cluster_id,
                "--ignore-formatted",
                *(self.secure.format_args() if self.secure else ()),
                heap=("-Xmx256m",),
            )
            try:
                proc = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    timeout=max(10.0, deadline - time.monotonic()),
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired as exc:
                raise LocalKafkaError("kafka-storage format timed out") from exc
            if proc.returncode != 0 or not meta.is_file():
                raise LocalKafkaError(
                    f"kafka-storage format failed (exit {proc.returncode}): "
                    f"{(proc.stdout + proc.stderr).strip()[-3000:]}"
                )
        self._cluster_id = _read_properties(meta).get("cluster.id")
        if not self._cluster_id:
            raise LocalKafkaError(f"no cluster.id in {meta}")

    def _launch_and_wait(self, deadline: float) -> str:
        assert self._data_dir is not None
        bootstrap = f"127.0.0.1:{self._port}"
        started = time.monotonic()
        # ZGC logs its pauses as phases
        what = "gc,gc+phases" if self._gc == "zgc" else "gc"
        gc = [f"-Xlog:{what}:file={self._data_dir / 'gc.log'}:time,uptime"] if self._gc_log else []
        cmd = self._java_cmd(*gc, "kafka.Kafka", str(self._data_dir / "server.properties"), dump_cds=True)
        proc = self._jvm.launch(cmd, self._data_dir)
        log.info("local kafka: pid %d starting on %s (data %s)", proc.pid, bootstrap, self._data_dir)
        try:
            self._wait_ready(proc, bootstrap, deadline)
        except BaseException:
            self._jvm.kill()
            raise
        self.last_start_seconds = time.monotonic() - started
        self._bootstrap = bootstrap
        log.info("local kafka: ready on %s in %.1fs", bootstrap, self.last_start_seconds)
        return bootstrap

    def _wait_ready(self, proc: subprocess.Popen[bytes], bootstrap: str, deadline: float) -> None:
        admin: Any = None
        last_error = "port not open yet"
        while True:
            code = proc.poll()
            if code is not None:
                raise LocalKafkaError(f"broker exited with code {code} during start\n{self.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LocalKafkaError(
                    f"broker not ready on {bootstrap} within the start timeout ({last_error})\n" + self.log_tail()
                )
            if _port_accepts(self._port):
                if admin is None:
                    admin = _admin_client(bootstrap, self.secure.client_config() if self.secure else {})
                try:
                    md = admin.list_topics(timeout=max(1.0, min(10.0, remaining)))
                except Exception as exc:  # KafkaException: not answering yet
                    last_error = f"metadata: {exc}"
                else:
                    if md.cluster_id != self._cluster_id:
                        raise LocalKafkaError(
                            f"{bootstrap} answers with cluster id {md.cluster_id}, expected"
                            f" {self._cluster_id}: another broker holds the port"
                        )
                    if _NODE_ID in md.brokers:
                        return
                    last_error = f"metadata without broker {_NODE_ID}"
            time.sleep(0.2)

    # ----------------------------------------------------------------------------------------------
    # docker mode (testcontainers)

    def _start_docker(self, timeout: float) -> str:
        started = time.monotonic()
        if self._container is None and self._port == 0:
            self._port = _free_port()
        settings = {**BROKER_SETTINGS, **self._extra_config}
        self._container = start_container(self._container, self._port, settings, timeout)
        try:
            bootstrap, self._cluster_id = wait_container(
                self._container, started + timeout, lambda b: _admin_client(b, {})
            )
        except TimeoutError as exc:
            raise LocalKafkaError(str(exc)) from exc
        self.last_start_seconds = time.monotonic() - started
        self._bootstrap = bootstrap
        return bootstrap


# --------------------------------------------------------------------------------------------------
# helpers


def _admin_client(bootstrap: str, security: Mapping[str, str]) -> Any:
    admin_mod = importlib.import_module("confluent_kafka.admin")
    quiet = logging.getLogger(__name__ + ".librdkafka")
    return admin_mod.AdminClient(
        {
            "bootstrap.servers": bootstrap,
            **security,
            "socket.connection.setup.timeout.ms": 5000,
            "reconnect.backoff.max.ms": 500,
            # Connection-refused noise while the broker boots goes to logging, not stderr.
            "logger": quiet,
            "error_cb": lambda err: quiet.debug("admin error during start: %s", err),
        }
    )


def _free_port(avoid: set[int] | None = None) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not avoid or port not in avoid:
            return port


def _port_is_free(port: int) -> bool:
    """Bindable the way the JVM binds (SO_REUSEADDR, so TIME_WAIT from a previous run is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _new_cluster_id() -> str:
    """A Kafka Uuid string (url-safe base64, no padding) that does not start with '-'.

    Kafka's own ``Uuid.randomUuid`` avoids a leading '-' for the same reason: the CLI parser would
    read ``--cluster-id -abc...`` as an option and fail.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _read_properties(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _log4j2_config(log_file: Path) -> str:
    """Everything into ``broker.log`` (rolled at 50 MiB); chatty loggers at WARN."""
    return f"""\
# generated by devkafka.local.LocalKafka: the broker logs here, never to the caller's stdout
status = warn
# Kafka logs its own shutdown from its shutdown hook: keep log4j alive until the JVM is gone.
shutdownHook = disable
name = kds-local-kafka
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.filePattern = {log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@atexit.register
def _stop_all() -> None:
    """Interpreter exit: stop brokers still running so no JVM outlives a test session."""
    for kafka in list(_instances):
        with contextlib.suppress(Exception):
            kafka.close()


# --------------------------------------------------------------------------------------------------
# delay-sidecar dev-kafka


def main_dev_kafka(port: int, data_dir: Path | None, secure: SecureBroker | None = None) -> int:
    """Run a broker in the foreground: print ``bootstrap: 127.0.0.1:PORT``, block until SIGINT/SIGTERM.

    The first stdout line is the contract for scripts (``read`` it to get the address); a secured
    broker (``secure``) prints one ``user NAME: --kafka ...`` line per user after it, the client
    flags of that user. Everything else goes to stderr. Returns 0 after a clean stop, 1 if the
    broker could not start or died.
    """
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    kafka = LocalKafka(port=port, data_dir=data_dir, secure=secure)
    try:
        try:
            bootstrap = kafka.start(timeout=180)
        except (LocalKafkaError, SecureBrokerError, OSError) as exc:
            print(f"dev-kafka: could not start Kafka: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"dev-kafka: {kafka.describe()}; Ctrl-C to stop", file=sys.stderr, flush=True)
        print(f"bootstrap: {bootstrap}", flush=True)
        if secure is not None:
            print(secure.describe_users(), flush=True)
        while not stop.wait(1.0):
            if not kafka.running:
                print(f"dev-kafka: broker died\n{kafka.log_tail()}", file=sys.stderr, flush=True)
                return 1
        print("dev-kafka: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        kafka.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
