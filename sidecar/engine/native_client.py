"""The native producer (``--producer native``, and ``auto``'s choice for at-least-once):
librdkafka's producer driven from the C extension.

With it, the deliveries' producer that :class:`~sidecar.engine.kafka_io.KafkaIO` asks its
:class:`~sidecar.engine.kafka_io.Clients` for is ``sidecar._native.NativeProducer``
(``sidecar/native/producer.c``): the same librdkafka as confluent-kafka's clients, with the
interface of confluent-kafka's ``Producer`` that the engine calls (``produce`` with the same
positional order, ``poll``, ``flush``, ``purge``, ``len``, ``close``, ``error_cb`` and ``logger``).
What it saves is the Python layer per record: the hot callers (publish_due, the intake's publish of
a record due on arrival, the changelog's writes) produce through its C entry, the headers written
straight into librdkafka's, and a plain success report is served in C without a ``Message``
(docs/design.md 5.2). ``auto``, the default, takes it wherever it can run.

The C code is not linked against librdkafka: :func:`bind` finds the library confluent-kafka has
loaded (``/proc/self/maps``) and hands its path to ``rdk_bind``, which takes the functions it needs
with ``dlopen(RTLD_NOLOAD)`` and ``dlsym``. A transactional producer (``transactional.id`` in its
configuration) stays confluent-kafka's: exactly-once needs its transaction calls (the settings
refuse ``--producer native`` with ``--delivery exactly-once``; a tenant's own producers in
at-least-once take the native one as the deployment's does).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from sidecar import logs
from sidecar.engine.kafka_io import ConfluentClients
from sidecar.store.codec import NATIVE, native


class NativeUnavailable(RuntimeError):
    """The native producer cannot run here (no extension, no loaded librdkafka): the message says why."""


def librdkafka_path(maps: str = "/proc/self/maps") -> str | None:
    """The file of the librdkafka mapped into this process (confluent-kafka's), or None."""
    with open(maps, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and "/librdkafka" in parts[5] and ".so" in parts[5]:
                return parts[5].strip()
    return None


_bound: int | None = None


def bind() -> int:
    """Bind the extension to the librdkafka confluent-kafka loaded (once); its version number.
    Raises :class:`NativeUnavailable` naming what is missing."""
    global _bound
    if _bound is None:
        if not NATIVE:
            raise NativeUnavailable("--producer native needs the C extension sidecar._native (scripts/setup.sh "
                                    "builds it; KDS_PURE_PYTHON unset)")
        import confluent_kafka.cimpl  # noqa: F401  # loads librdkafka, if it is not yet

        path = librdkafka_path()
        if path is None:
            raise NativeUnavailable("--producer native: no librdkafka is mapped into this process")
        try:
            _bound = int(native.rdk_bind(path, KafkaError, KafkaException))
        except ImportError as e:
            raise NativeUnavailable(f"--producer native: {e}") from e
    return _bound


class NativeClients(ConfluentClients):
    """confluent-kafka's clients, but a non-transactional producer is the native one."""

    def __init__(self) -> None:
        version = bind()
        logs.get(__name__).info("producer.native", librdkafka=f"{version >> 24}.{version >> 16 & 0xFF}."
                                f"{version >> 8 & 0xFF}", path=librdkafka_path())

    def producer(self, conf: dict[str, Any]) -> Any:
        if "transactional.id" in conf:
            return super().producer(conf)
        return native.NativeProducer(conf)


def clients_for(producer: str, exactly_once: bool = False) -> ConfluentClients:
    """The clients for the ``producer`` setting: ``native`` (or :class:`NativeUnavailable`),
    ``confluent``, or ``auto``: native unless exactly-once or it cannot run here (the reason logged)."""
    if producer == "native":
        return NativeClients()
    if producer == "auto" and not exactly_once:
        try:
            return NativeClients()
        except NativeUnavailable as e:
            logs.get(__name__).info("producer.confluent", reason=str(e))
    return ConfluentClients()
