"""librdkafka's own log, through the structured logger.

Without a ``logger`` in its configuration, librdkafka prints to stderr from its own threads
(``%3|1700000000.123|FAIL|rdkafka#producer-1| ... Connection refused``): lines that bypass the
JSON log, and that a healthy run prints whenever a broker goes away before a client does (the
demo's broker stopping, the end of ``delay-sidecar run`` with its embedded broker). With
``"logger": KafkaLog(...)`` confluent-kafka sends every line to ``logger.log(level, "%s [%s] %s",
facility, client name, message)`` instead, on the thread that polls the client (it forwards the
log to the poll queue), with the syslog level mapped to a ``logging`` level: 0-2 CRITICAL,
3 ERROR, 4 WARNING, 5-6 INFO, 7 DEBUG.

:class:`KafkaLog` turns each line into one structlog event, ``kafka.log``, with ``facility``,
``client`` and ``message`` fields, at the mapped level (CRITICAL as error). One exception, by
design: a transport failure (connection refused, disconnected, a broker transport failure, a
``FAIL`` line) is *expected* while the sidecar closes a client (:meth:`KafkaLog.closing`) or
shuts down (:meth:`KafkaLog.stop`): the broker connections are being torn down, or the broker
itself is stopping first (the demo, an embedded broker). Those lines go out at debug, with the
level they would have had in ``demoted_from``. While the sidecar runs, the same lines keep their
level: a broker that refuses connections is worth an operator's look, and the loop's own
``broker.unreachable`` event says so too. Also at debug, always: librdkafka's ``CONFWARN`` that a
consumer property "will be ignored by this producer instance" (or the reverse). ``--kafka``
properties go to every client of the sidecar by design (one place for TLS, SASL, timeouts), so
``session.timeout.ms`` reaching the producer is not a mistake to fix. And at info: a warning that
says librdkafka is retrying on its own (``GETPID`` "Coordinator load in progress: retrying" from a
broker that just started): a lasting failure shows in the sidecar's own events
(``broker.unreachable``, ``publish.retry``), which say what to do.

:func:`expected_error` is the same rule for ``error_cb`` errors (``_TRANSPORT``,
``_ALL_BROKERS_DOWN``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sidecar import logs

EVENT = "kafka.log"

# The text librdkafka uses when a broker connection fails or is closed (rdkafka_broker.c,
# rdkafka_transport.c): connect failures, resets, the "Disconnected" of a closed connection and
# the "all brokers down" summary.
_TRANSPORT = re.compile(
    r"Connection refused|Disconnected|[Bb]roker transport failure|Connect to .* failed|Connection reset"
    r"|Broken pipe|Receive failed|Send failed|[Aa]ll broker connections are down|Connection setup timed out",
)
_TRANSPORT_FACILITIES = frozenset({"FAIL", "DISCONNECT", "BROKERFAIL"})
_OTHER_ROLE = re.compile(
    r"is an? (consumer|producer) property and will be ignored by this (producer|consumer) instance"
)
# A warning that ends in librdkafka retrying on its own, e.g. GETPID "Failed to acquire idempotence
# PID from broker ...: Broker: Coordinator load in progress: retrying" (a broker that just started).
_RETRYING = re.compile(r"[:,] retrying\b")
_TRANSPORT_ERRORS = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN"})


def _method(level: int) -> str:
    if level >= logging.ERROR:
        return "error"
    if level >= logging.WARNING:
        return "warning"
    if level >= logging.INFO:
        return "info"
    return "debug"


def is_transport(facility: str, message: str) -> bool:
    """True for a line that reports a broker connection failing or closing."""
    return facility in _TRANSPORT_FACILITIES or _TRANSPORT.search(message) is not None


class KafkaLog(logging.Logger):
    """The ``logger`` of every client of one sidecar (see the module docstring).

    A ``logging.Logger`` because that is what confluent-kafka documents for the key; it only
    ever calls :meth:`log`, which is overridden: no handler, no ``LogRecord``."""

    def __init__(self, name: str = "sidecar.kafka") -> None:
        super().__init__(name, logging.DEBUG)
        self._out: Any = logs.get(name)
        self.stopping = False
        self._closing = 0

    def log(self, level: int, msg: object, *args: object, **_kwargs: Any) -> None:
        if len(args) == 3:  # confluent-kafka: "%s [%s] %s", facility, client name, message
            facility, client, message = (str(a) for a in args)
        else:
            facility, client, message = "", "", (str(msg) % args if args else str(msg))
        self.emit(level, facility, client, message)

    def emit(self, level: int, facility: str, client: str, message: str) -> None:
        """One librdkafka line (``level`` a ``logging`` level) as a ``kafka.log`` event."""
        method = _method(level)
        if method != "debug" and (
            (self.quiet and is_transport(facility, message)) or _OTHER_ROLE.search(message) is not None
        ):
            self._out.debug(EVENT, facility=facility, client=client, message=message, demoted_from=method)
            return
        if method == "warning" and _RETRYING.search(message) is not None:
            self._out.info(EVENT, facility=facility, client=client, message=message, demoted_from=method)
            return
        getattr(self._out, method)(EVENT, facility=facility, client=client, message=message)

    @property
    def quiet(self) -> bool:
        """True while broker disconnects are expected: shutting down, or a client closing."""
        return self.stopping or self._closing > 0

    def stop(self) -> None:
        """The sidecar is shutting down: from now on transport failures are expected."""
        self.stopping = True

    @contextmanager
    def closing(self) -> Iterator[None]:
        """Around the close of a client while the sidecar goes on (a replaced consumer)."""
        self._closing += 1
        try:
            yield
        finally:
            self._closing -= 1


def expected_error(klog: KafkaLog | None, code_name: str) -> bool:
    """True if an ``error_cb`` error with this code name (``KafkaError.name()``) is a transport
    failure the sidecar expects now (see :attr:`KafkaLog.quiet`): the caller logs it at debug
    instead of warning and leaves readiness alone."""
    return klog is not None and klog.quiet and code_name in _TRANSPORT_ERRORS
