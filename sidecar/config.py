"""Sidecar settings: one table of options, four sources, one precedence.

Lowest to highest: built-in defaults < YAML file (``--config FILE``) < environment
(``DELAY_SIDECAR_<FLAG>``, dashes as underscores, upper case) < command-line flags.
``KAFKA_BOOTSTRAP_SERVERS`` is honoured as a synonym of ``DELAY_SIDECAR_BOOTSTRAP_SERVERS``.

The YAML file uses the flag names as keys (``ingress-topic: delay.ingress``) plus a ``kafka:``
mapping of librdkafka properties passed through to every client (TLS, SASL, ...), and a
``tenants:`` mapping of teams served by one deployment (``sidecar/tenants.py``). Environment
variables ``DELAY_SIDECAR_KAFKA_<PROP>`` add librdkafka properties too (``_`` becomes ``.``:
``DELAY_SIDECAR_KAFKA_SASL_PASSWORD`` -> ``sasl.password``), so a Kubernetes Secret can feed a
password without it ever being written into a ConfigMap.

The option table ``OPTIONS`` is the single source: the CLI builds its flags from it, the README
table is generated from it, and the Helm chart's values map onto the same keys. Its defaults are
written the way a person writes them (``400d``, ``64MiB``, ``1s 5s 10s``) and go through the same
parser as any given value, so ``run --help`` shows them in that form; ``Settings`` holds the parsed
values (milliseconds, bytes). Durations follow ``sidecar.durations``: a unit is required
(``commit-interval: 1000`` is refused: 1000 what?).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sidecar import tenants as _tenants
from sidecar.durations import format_duration_ms, format_size, parse_duration_list, parse_duration_ms, parse_size

if TYPE_CHECKING:
    from sidecar.tenants import Tenant, TenantSpec

ENV_PREFIX = "DELAY_SIDECAR_"
KAFKA_ENV_PREFIX = "DELAY_SIDECAR_KAFKA_"

DEFAULT_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# RocketMQ's %RETRY% ladder: delay level 3 + reconsumeTimes, i.e. the level table from 10s on.
DEFAULT_RETRY_LADDER = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

SECRET_KEY = re.compile(r"(password|secret|token|key\.pem|keystore|truststore|jaas)", re.I)


class ConfigError(ValueError):
    """A setting is wrong; the message names the flag (or key) and the value."""


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # flag name without dashes, YAML key, and (upper-cased) env suffix
    attr: str
    default: Any  # as a person writes it; parse(default) is the Settings default
    parse: Callable[[Any], Any]
    help: str
    metavar: str = "VALUE"  # DURATION, DURATIONS and SIZE name the written forms of sidecar.durations

    def default_text(self) -> str:
        """The default as ``run --help`` and the README show it."""
        if self.default is None:
            return "unset"
        if isinstance(self.default, tuple):
            return " ".join(map(str, self.default)) if self.default else "empty"
        return str(self.default)


def _str(v: Any) -> str:
    return str(v)


def _opt_str(v: Any) -> str | None:
    s = str(v).strip() if v is not None else ""
    return s or None


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"not an integer: {v!r}")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError(f"not an integer: {v!r}") from None


def _port(v: Any) -> int:
    p = _int(v)
    if not 0 <= p <= 65535:
        raise ValueError(f"not a port: {v!r}")
    return p


def _nonneg_int(v: Any) -> int:
    n = _int(v)
    if n < 0:
        raise ValueError(f"must be 0 or more: {v!r}")
    return n


def _positive(parse: Callable[[Any], int]) -> Callable[[Any], int]:
    def inner(v: Any) -> int:
        n = parse(v)
        if n <= 0:
            raise ValueError(f"must be positive: {v!r}")
        return n

    return inner


def _choice(*allowed: str) -> Callable[[Any], str]:
    def inner(v: Any) -> str:
        s = str(v).strip().lower()
        if s not in allowed:
            raise ValueError(f"{v!r} is not one of {', '.join(allowed)}")
        return s

    return inner


def _on_off(v: Any) -> str:
    """"on" or "off"; YAML's unquoted on/off arrive as booleans and are accepted as such."""
    if isinstance(v, bool):
        return "on" if v else "off"
    return _choice("on", "off")(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s not in ("true", "false"):
        raise ValueError(f"{v!r} is not true or false")
    return s == "true"


def _regex_list(v: Any) -> tuple[str, ...]:
    items = list(v) if isinstance(v, (list, tuple)) else [p for p in re.split(r"[\s,]+", str(v).strip()) if p]
    for p in items:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"bad regular expression {p!r}: {e}") from None
    return tuple(str(p) for p in items)


