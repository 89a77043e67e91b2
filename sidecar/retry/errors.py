"""What to do when publishing a due record fails: classify the error, then retry or dead-letter.

The sidecar owns a record until a delivery report says the target topic has it (docs/design.md
section 5). A failed delivery report is therefore never the end of a record; it ends in one of
two ways: published later, or published to the DLQ with reason ``delivery-failed`` (or
``not-authorized`` when the broker refused the principal Write: engine/tenant_producers.py).

Classification (:func:`classify`) sorts a ``confluent_kafka.KafkaError`` into three kinds:

``RETRIABLE``
    The record is fine, the cluster is not: timeouts, lost connections, leader elections, too few
    in-sync replicas, quota throttling. Retried *without limit* with capped, jittered backoff —
    dead-lettering a good record because a broker was down for an hour would lose it from its
    consumers' point of view. Connection-level failures that hit every topic alike
    (authentication, TLS) are here too: the DLQ is just as unreachable, and once an operator
    fixes the credentials the records should go where they were meant to. A *fatal* producer
    error (idempotence sequence broken, producer fenced) is also retriable for the record: the
    producer instance is dead, not the record — see :func:`producer_must_restart`.

``MISSING_TARGET``
    Unknown topic or partition. Usually someone has not created the topic *yet* (deploy order),
    so it is retried for a grace period (``delivery-grace``, measured from the record's first
    failure) and dead-lettered only after it.

``PERMANENT``
    The record itself can never be accepted: too large for the broker or topic, rejected by a
    record validation or topic policy, not authorised for the topic, an invalid topic name or a
    bad argument. Retried ``delivery-attempts`` times in total (a topic's ``max.message.bytes``
    or an ACL can be fixed by an operator in the meantime), then dead-lettered.

The code table below decides; ``err.retriable()`` / ``err.fatal()`` are consulted only for codes
not in it. librdkafka sets ``retriable`` on broker errors it would itself retry, but its
delivery reports arrive only *after* its own retries (``message.timeout.ms``) ran out, and a
``KafkaError`` built by hand carries ``retriable=False``, so the flag alone is not a reliable
signal. Some names differ between the Java client and librdkafka: Java's
``InvalidTopicException`` is ``TOPIC_EXCEPTION`` here, ``CorruptRecordException`` is
``INVALID_MSG``, ``NOT_LEADER_OR_FOLLOWER`` is ``NOT_LEADER_FOR_PARTITION``, and the local
"message larger than message.max.bytes" is the same ``MSG_SIZE_TOO_LARGE`` as the broker's.
Codes are looked up by name in ``sidecar/retry/codes.py`` (librdkafka's numbers; this module does
not import the client); a name absent from that table is skipped.

:class:`PublishFailurePolicy` turns (kind, attempt, first failure time, now) into
``Retry(at_ms)`` or ``DeadLetter(...)``. It is pure: the clock and the random generator are
passed in, so the event loop's fake-clock tests and these unit tests drive it directly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sidecar.contract import DELIVERY_FAILED
from sidecar.retry.backoff import Backoff, RandomSource
from sidecar.retry.codes import CODES, FATAL

if TYPE_CHECKING:
    from sidecar.config import Settings


class ErrorKind(enum.StrEnum):
    RETRIABLE = "retriable"
    MISSING_TARGET = "missing-target"
    PERMANENT = "permanent"


class KafkaErrorLike(Protocol):
    """The part of ``confluent_kafka.KafkaError`` used here (tests may pass look-alikes)."""

    def code(self) -> int: ...
    def retriable(self) -> bool: ...
    def fatal(self) -> bool: ...


_MISSING_TARGET_NAMES = (
    "_UNKNOWN_TOPIC",  # local: topic not in metadata (topic.metadata.propagation.max.ms passed)
    "UNKNOWN_TOPIC_OR_PART",  # broker: no such topic or partition
    "_UNKNOWN_PARTITION",  # local: explicit partition beyond the topic's partition count
)

_PERMANENT_NAMES = (
    # the record is too large for the producer's message.max.bytes or the topic/broker limit
    "MSG_SIZE_TOO_LARGE",
    "_MSG_SIZE_TOO_LARGE",  # not in librdkafka today; kept in case a version adds it
    "INVALID_MSG_SIZE",
    "RECORD_LIST_TOO_LARGE",
    # the broker validated the record and refused it
    "INVALID_RECORD",
    "INVALID_TIMESTAMP",  # outside the topic's message.timestamp.*.max.ms
    "POLICY_VIOLATION",
    "UNSUPPORTED_FOR_MESSAGE_FORMAT",
    # not allowed to write there
    "TOPIC_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    # the request itself is invalid
    "TOPIC_EXCEPTION",  # Java's InvalidTopicException: an illegal topic name
    "INVALID_TOPIC_EXCEPTION",  # same, under the Java name, if a version ever exports it
    "_INVALID_ARG",
    "_BAD_MSG",
    "_INVALID_TYPE",
    "_KEY_SERIALIZATION",
    "_VALUE_SERIALIZATION",
)

_RETRIABLE_NAMES = (
    # timeouts
    "_MSG_TIMED_OUT",
    "_TIMED_OUT",
    "_TIMED_OUT_QUEUE",
    "REQUEST_TIMED_OUT",
    # connectivity
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_FAIL",
    "_RESOLVE",
    "NETWORK_EXCEPTION",
    "BROKER_NOT_AVAILABLE",
    "_AUTHENTICATION",  # connection-wide: the DLQ is unreachable too; wait for the operator
    "SASL_AUTHENTICATION_FAILED",
    "_SSL",
    # leadership and replication
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "NOT_LEADER_OR_FOLLOWER",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "REPLICA_NOT_AVAILABLE",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "_ISR_INSUFF",
    "KAFKA_STORAGE_ERROR",
    "NOT_CONTROLLER",
    # load and local queues
    "THROTTLING_QUOTA_EXCEEDED",
    "_QUEUE_FULL",
    "_WAIT_CACHE",
    # the producer went away or is being torn down: the record was not delivered, send it again
    "_PURGE_QUEUE",
    "_PURGE_INFLIGHT",
    "_DESTROY",
    # idempotent-producer state errors (usually raised as fatal): a new producer fixes them
    "_FATAL",
    "_FENCED",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "DUPLICATE_SEQUENCE_NUMBER",
    "UNKNOWN_PRODUCER_ID",
    "INVALID_PRODUCER_EPOCH",
    "PRODUCER_FENCED",
    "_INCONSISTENT",
    "_GAPLESS_GUARANTEE",
)


def _codes(names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(CODES[n] for n in names if n in CODES)


MISSING_TARGET_CODES: frozenset[int] = _codes(_MISSING_TARGET_NAMES)
PERMANENT_CODES: frozenset[int] = _codes(_PERMANENT_NAMES)
RETRIABLE_CODES: frozenset[int] = _codes(_RETRIABLE_NAMES)

_NAME_BY_CODE: dict[int, str] = {v: n for n, v in CODES.items()}


def classify(err: KafkaErrorLike) -> ErrorKind:
    """The kind of a failed delivery report's error (see the module docstring)."""
    code = err.code()
    if code in MISSING_TARGET_CODES:
        return ErrorKind.MISSING_TARGET
    if code in PERMANENT_CODES:
        return ErrorKind.PERMANENT
    if code in RETRIABLE_CODES:
        return ErrorKind.RETRIABLE
    if err.fatal() or err.retriable():
        return ErrorKind.RETRIABLE
    return ErrorKind.PERMANENT


