"""Checking, before a command relies on Kafka, that it can connect, log in and do what it needs.

A client of librdkafka that cannot connect does not fail: it retries forever, and the caller's
first request ends after its time-out in ``_TRANSPORT "Broker transport failure"`` whatever the
reason. :func:`probe` makes one admin client with the command's properties, an ``error_cb`` that
keeps every error, and asks for the cluster's metadata in slices of half a second; between
slices it serves ``error_cb`` and stops as soon as an error names a cause that waiting will not
fix (a bad property, refused credentials, a failed TLS handshake: :mod:`sidecar.kafka_errors`),
so a wrong password is reported in about a second, not after the time-out. When the metadata
comes, it checks what the command needs next: Describe on its topics (a topic's metadata error),
Create for the topics that are missing (a validate-only ``CreateTopics``), Describe on its
groups, then what ``run`` needs only later, so that its absence shows now rather than at the
first failover or as a crash: Read on the topics it will read only when restoring a store (the
changelog: the operations the broker reports the principal may do on the topic, KIP-430; the
commands' Read and Write on the topics they read and write the same way, before they touch
them), and the transactional id of exactly-once (one ``InitProducerId`` from a throwaway transactional
producer with the sidecar's own id: exactly what the sidecar's producer does first, and it
fences the same predecessors that producer would fence a moment later). A refused operation is
named with the principal (``User:<sasl.username>``) that lacks it.

A TLS failure that librdkafka reports only as ``certificate verify failed`` is made precise by
:func:`tls_reason`: one handshake with Python's ``ssl`` against the first bootstrap server with
the same CA file and host name check, whose ``SSLCertVerificationError.verify_message`` names
the reason (an unknown CA, a host name mismatch, an expired certificate).

:func:`wait_until_usable` is the start of ``delay-sidecar run``: it probes until Kafka is usable,
raises :class:`KafkaUnusable` for a cause that cannot heal (the caller logs it once and exits with
its status), and for one that can (an unreachable broker, a missing ACL) answers ``/readyz`` 503
with the cause's code, logs a warning (the first, then at most one a minute) and tries again
after a back-off doubling from 1 s to 30 s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sidecar import kafka_errors as ke
from sidecar.kafka_errors import Cause
from sidecar.tls_check import tls_reason, vague_tls

if TYPE_CHECKING:
    from sidecar.config import Settings

PROBE_SLICE_S = 0.5
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
WARN_EVERY_S = 60.0
RUN_PROBE_TIMEOUT_S = 5.0  # one probe of ``run``; then a back-off before the next


class KafkaUnusable(Exception):
    """Kafka cannot be used for a reason only a configuration change fixes."""

    def __init__(self, cause: Cause) -> None:
        super().__init__(cause.message())
        self.cause = cause


class _Lines(logging.Logger):
    """The probe's librdkafka log: kept for :func:`sidecar.kafka_errors.from_log`, never printed."""

    def __init__(self) -> None:
        super().__init__("delay-sidecar.probe.librdkafka", logging.DEBUG)
        self.lines: list[str] = []

    def log(self, level: int, msg: object, *args: object, **_kwargs: Any) -> None:
        if len(args) == 3 and args[0] == "FAIL" and len(self.lines) < 1000:
            self.lines.append(str(args[2]).split("]: ", 1)[-1])


def _first_error(exc: BaseException) -> Any:
    return exc.args[0] if exc.args and hasattr(exc.args[0], "name") else None


