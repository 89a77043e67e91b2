"""``delay-sidecar``: the one console script.

Subcommands: ``run`` (the sidecar), ``dev-kafka`` (a local single-node KRaft broker), ``send``,
``reschedule`` and ``cancel`` (client helpers), ``status`` (look an id up on the sidecar owning
it), ``list`` (the records pending in a due-time range, merged across the sidecars), ``dlq list`` /
``dlq redrive`` (dead letters, ``sidecar/dlq.py``), ``inspect`` (a data directory, read-only),
``salvage`` (copy readable records out of a damaged store), ``demo`` (the README quickstart),
``accuracy`` (the Spark accuracy job), ``bench`` (benchmarks, JSON report).

Bad input (a flag, a config key, an environment variable) gets one line that names it, the value
and the accepted forms, and exit status 2; a command that ran and failed (no broker within
``--timeout``, a record the broker refused) gets one line and exit status 1. The commands that talk
to Kafka first check that they can (``sidecar.connectivity``): a failure is one line with the
cause's code and the setting to change (refused credentials, a TLS failure, a missing ACL, no
broker), a bad librdkafka property exit status 2. They take the sidecar's ``--config`` file (its
``kafka:`` properties and brokers) and ``DELAY_SIDECAR_KAFKA_<PROP>`` as ``run`` does. ``send``,
``reschedule`` and ``cancel`` print one line per record they wrote (``--json``: one JSON object).

argparse reads ``--delay -5s`` as two options (``-5s`` looks like one), so ``main`` first joins a
value that starts with ``-`` to its option (``--delay=-5s``) unless it is itself an option of the
subcommand; the value then reaches its parser and gets the same error as any other bad value.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from sidecar import acls, devtools, tenant_option
from sidecar import contract as c
from sidecar.client import AT_FORMS, LATEST_MS
from sidecar.config import (
    DEFAULT_LEVELS,
    KAFKA_ENV_PREFIX,
    OPTIONS,
    ConfigError,
    Settings,
    env_name,
    load_settings,
    parse_levels,
)
from sidecar.durations import DURATION_FORMS, SIZE_FORMS, format_duration_ms, parse_duration_ms

if TYPE_CHECKING:
    from sidecar.engine.loop import Sidecar

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CliError(Exception):
    """Bad input: exit status 2."""


class Failed(Exception):
    """The command ran and did not succeed (no broker, a refused record): exit status 1."""


def _run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="run the sidecar",
        description="Run the sidecar. Every flag can also be set as DELAY_SIDECAR_<FLAG> or in the YAML "
                    "--config file; flags win.",
        epilog=f"DURATION: {DURATION_FORMS}. DURATIONS: durations separated by spaces or commas. "
               f"SIZE: {SIZE_FORMS}.")
    p.add_argument("--config", metavar="FILE",
                   help="YAML config file (keys: the flag names; kafka: librdkafka props; tenants: each team's "
                        "ingress-topic, dlq-topic, ..., and quotas max-pending, max-disk-bytes, "
                        "max-delivery-rate: docs/operations.md#tenants)")
    for opt in OPTIONS:
        help_text = f"{opt.help} (default: {opt.default_text()})"
        p.add_argument(f"--{opt.name}", dest=opt.name.replace("-", "_"), metavar=opt.metavar,
                       help=help_text.replace("%", "%%"))
    p.add_argument("--kafka", action="append", default=[], metavar="PROP=VALUE",
                   help="librdkafka property for every client (repeatable)")


def _settings_from_args(ns: argparse.Namespace) -> Settings:
    flags: dict[str, Any] = {opt.name: getattr(ns, opt.name.replace("-", "_")) for opt in OPTIONS}
    kafka: dict[str, str] = {}
    for item in ns.kafka:
        if "=" not in item:
            raise ConfigError(f"--kafka expects PROP=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        kafka[k.strip()] = v
    if kafka:
        flags["kafka"] = kafka
    return load_settings(flags, config_file=ns.config)


def _free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def cmd_run(ns: argparse.Namespace) -> int:
    from sidecar import logs
    from sidecar.runtime.threads import demote_self

    settings = _settings_from_args(ns)
    # a blocked write to stdout must not stall the loop: the lines go through a writer thread,
    # SCHED_BATCH so that a finished write does not preempt the loop (runtime/threads.py)
    logs.setup(settings.log_level, threaded=True,
               on_start=demote_self if settings.helper_threads != "none" else None)
    log = logs.get("sidecar")
    if (risk := acls.open_targets(settings)) is not None:
        log.warning("security.open_targets", **risk)
    broker = None
    if not settings.bootstrap_servers:
        LocalKafka = devtools.load("devkafka.local", "an embedded broker (no --bootstrap-servers)").LocalKafka

        data = settings.data_path / "_embedded-kafka"
        data.mkdir(parents=True, exist_ok=True)
        broker = LocalKafka(port=_free_port(9092), data_dir=data)
        settings.bootstrap_servers = broker.start()
        log.info("embedded_kafka.started", bootstrap=settings.bootstrap_servers, data_dir=str(data))
    from confluent_kafka import KafkaException

    from sidecar import kafka_errors
    from sidecar.connectivity import KafkaUnusable

    refused: int | None = None
    try:
        return _serve(settings)
    except KafkaUnusable as e:  # what only a configuration change fixes: one error, a documented status
        log.error("kafka.unusable", **e.cause.as_dict(), message=e.cause.message(),
                  exit_status=e.cause.exit_status)
        refused = e.cause.exit_status
        return refused
    except KafkaException as e:  # refused after the start-up check passed (e.g. an ACL revoked meanwhile)
        err = e.args[0] if e.args else None
        cause = kafka_errors.classify(err.name(), err.str()) if err is not None else None
        fields = cause.as_dict() if cause is not None else {"code": "kafka-failed", "detail": str(e)}
        log.error("kafka.unusable", **fields, message=cause.message() if cause else str(e), exit_status=1)
        refused = 1
        return 1
    finally:
        if broker is not None:
            broker.stop()
        if refused is not None:
            _exit_now(refused)


def _exit_now(status: int) -> None:
    """End a refused process now, with its documented status. Its stores are closed already (the
    loop's own shutdown ran, or it never opened them); what is left is the interpreter's teardown,
    where destroying Kafka clients the broker refuses (a transactional producer whose id was
    refused) can block for long: Kubernetes would see a hung pod, not a failed start."""
    from sidecar import logs

    logs.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _serve(settings: Settings, ready: threading.Event | None = None, stop: threading.Event | None = None,
           holder: list[Sidecar] | None = None) -> int:
    from sidecar.engine.loop import Sidecar
    from sidecar.health import HealthServer
    from sidecar.metrics import Metrics
    from sidecar.tenants import tenant_by_topic

    metrics = Metrics(ingress_topic=settings.tenants[0].ingress_topic, scheduler=settings.scheduler,
                      tenants=[t.name for t in settings.tenants], ingress_topics=tenant_by_topic(settings))
    health = None
    if settings.http_port:
        health = HealthServer(settings.http_host, settings.http_port, metrics)
        health.start()
    sidecar = Sidecar(settings, metrics=metrics, health=health)
    if health is not None:
        health.lookup = sidecar.lookup  # GET /ids/<id>
        health.listing = sidecar.listing  # GET /pending
    if holder is not None:
        holder.append(sidecar)
    if stop is None:
        sidecar.install_signal_handlers()
    else:
        def stopper() -> None:
            stop.wait()
            sidecar.stop_requested = True

        threading.Thread(target=stopper, daemon=True).start()
    if ready is not None:
        ready.set()
    try:
        if not _kafka_usable(settings, health, lambda: sidecar.stop_requested):
            return 0  # stopped while waiting for Kafka
        return sidecar.run()
    finally:
        if health is not None:
            health.stop()


def _kafka_usable(settings: Settings, health: Any, stopped: Any) -> bool:
    """Before the sidecar starts: wait until Kafka is usable, or raise ``KafkaUnusable`` for
    what cannot heal (``sidecar.connectivity``); ``/readyz`` names the cause meanwhile."""
    from sidecar import connectivity, logs

    log = logs.get("sidecar")

    def report(cause: Any) -> None:
        if health is not None:
            health.set_kafka(None if cause is None else cause.as_dict(), hold=False)

    def warn(cause: Any, next_try_s: float) -> None:
        log.warning("kafka.waiting", **cause.as_dict(), message=cause.message(), next_try_s=next_try_s)

    return connectivity.wait_until_usable(connectivity.run_probe(settings), report, warn, stopped)


def cmd_dev_kafka(ns: argparse.Namespace) -> int:
    main_dev_kafka = devtools.load("devkafka.local", "dev-kafka").main_dev_kafka
    if ns.user and not ns.secure:
        raise CliError("--user needs --secure (a plain broker has no users)")
    secure = None
    if ns.secure:
        sec = devtools.load("devkafka.secure", "dev-kafka")
        try:
            secure = sec.SecureBroker(dict.fromkeys(ns.user))
        except sec.SecureBrokerError as e:
            raise CliError(f"bad value for --user: {e}") from None
    return int(main_dev_kafka(ns.port, Path(ns.data_dir) if ns.data_dir else None, secure))


def _producer(bootstrap: str | None) -> Any:
    """A plain producer (the demo's)."""
    from confluent_kafka import Producer

    bs = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get("DELAY_SIDECAR_BOOTSTRAP_SERVERS")
    if not bs:
        raise CliError("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    return Producer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all"})


def _quiet_logger() -> logging.Logger:
    """Where librdkafka's own log lines go: nowhere. Without a logger it prints a FAIL line to
    stderr on every reconnect attempt; what matters of it reaches ``error_cb`` and the one-line
    error message."""
    log = logging.getLogger("delay-sidecar.cli.librdkafka")
    log.propagate = False
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    return log


class _Writer:
    """The producer of ``send`` / ``cancel``: checks the broker and the ingress topic first (one
    metadata request bounded by ``--timeout``), then writes one record and waits for its delivery
    report (``message.timeout.ms`` = ``--timeout``). Every failure is one line (``Failed``)."""

    def __init__(self, ns: argparse.Namespace, timeout_ms: int, kafka: dict[str, str]) -> None:
        from confluent_kafka import KafkaException, Producer

        bs = ns.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get(
            "DELAY_SIDECAR_BOOTSTRAP_SERVERS")
        if not bs:
            raise CliError("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
        self.bootstrap = bs
        self.kafka = kafka
        self.timeout_ms = timeout_ms
        self.errors: list[Any] = []
        conf: dict[str, Any] = {
            "bootstrap.servers": bs, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
            "message.timeout.ms": timeout_ms, "socket.connection.setup.timeout.ms": timeout_ms,
            **kafka,
            "logger": _quiet_logger(), "error_cb": self.errors.append,
        }
        try:
            self.producer = Producer(conf)
        except KafkaException as e:
            from sidecar.kafka_errors import classify

            err = e.args[0] if e.args else None
            cause = classify(err.name(), err.str()) if err is not None else None
            raise CliError(f"bad value for --kafka: {cause.message() if cause is not None else e}") from None

    def _last_error(self) -> str:
        from confluent_kafka import KafkaError

        self.producer.poll(0)  # serves error_cb
        for err in reversed(self.errors):
            if err.code() != KafkaError._ALL_BROKERS_DOWN:  # says less than the error before it
                text = re.sub(r"^\S+/(bootstrap|\d+): ", "", err.str())
                return re.sub(r" \((after \d+ms in state \w+|\d+ identical error\(s\) suppressed)\)", "", text)
        return ""

    def check(self, topic: str) -> None:
        from confluent_kafka import KafkaError, KafkaException

        _require_kafka(self.bootstrap, self.kafka, self.timeout_ms, (topic,), write=(topic,))
        try:
            md = self.producer.list_topics(topic=topic, timeout=self.timeout_ms / 1000)
        except KafkaException as e:
            why = self._last_error() or (e.args[0].str() if e.args else str(e))
            raise Failed(f"no answer from Kafka at {self.bootstrap} within {format_duration_ms(self.timeout_ms)} "
                         f"(--timeout): {why}") from None
        t = md.topics.get(topic)
        err = t.error if t is not None else None
        if t is None or (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise Failed(f"the ingress topic {topic!r} does not exist at {self.bootstrap} (the sidecar creates it "
                         f"when it starts; check --ingress-topic)")
        if err is not None:
            raise Failed(f"the ingress topic {topic!r} at {self.bootstrap}: {err.str()}")

    def write(self, topic: str, **kwargs: Any) -> Any:
        """Produce one record and return its delivered message (partition, offset, timestamp)."""
        from confluent_kafka import KafkaError, KafkaException

        reports: list[tuple[Any, Any]] = []
        try:
            self.producer.produce(topic, on_delivery=lambda err, msg: reports.append((err, msg)), **kwargs)
        except (KafkaException, BufferError) as e:
            raise Failed(f"could not send to {topic!r}: {e.args[0].str() if isinstance(e, KafkaException) else e}") \
                from None
        self.producer.flush(self.timeout_ms / 1000 + 5)  # the report comes within message.timeout.ms
        if not reports:
            raise Failed(f"no delivery report from Kafka at {self.bootstrap} within "
                         f"{format_duration_ms(self.timeout_ms)} (--timeout)")
        err, msg = reports[0]
        if err is not None:
            why = self._last_error() if err.code() == KafkaError._MSG_TIMED_OUT else ""  # say why it timed out
            raise Failed(f"Kafka did not take the record on {topic!r}: {err.str()}" + (f" ({why})" if why else ""))
        return msg


def _iso(ms: int) -> str:
    """Epoch ms as ISO-8601 UTC with milliseconds: ``2026-01-01T12:00:00.000Z``."""
    if not 0 <= ms <= LATEST_MS:
        return "after-year-9999"
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _emit(ns: argparse.Namespace, record: dict[str, Any], text: str) -> None:
    if ns.json:
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
        sys.stdout.flush()
    else:
        print(text, flush=True)


def _bad(flag: str, e: Exception) -> CliError:
    return CliError(f"bad value for {flag}: {e}")


def _common_inputs(ns: argparse.Namespace) -> tuple[int, dict[str, str]]:
    """--timeout and --kafka, checked before anything connects."""
    try:
        timeout_ms = parse_duration_ms(ns.timeout)
    except ValueError as e:
        raise _bad("--timeout", e) from None
    if not 1000 <= timeout_ms <= 3_600_000:
        raise CliError(f"bad value for --timeout: {ns.timeout!r} is not between 1s and 1h")
    kafka: dict[str, str] = {}
    settings = None
    if ns.config or any(k.startswith(KAFKA_ENV_PREFIX) for k in os.environ):
        # the librdkafka properties (and the brokers) of the sidecar's own configuration
        settings = load_settings({}, config_file=ns.config)
        kafka.update(settings.kafka)
        if ns.bootstrap_servers is None:
            ns.bootstrap_servers = settings.bootstrap_servers
    tenant_option.apply(ns, settings if ns.config else None)  # --tenant: its topics from the file
    for item in ns.kafka:
        if "=" not in item:
            raise CliError(f"bad value for --kafka: {item!r} is not PROP=VALUE (e.g. security.protocol=SSL)")
        k, v = item.split("=", 1)
        kafka[k.strip()] = v
    return timeout_ms, kafka


def _require_kafka(bootstrap: str, kafka: dict[str, Any], timeout_ms: int, topics: tuple[str, ...] = (), *,
                   group: str | None = None, groups: tuple[str, ...] = (), read: tuple[str, ...] = (),
                   write: tuple[str, ...] = ()) -> None:
    """One line naming the cause and the setting when Kafka cannot be used (``sidecar.connectivity``:
    ``topics``, ``groups``, ``read``, ``write`` as its ``probe`` takes them): exit status 2 for a bad
    property, 1 for the rest."""
    from sidecar import connectivity
    from sidecar.kafka_errors import BAD_CONFIG, UNREACHABLE

    cause = connectivity.probe({"bootstrap.servers": bootstrap, **kafka}, timeout_ms / 1000, topics, group,
                               groups=groups, read=read, write=write)
    if cause is None:
        return
    if cause.code == BAD_CONFIG:
        raise CliError(f"bad value for --kafka: {cause.message()}")
    if cause.code == UNREACHABLE:
        raise Failed(f"no answer from Kafka at {bootstrap} within {format_duration_ms(timeout_ms)} (--timeout): "
                     f"{cause.message()}")
    raise Failed(f"Kafka at {bootstrap}: {cause.message()}")


def cmd_send(ns: argparse.Namespace) -> int:
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

    from sidecar import client

    replace = ns.command == "reschedule"  # send with delay.id ID and delay.replace: true
    action = "reschedule" if replace else "send"

    given = [n for n, v in (("--delay", ns.delay), ("--at", ns.at), ("--level", ns.level)) if v is not None]
    if len(given) > 1:
        raise CliError(f"give at most one of --delay, --at, --level (got {', '.join(given)})")
    delay = at = level = partition = None
    levels: tuple[int, ...] = ()
    try:
        if ns.delay is not None:
            delay = client.delay_ms(ns.delay)
        if ns.at is not None:
            at = client.deliver_at_ms(ns.at)
        if ns.level is not None:
            try:
                levels = parse_levels(ns.levels)
            except ValueError as e:
                raise _bad("--levels", e) from None
            level = client.check_level(_whole(ns.level))
            if level > len(levels):
                raise ValueError(f"{ns.level!r} is beyond the {len(levels)} levels of --levels "
                                 f"({' '.join(format_duration_ms(x) for x in levels)})")
        if delay is not None and time.time() * 1000 + delay > client.LATEST_MS:
            raise ValueError(f"{ns.delay!r} reaches past the year 9999")
    except ValueError as e:
        raise _bad(given[0], e) from None
    try:
        if ns.partition is not None:
            partition = _whole(ns.partition)
        headers = client.delay_headers(ns.topic, delay=delay, at=at, level=level, target_partition=partition)
    except ValueError as e:
        raise _bad("--partition", e) from None
    if ns.id is not None:
        try:
            headers.append((c.ID, client.check_id(ns.id)))
        except ValueError as e:
            raise _bad("ID" if replace else "--id", e) from None
    if replace:
        headers.append((c.REPLACE, b"true"))
    extra: list[tuple[str, bytes]] = []
    for item in ns.header:
        if "=" not in item:
            raise CliError(f"bad value for --header: {item!r} is not NAME=VALUE")
        k, v = item.split("=", 1)
        extra.append((k, v.encode()))
    timeout_ms, kafka = _common_inputs(ns)

    w = _Writer(ns, timeout_ms, kafka)
    w.check(ns.ingress_topic)
    sent_ms = int(time.time() * 1000)
    msg = w.write(ns.ingress_topic, value=ns.value.encode() if ns.value is not None else None,
                  key=ns.key.encode() if ns.key is not None else None, headers=extra + headers, timestamp=sent_ms)
    ts_type, ts = msg.timestamp()
    base = sent_ms if ts_type == TIMESTAMP_NOT_AVAILABLE else ts  # what delay.ms and levels count from
    due = at if at is not None else base + (delay if delay is not None else levels[level - 1] if level else 0)
    rid = ns.id if ns.id is not None else f"{msg.topic()}:{msg.partition()}:{msg.offset()}"
    record: dict[str, Any] = {"action": action, "id": rid, "ingress_topic": msg.topic(), "partition": msg.partition(),
                              "offset": msg.offset(), "target_topic": ns.topic, "due": _iso(due), "due_ms": due}
    if level:
        record["level"] = level
    sent = "sent reschedule" if replace else "sent"
    _emit(ns, record, f"{sent} id={rid} ingress={msg.topic()} partition={msg.partition()} offset={msg.offset()} "
                      f"target={ns.topic} due={_iso(due)} due_ms={due}")
    return 0


def _whole(text: str) -> int:
    """An integer flag value (``--level``, ``--partition``), read here rather than by argparse's
    ``type=int`` so that ``x`` and ``-1`` get the flag's own message with its accepted forms."""
    if not re.fullmatch(r"\s*-?[0-9]+\s*", text):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


def cmd_cancel(ns: argparse.Namespace) -> int:
    from sidecar import client

    try:
        rid = client.check_id(ns.id)
    except ValueError as e:
        raise _bad("ID", e) from None
    timeout_ms, kafka = _common_inputs(ns)
    w = _Writer(ns, timeout_ms, tenant_option.producer_kafka(ns, kafka))  # --tenant: writes as the tenant
    w.check(ns.ingress_topic)
    msg = w.write(ns.ingress_topic, value=None, key=ns.key.encode(), headers=[(c.CANCEL, rid)])
    _emit(ns, {"action": "cancel", "id": ns.id, "ingress_topic": msg.topic(), "partition": msg.partition(),
               "offset": msg.offset()},
          f"sent cancel id={ns.id} ingress={msg.topic()} partition={msg.partition()} offset={msg.offset()}")
    return 0


def _group_inputs(ns: argparse.Namespace) -> tuple[int, dict[str, str], str]:
    """--timeout, --kafka and the bootstrap servers of the commands that ask the sidecars."""
    timeout_ms, kafka = _common_inputs(ns)
    bs = ns.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get(
        "DELAY_SIDECAR_BOOTSTRAP_SERVERS")
    if not bs:
        raise CliError("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    return timeout_ms, kafka, bs


def cmd_status(ns: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from sidecar import client, status

    try:
        rid = client.check_id(ns.id)
    except ValueError as e:
        raise _bad("ID", e) from None
    partition = None
    if ns.partition is not None:
        try:
            partition = _whole(ns.partition)
            if partition < 0:
                raise ValueError(f"{ns.partition!r} is negative")
        except ValueError as e:
            raise _bad("--partition", ValueError(f"{e}; a partition is 0 or more")) from None
    if ns.key is not None and not ns.key:
        raise CliError("bad value for --key: an empty key is partitioned at random; give --partition instead")
    timeout_ms, kafka, bs = _group_inputs(ns)
    timeout_s = timeout_ms / 1000
    _require_kafka(bs, kafka, timeout_ms, (ns.ingress_topic,) if ns.key is not None else (), group=ns.group)
    admin = AdminClient({"bootstrap.servers": bs, **kafka})
    if ns.key is not None:
        try:
            md = admin.list_topics(ns.ingress_topic, timeout=timeout_s)
        except KafkaException as e:
            raise Failed(f"no answer from Kafka at {bs} (--bootstrap-servers) within {ns.timeout}: {e}") from None
        topic = md.topics.get(ns.ingress_topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise Failed(f"ingress topic {ns.ingress_topic!r} (--ingress-topic) does not exist")
        partition = status.key_partition(ns.key.encode(), len(topic.partitions), ns.partitioner)
    elif partition is None:
        partition = status.default_id_partition(rid, ns.ingress_topic)
    try:
        members = status.group_members(admin, ns.group, ns.ingress_topic, timeout_s)
        doc = status.find(members, rid, partition, ns.group, timeout_s, ns.ingress_topic)
    except status.StatusError as e:
        raise Failed(str(e)) from None
    state = doc.get("state", "unknown")
    parts = [f"id={ns.id}", f"state={state}"]
    if doc.get("partition") is not None:
        parts.append(f"partition={doc['partition']}")
    if "due" in doc:
        parts.append(f"due={doc['due']}")
    if "at" in doc:
        parts.append(f"at={doc['at']}")
    if doc.get("target_topic"):
        tp = doc.get("target_partition")
        parts.append(f"target={doc['target_topic']}" + ("" if tp is None else f"[{tp}]"))
    if doc.get("reason"):
        parts.append(f"reason={doc['reason']}")
    rec = doc.get("recurring")
    if isinstance(rec, dict):  # a recurring schedule: its next firing, the count and the last one
        from sidecar.store.recent import iso_ms

        parts.append(f"schedule={rec.get('cron') or str(rec.get('every_ms')) + 'ms'}")
        parts.append(f"next-fire={iso_ms(rec['next_fire_ms']) if rec.get('next_fire_ms') is not None else '-'}")
        parts.append(f"fired={rec.get('fired')}")
        if rec.get("last_fire_ms") is not None:
            parts.append(f"last-fire={iso_ms(rec['last_fire_ms'])}")
    if doc.get("member"):
        parts.append(f"answered-by={doc['member']}")
    _emit(ns, doc, " ".join(parts))
    return 0 if state != "unknown" else 3


def _list_query(ns: argparse.Namespace) -> Any:
    """The flags of ``list`` as a ``Query``, each bad one named with its accepted forms."""
    from sidecar import client
    from sidecar.listing_client import CURSOR_FORM, parse_cursor
    from sidecar.store.listing import MAX_LIMIT, Query

    times = {}
    for flag, text in (("--due-after", ns.due_after), ("--due-before", ns.due_before)):
        try:
            times[flag] = client.deliver_at_ms(text)
        except ValueError as e:
            raise _bad(flag, e) from None
    after, before = times["--due-after"], times["--due-before"]
    if before <= after:
        raise CliError(f"bad value for --due-before: {ns.due_before!r} ({_iso(before)}) is not after --due-after "
                       f"{ns.due_after!r} ({_iso(after)}); the range is [--due-after, --due-before)")
    try:
        limit = _whole(ns.limit)
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"{ns.limit!r} is not between 1 and {MAX_LIMIT}")
    except ValueError as e:
        raise _bad("--limit", ValueError(f"{e}; entries per page, 1..{MAX_LIMIT}")) from None
    prefix = None
    if ns.id_prefix is not None:
        prefix = ns.id_prefix.encode()
        if not 1 <= len(prefix) <= c.MAX_ID_BYTES:
            raise CliError(f"bad value for --id-prefix: {len(prefix)} bytes; an id prefix is 1..{c.MAX_ID_BYTES} bytes")
    if ns.target is not None and not ns.target.strip():
        raise CliError("bad value for --target: an empty topic name; give the target topic's name")
    cursor = None
    if ns.cursor is not None:
        try:
            cursor = parse_cursor(ns.cursor)
        except ValueError as e:
            raise _bad("--cursor", ValueError(f"{e}")) from None
        if not after <= cursor[0] < before:
            raise CliError(f"bad value for --cursor: due time {cursor[0]} is outside the range; {CURSOR_FORM} "
                           "with the same --due-after and --due-before")
    return Query(after, before, ns.target, prefix, limit, cursor)


def cmd_list(ns: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient

    from sidecar import listing_client, status

    q = _list_query(ns)
    timeout_ms, kafka, bs = _group_inputs(ns)
    timeout_s = timeout_ms / 1000
    _require_kafka(bs, kafka, timeout_ms, (), group=ns.group)
    admin = AdminClient({"bootstrap.servers": bs, **kafka})
    try:
        members = status.group_members(admin, ns.group, ns.ingress_topic, timeout_s)
        doc = listing_client.list_across(members, q, timeout_s)
    except status.StatusError as e:
        raise Failed(str(e)) from None
    if ns.json:
        sys.stdout.buffer.write(orjson.dumps(doc) + b"\n")
    else:
        for ent in doc["entries"]:
            tp = ent.get("target_partition")
            print(f"{_iso(ent['due_ms'])} id={ent['id']} kind={ent['kind']} target={ent['target_topic']}"
                  + ("" if tp is None else f"[{tp}]") + f" source={ent['source']}", flush=False)
    sys.stdout.flush()
    if doc.get("restoring_partitions"):
        print(f"note: partitions {doc['restoring_partitions']} are restoring: their records are not listed yet",
              file=sys.stderr)
    if not ns.json:
        more = f"; next page: --cursor {doc['next']}" if doc.get("next") else ""
        print(f"{len(doc['entries'])} pending{more}", file=sys.stderr)
    return 0


def cmd_inspect(ns: argparse.Namespace) -> int:
    from sidecar.inspect import inspect_data_dir, render_text

    root = Path(ns.data_dir)
    if not root.is_dir():
        raise CliError(f"DATA_DIR {root} is not a directory")
    if ns.id is not None:
        from sidecar import client
        from sidecar.inspect import find_id, render_id

        try:
            rid = client.check_id(ns.id)
        except ValueError as e:
            raise _bad("--id", e) from None
        found = find_id(root, rid)
        if ns.json:
            sys.stdout.buffer.write(orjson.dumps(found, option=orjson.OPT_INDENT_2) + b"\n")
        else:
            print(render_id(found))
        return 0 if found["found"] else 3
    report = inspect_data_dir(root)
    if ns.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(render_text(report))
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    """Start a local broker and a sidecar, send a few delayed records, print them arriving."""
    import tempfile
    import uuid

    from confluent_kafka import Consumer

    from sidecar import client

    LocalKafka = devtools.load("devkafka.local", "the demo").LocalKafka

    workdir = Path(tempfile.mkdtemp(prefix="delay-sidecar-demo-"))
    print(f"starting a local Kafka broker (KRaft) in {workdir} ...", flush=True)
    with LocalKafka(port=0, data_dir=workdir / "kafka") as broker:
        bootstrap = broker.start()
        print(f"broker up at {bootstrap}", flush=True)
        settings = load_settings({"bootstrap-servers": bootstrap, "data-dir": str(workdir / "store"),
                                  "scheduler": ns.scheduler, "ingress-partitions": "1", "log-level": "warning"},
                                 environ={})
        stop = threading.Event()
        ready = threading.Event()
        holder: list[Sidecar] = []
        t = threading.Thread(target=_serve, args=(settings, ready, stop, holder), daemon=True)
        from sidecar import logs

        logs.setup("warning")
        t.start()
        ready.wait(30)
        deadline = time.time() + 60
        while not holder[0].reporting.assigned and time.time() < deadline:  # joined the group: ready to ingest
            time.sleep(0.05)
        target = f"demo.target.{uuid.uuid4().hex[:6]}"
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the result
        admin.create_topics([NewTopic(target, 1, 1)])[target].result(30)
        p = _producer(bootstrap)
        plan = [("in 1 s", {"delay": "1s"}), ("in 3 s", {"delay": "3s"}), ("level 1 (1s)", {"level": 1}),
                ("level 2 (5s)", {"level": 2}), ("at now+2.5 s", {"at": int(time.time() * 1000) + 2500}),
                ("cancelled", {"delay": "4s", "id": "demo-cancel-me"})]
        sent_at = {}
        for i, (label, kw) in enumerate(plan):
            client.send_delayed(p, target, f"message {i}: {label}".encode(), key=b"demo", **kw)  # type: ignore[arg-type]
            sent_at[i] = time.time()
        client.cancel(p, "demo-cancel-me", key=b"demo")
        p.flush(10)
        print(f"sent {len(plan)} delayed records to {settings.ingress_topic} (one then cancelled); "
              f"waiting for them on {target} ...", flush=True)
        cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})
        cons.subscribe([target])
        got = 0
        deadline = time.time() + 20
        while got < len(plan) - 1 and time.time() < deadline:
            m = cons.poll(0.2)
            if m is None or m.error():
                continue
            h: dict[str, Any] = dict(cast(Any, m.headers()) or [])
            due = int(h[c.DELIVER_AT])
            lateness = m.timestamp()[1] - due
            got += 1
            print(f"  arrived: {cast(bytes, m.value()).decode():<32} deliver-at={due} lateness={lateness} ms "
                  f"id={h[c.ID].decode()}", flush=True)
        cons.close()
        print(f"{got} of {len(plan) - 1} expected records arrived; the cancelled one did not.", flush=True)
        stop.set()
        t.join(60)
        del p, cons, admin, holder  # close every client before the broker goes away
        import gc

        gc.collect()
    return 0 if got == len(plan) - 1 else 1


def cmd_accuracy(argv: list[str]) -> int:
    from spark.cli import accuracy_main  # type: ignore[import-not-found,unused-ignore]

    return int(accuracy_main(argv))


def cmd_bench(argv: list[str]) -> int:
    return int(devtools.load("bench.cli", "bench").bench_main(argv))


def _when_args(p: argparse.ArgumentParser, levels_default: str) -> None:
    """Where and when a record sent by ``send`` or ``reschedule`` is delivered."""
    p.add_argument("--topic", required=True, help="target topic (where the sidecar delivers the record)")
    p.add_argument("--delay", metavar="DURATION", help="deliver this long after sending, e.g. 500ms, 5s, 10m, 2h")
    p.add_argument("--at", metavar="TIME", help="deliver at this time: epoch ms or ISO-8601 with a zone, "
                                                "e.g. 2026-01-01T12:00:00Z")
    p.add_argument("--level", metavar="N", help="RocketMQ-style delay level, 1-based index into --levels")
    p.add_argument("--levels", default=levels_default, metavar="DURATIONS",
                   help="the sidecar's level table, to check --level and print its due time "
                        f"(default: {levels_default}, from $DELAY_SIDECAR_LEVELS if set)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delay-sidecar", description="Delayed delivery for Kafka.")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)

    p = sub.add_parser("dev-kafka", help="start a local single-node KRaft broker and keep it running",
                       description="Start a local single-node KRaft broker (development only) and keep it "
                                   "running until Ctrl-C; prints 'bootstrap: HOST:PORT' on stdout.")
    p.add_argument("--port", type=int, default=9092, help="port of the broker's client listener (default: 9092)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="broker data directory, kept across restarts (default: a temporary directory, "
                        "deleted on exit)")
    p.add_argument("--secure", action="store_true",
                   help="SASL_SSL (SCRAM-SHA-512) with a CA made at start, ACLs enforced, a super user 'admin'; "
                        "prints each user's --kafka flags (docs/operations.md, 'Security and ACLs')")
    p.add_argument("--user", action="append", default=[], metavar="NAME",
                   help="with --secure: another SCRAM user (random password, printed; repeatable)")

    levels_default = os.environ.get(env_name("levels"), DEFAULT_LEVELS)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bootstrap-servers", default=None, metavar="HOST:PORT,...",
                        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or "
                             "$DELAY_SIDECAR_BOOTSTRAP_SERVERS)")
    common.add_argument("--ingress-topic", default=os.environ.get(env_name("ingress-topic"), "delay.ingress"),
                        metavar="TOPIC", help="the sidecar's ingress topic (default: %(default)s, from "
                                              "$DELAY_SIDECAR_INGRESS_TOPIC if set)")
    common.add_argument("--timeout", default="5s", metavar="DURATION",
                        help="give up when Kafka has not answered or acknowledged within this (default: %(default)s)")
    common.add_argument("--kafka", action="append", default=[], metavar="PROP=VALUE",
                        help="librdkafka property, e.g. security.protocol=SASL_SSL (repeatable)")
    common.add_argument("--config", metavar="FILE",
                        help="the sidecar's YAML config file: its kafka: properties and bootstrap-servers are "
                             "used (--kafka and --bootstrap-servers win); DELAY_SIDECAR_KAFKA_<PROP> too")
    common.add_argument("--json", action="store_true", help="print the result as one JSON object per record")

    epilog = ("Prints one line per record: its delay.id (default <ingress-topic>:<partition>:<offset>), the "
              "ingress partition and offset, and for send the due time (ISO-8601 UTC and epoch ms). "
              f"Exit status 2: bad input; 1: Kafka did not answer or refused the record. DURATION: {DURATION_FORMS}.")
    p = sub.add_parser("send", parents=[common], help="send one delayed record", epilog=epilog,
                       description="Send one delayed record to the ingress topic. Give at most one of --delay, "
                                   "--at, --level; none means due now.")
    _when_args(p, levels_default)
    p.add_argument("--value", required=True, help="record value (UTF-8 text)")
    p.add_argument("--key", help="record key (UTF-8 text); a later cancel or reschedule needs the same key")
    p.add_argument("--id", help="delay.id, 1..255 bytes, to cancel or deduplicate the record by "
                                "(default: <ingress-topic>:<partition>:<offset>)")
    p.add_argument("--partition", metavar="N", help="explicit target partition (default: by key, as Kafka does)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="extra header, delivered with the record (repeatable)")

    p = sub.add_parser("reschedule", parents=[common], help="replace a pending record by its delay.id",
                       epilog=epilog,
                       description="Send a record that replaces the pending record whose delay.id is ID "
                                   "(delay.replace: true): new due time, key, value and headers; once the "
                                   "sidecar stored it the old version never fires. If nothing is pending under "
                                   "ID it is scheduled as new. Give --key the message's key: the replace must "
                                   "land in the same ingress partition. At most one of --delay, --at, --level; "
                                   "none means due now.")
    p.add_argument("id", metavar="ID", help="the delay.id of the record to replace (1..255 bytes)")
    _when_args(p, levels_default)
    p.add_argument("--value", required=True, help="the new record value (UTF-8 text)")
    p.add_argument("--key", required=True,
                   help="the message's key (routes the replace to its partition); the delivered record's key")
    p.add_argument("--partition", metavar="N", help="explicit target partition (default: by key, as Kafka does)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="extra header, delivered with the record (repeatable)")

    p = sub.add_parser("cancel", parents=[common], help="cancel a pending record by its delay.id", epilog=epilog,
                       description="Send a cancel for the pending record whose delay.id is ID.")
    p.add_argument("id", metavar="ID", help="the delay.id of the record to cancel")
    p.add_argument("--key", required=True, help="the message's key (routes the cancel to its partition)")
    tenant_option.add(p)

    p = sub.add_parser(
        "status", parents=[common], help="look a delay.id up: pending, delivered, cancelled, dead-lettered",
        description="Ask the sidecar that owns the id's ingress partition (found through the consumer group; "
                    "the sidecars must run with --http-port) what it knows of the id: pending (due time, target), "
                    "or delivered / cancelled / dead-lettered while it still remembers (--status-memory).",
        epilog="Exit status 0: the id is known; 3: unknown (never seen, or its outcome is forgotten); 1: no "
               "answer (no group, no owner, no member reachable); 2: bad input. Without --key or --partition "
               "every member is asked (an id of the default form <ingress-topic>:<partition>:<offset> names its "
               "partition).")
    p.add_argument("id", metavar="ID", help="the delay.id")
    p.add_argument("--group", default=os.environ.get(env_name("group-id"), "delay-sidecar"), metavar="GROUP",
                   help="the sidecars' consumer group (default: %(default)s, from $DELAY_SIDECAR_GROUP_ID if set)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--key", help="the record's key: ask only the owner of the partition it went to")
    where.add_argument("--partition", metavar="N", help="ask only the owner of this ingress partition")
    p.add_argument("--partitioner", choices=["crc32", "murmur2"], default="crc32",
                   help="how the producer chose the partition for --key: crc32 (librdkafka/confluent-kafka "
                        "and delay-sidecar send; the default) or murmur2 (the Java client)")
    tenant_option.add(p)

    p = sub.add_parser(
        "list", parents=[common], help="list the records pending in a due-time range, across the sidecars",
        description="Ask every sidecar of the group (found through the consumer group, as status does; the "
                    "sidecars must run with --http-port) for the records pending with a due time in "
                    "[--due-after, --due-before), and print them merged in due order, a page at a time.",
        epilog=f"TIME: {AT_FORMS}. Prints one line per record (due time, id, kind, target, source), and on "
               "stderr the count and the --cursor of the next page; --json prints the page as one object "
               "(entries, next). Exit status 0: listed (none is not an error); 1: no answer (no group, a member "
               "not reachable); 2: bad input.")
    p.add_argument("--due-after", required=True, metavar="TIME", help="from this due time on (inclusive)")
    p.add_argument("--due-before", required=True, metavar="TIME", help="up to this due time (exclusive)")
    p.add_argument("--target", metavar="TOPIC", help="only records for this target topic")
    p.add_argument("--id-prefix", metavar="P", help="only records whose delay.id starts with P")
    p.add_argument("--limit", default="100", metavar="N", help="records per page, 1..10000 (default: %(default)s)")
    p.add_argument("--cursor", metavar="C", help="continue after the page that printed this next-page cursor")
    p.add_argument("--group", default=os.environ.get(env_name("group-id"), "delay-sidecar"), metavar="GROUP",
                   help="the sidecars' consumer group (default: %(default)s, from $DELAY_SIDECAR_GROUP_ID if set)")

    _dlq_parser(sub, common)
    acls.add_parser(sub)

    p = sub.add_parser("inspect", help="describe a data directory (read-only)")
    p.add_argument("data_dir", metavar="DATA_DIR", help="the sidecar's --data-dir")
    p.add_argument("--id", metavar="ID", help="look this delay.id up instead (pending, dead letter on its way, "
                                              "cancelled before its message; exit status 3 when not found)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = sub.add_parser("demo", help="local broker + sidecar + a few delayed records, printed as they arrive")
    p.add_argument("--scheduler", default="wheel", choices=["levels", "wheel"],
                   help="the sidecar's scheduler (default: %(default)s)")

    sub.add_parser("salvage", help="copy every readable record out of a damaged store (JSON lines)", add_help=False)
    sub.add_parser("accuracy", help="Spark accuracy report (see delay-sidecar accuracy --help)", add_help=False)
    sub.add_parser("bench", help="benchmarks writing a JSON report (see delay-sidecar bench --help)", add_help=False)
    return parser


def _dlq_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from sidecar.dlq import TIME_FORMS

    dlq = sub.add_parser("dlq", help="count dead letters (list) or send them back (redrive)",
                         description="Dead-letter topic tools. See docs/operations.md, 'Dead letters'.")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="list|redrive",
                              help="list: counts per reason and hour; redrive: send dead letters back")
    rng = argparse.ArgumentParser(add_help=False)
    rng.add_argument("--dlq-topic", default=os.environ.get(env_name("dlq-topic"), "delay.dlq"), metavar="TOPIC",
                     help="the sidecar's DLQ topic (default: %(default)s, from $DELAY_SIDECAR_DLQ_TOPIC if set)")
    rng.add_argument("--since", metavar="TIME", help="from the first dead letter timestamped at or after TIME "
                                                     "(default: the oldest)")
    rng.add_argument("--until", metavar="TIME", help="up to the first dead letter timestamped at or after TIME "
                                                     "(default: the newest at the start)")
    tenant_option.add(rng, dlq=True)
    epilog = f"TIME: {TIME_FORMS}. Exit status 2: bad input; 1: Kafka did not answer or a transaction failed."
    p = dsub.add_parser("list", parents=[common, rng], epilog=epilog, help="dead letters per reason and hour",
                        description="Count the dead letters of the range per reason and per --bucket of their "
                                    "timestamps, and how many of each reason were redriven.")
    p.add_argument("--reason", action="append", default=[], metavar="REASON",
                   help="only these reason codes (repeatable or comma-separated; default: all)")
    p.add_argument("--bucket", default="1h", metavar="DURATION", help="time bucket width (default: %(default)s)")
    p = dsub.add_parser("redrive", parents=[common, rng], epilog=epilog, help="send dead letters back",
                        description="Send the dead letters of the range whose reason is --reason back to their "
                                    "target topic or to the ingress topic, without the delay.dlq.* headers and "
                                    "with the original control headers. Exactly once per dead letter across runs: "
                                    "what was redriven is recorded in <dlq-topic>.redrive in the same Kafka "
                                    "transaction as the re-sent records.")
    p.add_argument("--reason", action="append", default=[], metavar="REASON", required=True,
                   help="reason codes to redrive (repeatable or comma-separated): " + ", ".join(c.REASONS))
    p.add_argument("--to", required=True, metavar="ingress|target",
                   help="target: straight to the record's target topic; ingress: back through the sidecar")
    p.add_argument("--delay", metavar="DURATION", help="with --to ingress: deliver this long after the redrive "
                                                       "instead of at the original schedule")
    p.add_argument("--dry-run", action="store_true", help="count what would be sent; send nothing")
    p.add_argument("--progress", action="store_true", help="show the progress bar on stderr even when it is not "
                                                           "a terminal")
    p.add_argument("--batch", default="10000", metavar="N", help="records per transaction (default: %(default)s)")
    p.add_argument("--rate", default="0", metavar="N", help="at most N records/s (default: no limit)")


def _dlq_job(ns: argparse.Namespace) -> Any:
    from sidecar import dlq

    now = int(time.time() * 1000)
    since = None if ns.since is None else dlq.parse_time(ns.since, "--since", now)
    until = None if ns.until is None else dlq.parse_time(ns.until, "--until", now)
    if since is not None and until is not None and until <= since:
        raise CliError(f"bad value for --until: {ns.until!r} is not after --since {ns.since!r}")
    timeout_ms, kafka = _common_inputs(ns)
    reasons = dlq.parse_reasons(ns.reason) if ns.reason or ns.dlq_command == "redrive" else ()
    job = dlq.Job("", ns.dlq_topic, ns.ingress_topic, reasons, since, until, timeout_s=timeout_ms / 1000,
                  kafka=kafka)
    if ns.dlq_command == "redrive":
        job.to, job.dry_run = ns.to, ns.dry_run
        if ns.delay is not None:
            try:
                job.delay_ms = parse_duration_ms(ns.delay)
            except ValueError as e:
                raise _bad("--delay", e) from None
        for flag, text, attr in (("--batch", ns.batch, "batch"), ("--rate", ns.rate, "rate")):
            try:
                n = _whole(text)
            except ValueError as e:
                raise _bad(flag, e) from None
            if n < (1 if flag == "--batch" else 0):
                raise CliError(f"bad value for {flag}: {text!r} is below {1 if flag == '--batch' else 0}")
            setattr(job, attr, n)
        dlq.check_destination(job)
    else:
        try:
            ns.bucket_ms = parse_duration_ms(ns.bucket)
        except ValueError as e:
            raise _bad("--bucket", e) from None
        if ns.bucket_ms <= 0:
            raise CliError(f"bad value for --bucket: {ns.bucket!r} is not above 0")
    bs = ns.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get(
        "DELAY_SIDECAR_BOOTSTRAP_SERVERS")
    if not bs:
        raise CliError("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    job.bootstrap = bs
    # what the command reads, and (unless --dry-run) what its producer writes before any target
    read = (job.dlq_topic, job.marker_topic)
    write = () if ns.dlq_command != "redrive" or job.dry_run else (
        job.marker_topic, *((job.ingress_topic,) if job.to == "ingress" else ()))
    producer_kafka = tenant_option.producer_kafka(ns, kafka)
    same = producer_kafka == kafka  # else --tenant: another principal writes
    _require_kafka(bs, kafka, timeout_ms, (ns.dlq_topic,), groups=(job.group_id,), read=read,
                   write=write if same else ())
    if write and not same:
        _require_kafka(bs, producer_kafka, timeout_ms, write=write)
    job.kafka = {**kafka, "logger": _quiet_logger()}
    job.producer_kafka = tenant_option.producer_kafka(ns, job.kafka)  # --tenant: writes as the tenant
    return job


def cmd_dlq(ns: argparse.Namespace) -> int:
    from sidecar import dlq

    try:
        job = _dlq_job(ns)
        if ns.dlq_command == "list":
            report = dlq.list_counts(job, ns.bucket_ms)
            _emit(ns, report, dlq.render_list(report, _iso))
            return 0
        summary = dlq.redrive(job, dlq.progress_stream(ns.progress))
    except dlq.DlqInputError as e:
        raise CliError(str(e)) from None
    except dlq.DlqFailed as e:
        raise Failed(str(e)) from None
    d = summary.as_dict(job)
    _emit(ns, d, dlq.render_summary(d))
    return 0


def attach_dash_values(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``--delay -5s`` -> ``--delay=-5s`` (see the module docstring), for every option of the
    chosen subcommand that takes a value, when the next word is not an option of that subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    start = next((i for i, a in enumerate(args) if subs and a in subs[0].choices), None)
    if start is None:
        return args
    sub: argparse.ArgumentParser = subs[0].choices[args[start]]
    # a nested subcommand (``dlq redrive``): its options are the ones that count
    nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    if nested and start + 1 < len(args) and args[start + 1] in nested[0].choices:
        start += 1
        sub = nested[0].choices[args[start]]
    options = sub._option_string_actions

    def action_of(word: str) -> argparse.Action | None:
        if word in options:
            return options[word]
        if word.startswith("--") and "=" not in word:  # argparse accepts unique prefixes
            found = {options[o] for o in options if o.startswith(word)}
            return found.pop() if len(found) == 1 else None
        return None

    out = args[: start + 1]
    i = start + 1
    while i < len(args):
        word = args[i]
        if word == "--":
            out += args[i:]
            break
        action = action_of(word)
        nxt = args[i + 1] if i + 1 < len(args) else None
        if (action is not None and action.nargs is None and nxt is not None and nxt.startswith("-")
                and nxt != "--" and action_of(nxt) is None and nxt not in ("-h",)):
            out.append(f"{word}={nxt}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "salvage":
        from sidecar.store.salvage import salvage_main

        return int(salvage_main(args[1:]))
    if args and args[0] in ("accuracy", "bench"):
        try:
            return cmd_accuracy(args[1:]) if args[0] == "accuracy" else cmd_bench(args[1:])
        except (CliError, ConfigError, devtools.DevToolMissing) as e:
            print(f"delay-sidecar {args[0]}: error: {e}", file=sys.stderr)
            return 2
    parser = build_parser()
    ns = parser.parse_args(attach_dash_values(parser, args))
    handlers = {"run": cmd_run, "dev-kafka": cmd_dev_kafka, "send": cmd_send, "reschedule": cmd_send,
                "cancel": cmd_cancel, "inspect": cmd_inspect, "demo": cmd_demo, "dlq": cmd_dlq,
                "status": cmd_status, "list": cmd_list, "acls": acls.main}
    try:
        return handlers[ns.command](ns)
    except (CliError, ConfigError, devtools.DevToolMissing, acls.AclInputError) as e:
        print(f"delay-sidecar {ns.command}: error: {e}", file=sys.stderr)
        return 2
    except Failed as e:
        print(f"delay-sidecar {ns.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