def _durations(v: Any) -> tuple[int, ...]:
    return tuple(parse_duration_list(v))


def parse_levels(v: Any) -> tuple[int, ...]:
    out = _durations(v)
    if any(b <= a for a, b in itertools.pairwise(out)):
        raise ValueError(f"levels must be strictly increasing: {v!r}")
    if out[0] <= 0:
        raise ValueError(f"levels must be positive: {v!r}")
    return out


_D, _DS, _SIZE, _N = "DURATION", "DURATIONS", "SIZE", "N"

OPTIONS: tuple[Option, ...] = (
    Option("bootstrap-servers", "bootstrap_servers", None, _opt_str,
           "Kafka bootstrap servers; unset = start an embedded local broker", "HOST:PORT,..."),
    Option("ingress-topic", "ingress_topic", "delay.ingress", _str, "topic producers send delayed records to",
           "TOPIC"),
    Option("dlq-topic", "dlq_topic", "delay.dlq", _str, "dead-letter topic", "TOPIC"),
    Option("data-dir", "data_dir", "./data", _str, "store directory (one sub-directory per ingress partition)",
           "DIR"),
    Option("scheduler", "scheduler", "wheel", _choice("levels", "wheel"),
           "wheel (any delay, to the ms) or levels (RocketMQ 4.x delay levels)", "{wheel,levels}"),
    Option("group-id", "group_id", "delay-sidecar", _str, "consumer group of the ingress consumers", "GROUP"),
    Option("group-instance-id", "group_instance_id", None, _opt_str,
           "static group membership id (unset = one made on first start and kept in the data directory)",
           "ID"),
    Option("ingress-partitions", "ingress_partitions", 6, _positive(_int),
           "partitions of the ingress topic when the sidecar creates it", _N),
    Option("replication-factor", "replication_factor", -1, _int,
           "replication factor of topics the sidecar creates (-1 = broker default)", _N),
    Option("changelog", "changelog", "on", _choice("on", "off"),
           "on: every store change is mirrored to a compacted changelog topic, so a partition's pending records "
           "follow it to another instance; off: single-instance mode, the store lives on this disk only",
           "{on,off}"),
    Option("changelog-topic", "changelog_topic", None, _opt_str,
           "the changelog topic (unset = <ingress-topic>.changelog); compacted, one partition per ingress "
           "partition", "TOPIC"),
    Option("standby-replicas", "standby_replicas", 0, _nonneg_int,
           "keep warm copies of this many other members' partitions (tailing the changelog), so a failover "
           "restores only the last seconds (Kafka Streams' num.standby.replicas; needs changelog on)", _N),
    Option("delivery", "delivery", "at-least-once", _choice("at-least-once", "exactly-once"),
           "at-least-once: a crash or a handover may deliver a record again (consumers deduplicate by "
           "delay.id); exactly-once: deliveries, changelog and ingress offsets commit in Kafka transactions, "
           "read_committed consumers see each record once (needs changelog on; README, Guarantees)",
           "{at-least-once,exactly-once}"),
    Option("producer", "producer", "auto", _choice("auto", "confluent", "native"),
           "the deliveries' Kafka producer: native (librdkafka driven from the C extension, the library "
           "confluent-kafka runs on: no Python object per record or report; at-least-once only), confluent "
           "(confluent-kafka's Producer), auto (native where it can run: at-least-once with the extension "
           "built; docs/design.md 5.2)", "{auto,confluent,native}"),
    Option("transaction-interval", "transaction_interval_ms", "100ms", _positive(parse_duration_ms),
           "exactly-once: how often the transaction commits; a read_committed consumer sees a delivery "
           "up to this much later", _D),
    Option("transaction-timeout", "transaction_timeout_ms", "10s", _positive(parse_duration_ms),
           "exactly-once: the producer's transaction.timeout.ms; an instance lost for good holds back "
           "read_committed readers of the partitions it wrote to for up to this long", _D),
    Option("history-topic", "history_topic", None, _opt_str,
           "unset = no history; else one JSON record per state change of a schedule (accepted, replaced, "
           "cancelled, delivered, dead-lettered), keyed by delay.id, on this topic", "TOPIC"),
    Option("history-payload", "history_payload", "false", _bool,
           "true: history records carry the record's key and value (base64) too", "{true,false}"),
    Option("etf1-tombstones", "etf1_tombstones", "off", _on_off,
           "on: after delivering a record scheduled with etf1/kafka-message-scheduler's headers, write a "
           "tombstone under its key to its ingress partition, as etf1 does, so a compacted schedules topic "
           "stays bounded (docs/design.md 1.1)", "{on,off}"),
    Option("http-port", "http_port", 0, _port, "port of /metrics, /healthz, /readyz (0 = disabled)", "PORT"),
    Option("http-host", "http_host", "0.0.0.0", _str, "address the HTTP endpoints bind to", "ADDRESS"),
    Option("advertised-address", "advertised_address", None, _opt_str,
           "HOST:PORT where `delay-sidecar status` reaches this instance's HTTP endpoints, advertised in the "
           "consumer's client.id (unset = the address the broker sees this client at, with http-port)",
           "HOST:PORT"),
    Option("status-memory", "status_memory", 100_000, _nonneg_int,
           "delivered, cancelled and dead-lettered ids remembered per partition for `status` (~120 B each "
           "in RAM; 0 = only pending ids are known)", _N),
    Option("fsync", "fsync", "batch", _choice("batch", "interval", "none"),
           "batch: durable before every ingress commit; interval: every fsync-interval; none: OS decides",
           "{batch,interval,none}"),
    Option("fsync-interval", "fsync_interval_ms", "1s", parse_duration_ms, "flush period for fsync=interval", _D),
    Option("commit-interval", "commit_interval_ms", "1s", _positive(parse_duration_ms),
           "how often ingress offsets are made durable and committed", _D),
    Option("levels", "levels_ms", DEFAULT_LEVELS, parse_levels, "delay level table (1-based)", _DS),
    Option("max-delay", "max_delay_ms", "400d", _positive(parse_duration_ms),
           "longest accepted delay; beyond -> DLQ delay-out-of-range", _D),
    Option("retry-ladder", "retry_ladder_ms", DEFAULT_RETRY_LADDER, _durations,
           "consumer retry delays: step n for delay.retry-count n (the last step repeats)", _DS),
    Option("max-retries", "max_retries", 16, _int, "delay.retry-count above this -> DLQ retries-exhausted", _N),
    Option("target-allowlist", "target_allowlist", (), _regex_list,
           "regular expressions a target topic must fully match (empty = any non-internal topic)", "REGEX,..."),
    Option("max-record-bytes", "max_record_bytes", 1_000_000, _positive(parse_size),
           "largest accepted ingress record (key + value + headers); larger -> DLQ too-large", _SIZE),
    Option("segment-bytes", "segment_bytes", "64MiB", _positive(parse_size),
           "commit log segment size (preallocated, mmapped)", _SIZE),
    Option("wheel-precision", "wheel_precision_ms", "10ms", _positive(parse_duration_ms), "timer wheel slot width",
           _D),
    Option("wheel-window", "wheel_window_ms", "1h", _positive(parse_duration_ms),
           "timer wheel near window; later records wait in time buckets", _D),
    Option("bucket-width", "bucket_width_ms", "30m", _positive(parse_duration_ms),
           "time bucket width (at most half the wheel window, so a bucket loads before it is due)", _D),
    Option("cancel-horizon", "cancel_horizon_ms", "1d", parse_duration_ms,
           "how long a cancel that arrived before its message is remembered", _D),
    Option("delivery-grace", "delivery_grace_ms", "1m", parse_duration_ms,
           "how long a missing target topic is waited for before DLQ delivery-failed", _D),
    Option("delivery-attempts", "delivery_attempts", 5, _positive(_int),
           "attempts for permanent publish errors before DLQ delivery-failed", _N),
    Option("max-in-flight", "max_in_flight", 20_000, _positive(_int),
           "records handed to the producer and not yet acknowledged, per process", _N),
    Option("batch-size", "batch_size", 1_000, _positive(_int),
           "records consumed per poll (bounds how long one intake batch delays publishing)", _N),
    Option("disk-max-bytes", "disk_max_bytes", 0, parse_size,
           "pause ingress when the data directory reaches this size (0 = no limit)", _SIZE),
    Option("disk-min-free-bytes", "disk_min_free_bytes", "256MiB", parse_size,
           "pause ingress when free disk falls below this", _SIZE),
    Option("shutdown-timeout", "shutdown_timeout_ms", "30s", parse_duration_ms,
           "deadline for a graceful shutdown on SIGTERM", _D),
    Option("stats-interval", "stats_interval_ms", "10s", _positive(parse_duration_ms),
           "period of the stats log line", _D),
    Option("helper-threads", "helper_threads", "flusher", _choice("flusher", "all", "none"),
           "which helper threads run SCHED_BATCH, so they never preempt the event loop: the flusher "
           "(and the page thread), "
           "all (also librdkafka's), none (README, Operations)", "{flusher,all,none}"),
    Option("log-level", "log_level", "info", _choice("debug", "info", "warning", "error"), "log level",
           "{debug,info,warning,error}"),
)