def producer_must_restart(err: KafkaErrorLike) -> bool:
    """True when the producer instance is unusable (librdkafka fatal error, e.g. the idempotent
    producer's sequence broke): close it, create a new one, and re-send what was in flight."""
    return err.fatal() or err.code() == FATAL


def describe(err: KafkaErrorLike) -> str:
    """A one-line human description for logs and ``delay.dlq.error``: ``NAME (code): text``,
    e.g. ``_MSG_TIMED_OUT (-192): Local: Message timed out``."""
    code = err.code()
    text_of = getattr(err, "str", None)  # KafkaError.str(): the reason text
    text = str(text_of()) if callable(text_of) else repr(err)
    name_of = getattr(err, "name", None)  # KafkaError.name(): every code's name, not only the table's
    name = str(name_of()) if callable(name_of) else _NAME_BY_CODE.get(code, "UNKNOWN_CODE")
    return f"{name} ({code}): {text}"


@dataclass(frozen=True, slots=True)
class Retry:
    """Publish the record again at ``at_ms`` (epoch ms, on the clock the caller passed in)."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Publish the record to the DLQ with ``delay.dlq.reason: reason`` and ``delay.dlq.error``."""

    error: str
    reason: str = DELIVERY_FAILED


Decision = Retry | DeadLetter