def probe(conf: dict[str, Any], timeout_s: float, topics: Iterable[str] = (), group: str | None = None,
          create_missing: bool = False, *, groups: Iterable[str] = (), read: Iterable[str] = (),
          write: Iterable[str] = (), transactional_id: str | None = None) -> Cause | None:
    """None when Kafka answers with ``conf`` and allows what is asked, else the cause (see the
    module docstring). ``topics``: Describe is needed on each (and, with ``create_missing``,
    Create for those that do not exist); ``group`` and ``groups``: Describe on each; ``read`` and
    ``write``: Read, Write on each of these topics that exists (a refused Describe on one of them
    is reported as the Read or Write that would include it: that is the ACL the command's list
    has); ``transactional_id``: Write on it."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    read, write = list(read), list(write)
    errors: list[Any] = []
    lines = _Lines()
    conf = {"socket.connection.setup.timeout.ms": max(1000, int(timeout_s * 1000)), **conf,
            "error_cb": errors.append, "logger": lines}
    try:
        admin = AdminClient(conf)
    except KafkaException as e:
        err = _first_error(e)
        return ke.classify(err.name(), err.str()) if err is not None else None
    deadline = time.monotonic() + timeout_s
    md = None
    last: Any = None
    while md is None:
        try:
            md = admin.list_topics(timeout=max(0.05, min(PROBE_SLICE_S, deadline - time.monotonic())))
        except KafkaException as e:
            last = _first_error(e)
            admin.poll(0)  # serves error_cb and the logger
            cause = ke.of(errors)
            if cause is None or cause.code == ke.UNREACHABLE:
                cause = ke.from_log(lines.lines) or cause
            if (cause is not None and not cause.heals) or time.monotonic() >= deadline:
                cause = cause or ke.of([last] if last is not None else [])
                if cause is None:
                    return Cause(ke.UNREACHABLE, "bootstrap.servers", True, f"no answer within {timeout_s:g} s")
                return _refined(cause, conf)
    missing = []
    for topic in topics:
        # asked by name: a listing of all topics leaves out those the principal may not describe
        try:
            found = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
        except KafkaException:
            continue  # no answer now: the command's own request will say
        err = getattr(found, "error", None) if found is not None else None
        if err is not None and err.name() == "TOPIC_AUTHORIZATION_FAILED":
            needed = "Write" if topic in write else "Read" if topic in read else "Describe"
            return _denied(err, needed, f"topic {topic}", conf)
        if found is None or (err is not None and err.name() == "UNKNOWN_TOPIC_OR_PART"):
            missing.append(topic)
    if create_missing and missing:
        cause = _can_create(admin, missing, timeout_s)
        if cause is not None:
            return cause
    for name in ([group] if group is not None else []) + list(groups):
        try:
            admin.describe_consumer_groups([name], request_timeout=timeout_s)[name].result(timeout=timeout_s)
        except TimeoutError:
            continue  # no answer now (a broker just started, a loaded machine): the command's own request will say
        except KafkaException as e:
            err = _first_error(e)
            if err is not None and err.name() == "GROUP_AUTHORIZATION_FAILED":
                return _denied(err, "Describe", f"group {name}", conf)
    for operation, names in (("Read", read), ("Write", write)):
        for topic in names:
            if topic not in missing and (cause := refused(admin, operation, topic, timeout_s, conf)) is not None:
                return cause
    if transactional_id is not None:
        return _can_transact(conf, transactional_id, timeout_s)
    return None


def _denied(err: Any, operation: str, resource: str, conf: Mapping[str, Any] | None = None) -> Cause:
    cause = ke.classify(err.name(), err.str())
    assert cause is not None
    return cause.about(operation, resource, ke.principal_of(conf or {}))


def refused(admin: Any, operation: str, topic: str, timeout_s: float, conf: Mapping[str, Any]) -> Cause | None:
    """The cause when ``conf``'s principal may not do ``operation`` (Read, Write) on ``topic``,
    from the operations the broker says it may do there (a fetch would need a partition with
    records to tell; a produce would write): None when it may, when the topic does not exist, or
    when the broker does not answer now or does not say (the command's own request will tell)."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s,
                                          include_authorized_operations=True)[topic].result(timeout=timeout_s)
    except TimeoutError:
        return None  # the future's own wait ran out (concurrent.futures' TimeoutError is the builtin)
    except KafkaException as e:
        err = _first_error(e)
        if err is None or err.name() != "TOPIC_AUTHORIZATION_FAILED":
            return None
        return _denied(err, operation, f"topic {topic}", conf)  # not even Describe, which it would include
    allowed = described.authorized_operations
    if allowed is None or getattr(AclOperation, operation.upper()) in allowed or AclOperation.ALL in allowed:
        return None  # None: a broker older than KIP-430 does not say
    return Cause(ke.NOT_AUTHORIZED, "", True, f"the broker lists no {operation} on topic {topic} for this principal",
                 error="TOPIC_AUTHORIZATION_FAILED").about(operation, f"topic {topic}", ke.principal_of(conf))