_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(slots=True)
class Settings:
    bootstrap_servers: str | None = None
    ingress_topic: str = "delay.ingress"
    dlq_topic: str = "delay.dlq"
    data_dir: str = "./data"
    scheduler: str = "wheel"
    group_id: str = "delay-sidecar"
    group_instance_id: str | None = None
    ingress_partitions: int = 6
    replication_factor: int = -1
    changelog: str = "on"
    changelog_topic: str | None = None
    standby_replicas: int = 0
    delivery: str = "at-least-once"
    producer: str = "auto"
    transaction_interval_ms: int = 100
    transaction_timeout_ms: int = 10_000
    history_topic: str | None = None
    history_payload: bool = False
    etf1_tombstones: str = "off"
    http_port: int = 0
    http_host: str = "0.0.0.0"
    advertised_address: str | None = None
    status_memory: int = 100_000
    fsync: str = "batch"
    fsync_interval_ms: int = 1000
    commit_interval_ms: int = 1000
    levels_ms: tuple[int, ...] = parse_levels(DEFAULT_LEVELS)
    max_delay_ms: int = 400 * 86_400_000
    retry_ladder_ms: tuple[int, ...] = _durations(DEFAULT_RETRY_LADDER)
    max_retries: int = 16
    target_allowlist: tuple[str, ...] = ()
    max_record_bytes: int = 1_000_000
    segment_bytes: int = 64 * 1024 * 1024
    wheel_precision_ms: int = 10
    wheel_window_ms: int = 3_600_000
    bucket_width_ms: int = 1_800_000
    cancel_horizon_ms: int = 86_400_000
    delivery_grace_ms: int = 60_000
    delivery_attempts: int = 5
    max_in_flight: int = 20_000
    batch_size: int = 1_000
    disk_max_bytes: int = 0
    disk_min_free_bytes: int = 256 * 1024 * 1024
    shutdown_timeout_ms: int = 30_000
    stats_interval_ms: int = 10_000
    helper_threads: str = "flusher"
    log_level: str = "info"
    kafka: dict[str, str] = field(default_factory=dict)
    tenant_specs: tuple[TenantSpec, ...] = ()  # the YAML file's ``tenants:`` (empty: one implicit tenant)

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        """Every tenant, resolved (``sidecar/tenants.py``)."""
        return _tenants.resolve(self)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def changelog_topic_name(self) -> str | None:
        """The changelog topic, or None with ``changelog: off``."""
        if self.changelog != "on":
            return None
        return self.changelog_topic or f"{self.ingress_topic}.changelog"

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly-once"

    def masked(self) -> dict[str, Any]:
        """Every setting, secrets replaced by ``***`` (for the start-up log line)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            out[f.name] = getattr(self, f.name)
        out["kafka"] = _masked_kafka(self.kafka.items())
        out["tenant_specs"] = [
            {**{f.name: getattr(t, f.name) for f in fields(t)}, "kafka": _masked_kafka(t.kafka)}
            for t in self.tenant_specs
        ]
        return out


def _masked_kafka(props: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k: ("***" if SECRET_KEY.search(k) else v) for k, v in props}


def _apply(settings: Settings, name: str, raw: Any, source: str, given: set[str] | None = None) -> None:
    opt = _BY_NAME.get(name)
    if opt is None:
        raise ConfigError(f"unknown setting {name!r} in {source}")
    try:
        value = opt.parse(raw)
    except ValueError as e:
        raise ConfigError(f"{source}: bad value for {_label(name, source)}: {e}") from None
    setattr(settings, opt.attr, value)
    if given is not None:
        given.add(name)


def _label(name: str, source: str) -> str:
    if source == "flags":
        return f"--{name}"
    if source == "environment":
        return env_name(name)
    return name


def env_name(option: str) -> str:
    return ENV_PREFIX + option.upper().replace("-", "_")


def load_settings(
    flags: Mapping[str, Any] | None = None,
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults < YAML < environment < flags. ``flags`` maps option names (with dashes)
    to raw values; ``None`` values mean "not given"."""
    env = os.environ if environ is None else environ
    s = Settings()
    given: set[str] = set()  # options a source set (tenants.check refuses some beside ``tenants:``)
    flags = dict(flags or {})
    config_file = config_file or flags.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    if config_file:
        path = Path(config_file)
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"--config: cannot read {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"--config: {path} is not valid YAML: {e}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"--config: {path} must hold a mapping of settings")
        for key, raw in doc.items():
            if key == "kafka":
                if not isinstance(raw, dict):
                    raise ConfigError(f"--config: 'kafka' in {path} must be a mapping of librdkafka properties")
                s.kafka.update({str(k): str(v) for k, v in raw.items()})
                continue
            if key == "tenants":
                try:
                    s.tenant_specs = _tenants.parse_tenants(raw, f"config file {path}", _BY_NAME, env)
                except _tenants.TenantError as e:
                    raise ConfigError(str(e)) from None
                continue
            _apply(s, str(key), raw, f"config file {path}", given)
    if "KAFKA_BOOTSTRAP_SERVERS" in env and env_name("bootstrap-servers") not in env:
        _apply(s, "bootstrap-servers", env["KAFKA_BOOTSTRAP_SERVERS"], "environment", given)
    for opt in OPTIONS:
        key = env_name(opt.name)
        if key in env:
            _apply(s, opt.name, env[key], "environment", given)
    for key, value in env.items():
        if key.startswith(KAFKA_ENV_PREFIX):
            prop = key[len(KAFKA_ENV_PREFIX):].lower().replace("_", ".")
            s.kafka[prop] = value
    for name, raw in flags.items():
        if raw is None:
            continue
        if name == "kafka":
            s.kafka.update(dict(raw))
            continue
        _apply(s, name, raw, "flags", given)
    _check(s, given)
    return s