@dataclass(frozen=True, slots=True)
class PublishFailurePolicy:
    """Retry-or-dead-letter for a failed publish.

    ``attempt`` is the number of publish attempts that have failed so far (1 after the first
    failure); ``first_failure_ms`` is when the first of them failed. A record keeps both while
    it is being retried (the retry tier).

    * RETRIABLE: always ``Retry(now + backoff)``; there is no limit.
    * MISSING_TARGET: ``Retry`` while ``now - first_failure < grace_ms``, else ``DeadLetter``.
      The retry time is clamped to ``first_failure + grace_ms`` so there is always one attempt
      at the end of the grace period and the DLQ decision is not postponed by up to a backoff cap.
    * PERMANENT: ``Retry`` while ``attempt < max_attempts``, else ``DeadLetter`` (so
      ``max_attempts`` publishes in total).
    """

    backoff: Backoff = field(default_factory=Backoff)
    grace_ms: int = 60_000
    max_attempts: int = 5

    def __post_init__(self) -> None:
        if self.grace_ms < 0:
            raise ValueError(f"delivery-grace must be >= 0 ms, got {self.grace_ms}")
        if self.max_attempts < 1:
            raise ValueError(f"delivery-attempts must be >= 1, got {self.max_attempts}")

    @classmethod
    def from_settings(cls, settings: Settings, backoff: Backoff | None = None) -> PublishFailurePolicy:
        """The policy of ``--delivery-grace`` and ``--delivery-attempts``."""
        return cls(
            backoff=backoff if backoff is not None else Backoff(),
            grace_ms=settings.delivery_grace_ms,
            max_attempts=settings.delivery_attempts,
        )

    def decide(
        self,
        kind: ErrorKind,
        attempt: int,
        first_failure_ms: int,
        now_ms: int,
        rng: RandomSource,
        *,
        error: str = "",
    ) -> Decision:
        """Retry or dead-letter; ``error`` (e.g. :func:`describe`'s text) goes into the DLQ error."""
        if attempt < 1:
            raise ValueError(f"attempt counts failed publishes and starts at 1, got {attempt}")
        suffix = f": {error}" if error else ""
        if kind is ErrorKind.MISSING_TARGET:
            deadline = first_failure_ms + self.grace_ms
            if now_ms >= deadline:
                return DeadLetter(
                    error=f"target missing for {now_ms - first_failure_ms} ms "
                    f"(delivery-grace {self.grace_ms} ms, {attempt} attempts){suffix}"
                )
            return Retry(at_ms=min(now_ms + self.backoff.delay_ms(attempt, rng), deadline))
        if kind is ErrorKind.PERMANENT and attempt >= self.max_attempts:
            return DeadLetter(error=f"permanent publish error after {attempt} attempts{suffix}")
        return Retry(at_ms=now_ms + self.backoff.delay_ms(attempt, rng))
