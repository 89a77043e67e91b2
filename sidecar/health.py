"""``/metrics``, ``/healthz``, ``/readyz``, ``/ids/<id>`` and ``/pending`` on a tiny threaded stdlib HTTP server.

Why stdlib and a thread: the sidecar is a single event loop that must never block on a scrape,
and these endpoints are three fixed paths. ``http.server.ThreadingHTTPServer`` on a daemon
thread answers them without a web framework and without touching the loop: the loop only
writes a few plain attributes (a heartbeat float, three booleans) that the HTTP threads read.
Under the GIL those single-attribute writes and reads are atomic, so no lock is needed.

Kubernetes semantics:

``/healthz`` (liveness)
    200 while the loop's last :meth:`HealthServer.beat` is younger than ``stale_after_s`` on the
    injected clock, 503 otherwise. A stuck loop (deadlock, a hung fsync, an endless batch) is
    exactly what a restart fixes, and "the process answers HTTP" alone would not show it: this
    server lives on its own thread. ``start()`` counts as a beat, so a starting process gets one
    full ``stale_after_s`` before its first real beat; long recoveries should beat as they go
    (or be covered by a ``startupProbe``).

``/readyz`` (readiness)
    200 only when the store is ``recovered``, the consumer has its partitions ``assigned``, the
    ``broker_reachable`` flag is set and the disk lets ingress go on (``disk_ok``); 503 with a
    JSON body naming the flags that are false. ``disk_ok`` is false while ingress is paused for
    disk space and delivering cannot free enough to resume it (``sidecar.store.space``: a
    ``disk-max-bytes`` below what the assigned partitions need, or a store whose files that
    delivering cannot free fill the budget, or a volume filled by other files): the body then
    carries ``disk`` with the ``code``, the ``reason`` and the ``fix``. A pause that deliveries
    will lift is backpressure, not unreadiness. ``kafka_ok`` is false while Kafka refuses the
    sidecar for a named cause (``sidecar.kafka_errors``: ``auth-failed``, ``tls-failed``,
    ``not-authorized``, ``broker-unreachable``): the body carries ``kafka`` with the ``code``,
    the ``setting`` to change and librdkafka's ``detail``. It holds until :meth:`HealthServer.set_kafka`
    clears it (the start-up check passed, a broker is reachable again, records come again), or,
    set with ``hold`` (a missing ACL, reported again at every refused request), for
    ``kafka_hold_s`` after its last report. The ``ready`` gauge of
    :class:`~sidecar.metrics.Metrics` follows the same condition.

``/metrics``
    :meth:`Metrics.render` with ``prometheus_client.CONTENT_TYPE_LATEST``.

``/ids/<id>`` (``?partition=N`` and ``&topic=T`` optional)
    What this instance knows of a ``delay.id`` (percent-encoded bytes, as
    ``urllib.parse.quote(id, safe="")`` makes them), in the stores of ingress partition ``N`` of
    ingress topic ``T`` (a tenant's; without: every topic's): 200 with the state (pending, delivered,
    cancelled, dead-lettered), its times and target; 404 (JSON, ``state: unknown``) when no store
    here knows it; 400 for an id that cannot be one (empty, over 255 bytes, a bad partition); 503
    while the loop holds the stores longer than a second; 404 with an error when no look-up is
    wired (tests, a process without stores). The answer comes from :attr:`HealthServer.lookup`,
    ``Sidecar.lookup`` in the running sidecar, which explains how the HTTP thread reads the
    stores safely.

``/pending?after=MS&before=MS[&target=TOPIC][&id_prefix=P][&limit=N][&cursor=C]``
    This instance's page of the records pending with a due time in ``[after, before)``, in due
    order (``id_prefix`` percent-encoded bytes; ``limit`` 1..10,000, default 100; ``cursor`` a
    previous page's ``next``): 200 with ``entries`` and ``next`` when the page is full; 400 for a
    bad parameter (named); 422 for a range too wide to read within the per-request budget; 503
    while the loop holds the stores longer than a second; 500 when a store's files cannot be
    read (damage: the error names the file); 404 when no listing is wired. The answer
    comes from :attr:`HealthServer.listing`, ``Sidecar.listing`` in the running sidecar
    (``sidecar.engine.listing``); ``delay-sidecar list`` merges every owner's page
    (``sidecar.listing_client``).

The server is quiet: no access log lines on stderr (Prometheus scrapes every few seconds and
kubelet probes every few seconds; the structured log is for events that matter).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes, urlsplit

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from sidecar.contract import MAX_ID_BYTES
from sidecar.metrics import Metrics

log = structlog.get_logger(__name__)

JSON = "application/json"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: HealthServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr; a dropped scrape connection is not news.
        log.debug("http_handler_error", client=str(client_address), exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "delay-sidecar"
    sys_version = ""

    def do_GET(self) -> None:
        self._dispatch(send_body=True)

    def do_HEAD(self) -> None:
        self._dispatch(send_body=False)

    def _dispatch(self, send_body: bool) -> None:
        health = self.server.health
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        if path == "/pending":
            status, doc = health.list_pending(url.query)
            ctype, body = JSON, orjson.dumps(doc)
        elif url.path.startswith("/ids/"):
            status, doc = health.lookup_id(url.path[len("/ids/"):], url.query)
            ctype, body = JSON, orjson.dumps(doc)
        elif path == "/metrics":
            status, ctype, body = 200, CONTENT_TYPE_LATEST, health.metrics.render()
        elif path == "/healthz":
            status, doc = health.liveness()
            ctype, body = JSON, orjson.dumps(doc)
        elif path == "/readyz":
            status, doc = health.readiness()
            ctype, body = JSON, orjson.dumps(doc)
        else:
            status, ctype, body = 404, JSON, orjson.dumps({"error": "not found", "path": path})
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if send_body:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""


class HealthServer:
    """The HTTP endpoints of one sidecar process.

    ``clock`` returns seconds on the same clock the loop passes to :meth:`beat`
    (``time.monotonic`` in production, a fake in tests).
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        stale_after_s: float = 30,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.metrics = metrics
        self.clock = clock
        self.stale_after_s = stale_after_s
        self._last_beat = clock()
        self._recovered = False
        self._assigned = False
        self._broker_reachable = False
        self._disk: dict[str, str] | None = None  # why ingress cannot go on (set_disk_stalled)
        self._kafka: dict[str, str] | None = None  # why Kafka refuses the sidecar (set_kafka)
        self._kafka_until = 0.0  # on ``clock``: when that cause lapses without a new report
        self.kafka_hold_s = 15.0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # (id, partition or None, ingress topic or None) -> (HTTP status, JSON document): set by the
        # sidecar (its lookup)
        self.lookup: Callable[[bytes, int | None, str | None], tuple[int, dict[str, Any]]] | None = None
        # query string of GET /pending -> (HTTP status, JSON document): set by the sidecar (its listing)
        self.listing: Callable[[str], tuple[int, dict[str, Any]]] | None = None
        metrics.set_ready(False)

    # -- called by the event loop ------------------------------------------------------------
    def beat(self, now: float) -> None:
        """The loop is alive at ``now`` (a reading of ``clock``); call it every iteration."""
        self._last_beat = now

    def set_recovered(self, value: bool) -> None:
        self._recovered = value
        self._update_ready()

    def set_assigned(self, value: bool) -> None:
        self._assigned = value
        self._update_ready()

    def set_broker_reachable(self, value: bool) -> None:
        self._broker_reachable = value
        self._update_ready()

    def set_disk_stalled(self, code: str = "", reason: str = "", fix: str = "") -> None:
        """Ingress is paused and delivering cannot free enough space to resume it (``code``
        non-empty), or it can go on again (no arguments)."""
        self._disk = {"code": code, "reason": reason, "fix": fix} if code else None
        self._update_ready()

    def set_kafka(self, cause: dict[str, str] | None, hold: bool = True) -> None:
        """Kafka refuses the sidecar for ``cause`` (``Cause.as_dict()``), for ``kafka_hold_s``
        more with ``hold`` or until cleared; ``None`` clears it."""
        self._kafka = cause
        self._kafka_until = self.clock() + self.kafka_hold_s if hold else float("inf")
        self._update_ready()

    def kafka_cause(self) -> dict[str, str] | None:
        """The cause set by :meth:`set_kafka`, while it holds."""
        cause = self._kafka
        if cause is not None and self.clock() >= self._kafka_until:
            self._kafka = cause = None
        return cause

    @property
    def ready(self) -> bool:
        return (self._recovered and self._assigned and self._broker_reachable and self._disk is None
                and self.kafka_cause() is None)

    def _update_ready(self) -> None:
        self.metrics.set_ready(self.ready)

    # -- probe logic (pure given the clock; used by the handler and by tests) ----------------
    def liveness(self) -> tuple[int, dict[str, Any]]:
        age = self.clock() - self._last_beat
        alive = age < self.stale_after_s
        doc = {
            "status": "ok" if alive else "stale",
            "heartbeat_age_s": round(age, 3),
            "stale_after_s": self.stale_after_s,
        }
        return (200 if alive else 503), doc

    def readiness(self) -> tuple[int, dict[str, Any]]:
        flags = {
            "recovered": self._recovered,
            "assigned": self._assigned,
            "broker_reachable": self._broker_reachable,
            "disk_ok": self._disk is None,
            "kafka_ok": self.kafka_cause() is None,
        }
        not_ready = [k for k, v in flags.items() if not v]
        doc: dict[str, Any] = {"ready": not not_ready, **flags, "not_ready": not_ready}
        disk = self._disk
        if disk is not None:
            doc["disk"] = disk
        kafka = self.kafka_cause()
        if kafka is not None:
            doc["kafka"] = kafka
        return (503 if not_ready else 200), doc

    def lookup_id(self, quoted: str, query: str) -> tuple[int, dict[str, Any]]:
        """``/ids/<quoted>?<query>``: checks the request, then asks :attr:`lookup`."""
        rid = unquote_to_bytes(quoted)
        if not 1 <= len(rid) <= MAX_ID_BYTES:
            return 400, {"error": f"an id is 1..{MAX_ID_BYTES} bytes, percent-encoded in the path "
                                  f"(got {len(rid)} bytes)"}
        partition: int | None = None
        given = parse_qs(query).get("partition")
        if given:
            if not given[-1].isdigit():
                return 400, {"error": f"partition={given[-1]!r} is not a partition number (0 or more)"}
            partition = int(given[-1])
        topics = parse_qs(query).get("topic")  # a tenant's ingress topic: its stores only
        lookup = self.lookup
        if lookup is None:
            return 404, {"error": "this process has no stores to look ids up in", "state": "unknown"}
        return lookup(rid, partition, topics[-1] if topics else None)

    def list_pending(self, query: str) -> tuple[int, dict[str, Any]]:
        """``/pending?<query>``: asks :attr:`listing`."""
        listing = self.listing
        if listing is None:
            return 404, {"error": "this process has no stores to list"}
        return listing(query)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and serve on a daemon thread. Port 0 picks a free port (see :attr:`port`)."""
        if self._server is not None:
            raise RuntimeError("HealthServer already started")
        cls = _Server6 if ":" in self.host else _Server
        server = cls((self.host, self.requested_port), _Handler)
        server.health = self
        self._server = server
        self._last_beat = self.clock()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="health-http", daemon=True
        )
        self._thread.start()
        log.info("http_started", host=self.host, port=self.port)

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`), else the requested one."""
        if self._server is None:
            return self.requested_port
        return int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop serving and close the socket; idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