def _check(s: Settings, given: set[str] | frozenset[str] = frozenset()) -> None:
    if s.advertised_address is not None:
        host, sep, port = s.advertised_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--advertised-address {s.advertised_address!r} is not HOST:PORT "
                              "(e.g. delay-sidecar-0.delay-sidecar:9404)")
    if s.exactly_once and s.changelog != "on":
        raise ConfigError("--delivery exactly-once needs --changelog on: a store is restored from the "
                          "changelog's committed records after a crash or an aborted transaction")
    if s.exactly_once and s.producer == "native":
        raise ConfigError("--producer native is at-least-once only: --delivery exactly-once keeps "
                          "confluent-kafka's transactional producer (use --producer auto or confluent)")
    if s.exactly_once and s.transaction_interval_ms * 2 > s.transaction_timeout_ms:
        raise ConfigError(
            f"--transaction-interval ({format_duration_ms(s.transaction_interval_ms)}) must be at most half of "
            f"--transaction-timeout ({format_duration_ms(s.transaction_timeout_ms)}): the broker aborts a "
            "transaction open longer than the timeout"
        )
    if not s.tenant_specs and s.ingress_topic == s.dlq_topic:
        raise ConfigError(f"--ingress-topic and --dlq-topic must differ (both {s.ingress_topic!r})")
    if (not s.tenant_specs and s.history_topic is not None
            and s.history_topic in (s.ingress_topic, s.dlq_topic, s.changelog_topic_name)):
        raise ConfigError(f"--history-topic {s.history_topic!r} must differ from the ingress, DLQ and changelog topics")
    if s.max_record_bytes + 4096 > s.segment_bytes:
        raise ConfigError(
            f"--segment-bytes ({format_size(s.segment_bytes)}) must exceed --max-record-bytes "
            f"({format_size(s.max_record_bytes)}) + 4096"
        )
    if s.levels_ms[-1] > s.max_delay_ms:
        raise ConfigError(
            f"--levels: the last level ({format_duration_ms(s.levels_ms[-1])}) exceeds --max-delay "
            f"({format_duration_ms(s.max_delay_ms)})"
        )
    try:
        _tenants.check(s, set(given))
    except _tenants.TenantError as e:
        raise ConfigError(str(e)) from None