def _can_transact(conf: dict[str, Any], transactional_id: str, timeout_s: float) -> Cause | None:
    """Write on ``transactional_id``: ``init_transactions`` of a producer with that id."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({**conf, "transactional.id": transactional_id})
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as e:
        err = _first_error(e)
        if err is not None and err.name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
            return _denied(err, "Write", f"transactional-id {transactional_id}", conf)
        # any other failure (a coordinator not ready yet) is the sidecar's own producer's to meet
    return None


def _can_create(admin: Any, topics: list[str], timeout_s: float) -> Cause | None:
    """A validate-only CreateTopics: may this principal create ``topics``?"""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    futures = admin.create_topics([NewTopic(t, 1, 1) for t in topics], validate_only=True,
                                  request_timeout=timeout_s)
    for topic, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
        except TimeoutError:
            continue
        except KafkaException as e:
            err = _first_error(e)
            if err is not None and err.name() in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"):
                return _denied(err, "Create", f"topic {topic} (or the cluster)")
    return None


def _refined(cause: Cause, conf: dict[str, Any]) -> Cause:
    if not vague_tls(cause):
        return cause
    why = tls_reason(conf)
    return ke.with_verify_reason(cause, why) if why else cause


def wait_until_usable(
    probe_once: Callable[[], Cause | None],
    report: Callable[[Cause | None], None],
    warn: Callable[[Cause, float], None],
    stopped: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Probe until Kafka is usable (True) or ``stopped()`` (False); raise :class:`KafkaUnusable`
    for a cause that cannot heal. ``report`` gets each cause (None once usable: ``/readyz``);
    ``warn(cause, next_try_s)`` is called for the first cause and at most once a minute after."""
    backoff = BACKOFF_FIRST_S
    warned_at = -WARN_EVERY_S
    last_code = ""
    while not stopped():
        cause = probe_once()
        report(cause)
        if cause is None:
            return True
        if not cause.heals:
            raise KafkaUnusable(cause)
        now = clock()
        if now - warned_at >= WARN_EVERY_S or cause.code != last_code:
            warn(cause, backoff)
            warned_at, last_code = now, cause.code
        end = now + backoff
        while not stopped() and clock() < end:
            sleep(min(0.2, end - clock()))
        backoff = min(BACKOFF_MAX_S, backoff * 2)
    return False


def run_probe(settings: Settings, timeout_s: float = RUN_PROBE_TIMEOUT_S) -> Callable[[], Cause | None]:
    """The probe of ``delay-sidecar run``: its properties, its topics (Create for the missing
    ones: it creates them at start) and its group; with the changelog, what a restore needs
    (Read on the changelog, Describe on the restore reader's group ``<group-id>.restore``);
    in exactly-once, its transactional id ``<group-id>.<group-instance-id>`` (the instance id
    is the one kept in the data directory, made here on a first start as the sidecar would)."""
    from sidecar.contract import restore_group
    from sidecar.engine.client_conf import client_conf

    conf = client_conf(settings)
    changelogs = [t.changelog_topic for t in settings.tenants if t.changelog_topic is not None]
    every = [x for t in settings.tenants for x in (t.ingress_topic, t.dlq_topic, t.changelog_topic)]
    topics = list(dict.fromkeys(t for t in (*every, settings.history_topic) if t))
    restoring = [restore_group(settings.group_id)] if changelogs else []
    txn_id = None
    if settings.exactly_once:
        from sidecar.engine.identity import instance_id
        from sidecar.engine.transactions import transactional_id

        settings.data_path.mkdir(parents=True, exist_ok=True)
        txn_id = transactional_id(settings.group_id, settings.group_instance_id or instance_id(settings.data_path))
    return lambda: probe(conf, timeout_s, topics, settings.group_id, create_missing=True, groups=restoring,
                         read=changelogs, transactional_id=txn_id)
