"""Tenants: several teams served by one deployment, each with its own ingress topic and rules.

The YAML file's ``tenants:`` mapping names each tenant and its settings, keyed like the
top-level options::

    tenants:
      payments:
        ingress-topic: payments.delay
        dlq-topic: payments.delay.dlq
        target-allowlist: ["payments\\..*"]
      search:
        ingress-topic: search.delay
        max-delay: 7d

``ingress-topic`` is required; ``dlq-topic``, ``target-allowlist``, ``max-delay`` and
``changelog-topic`` (default ``<ingress-topic>.changelog``) are optional, and the top-level value
applies where a tenant gives none. The quotas ``max-pending`` (records), ``max-disk-bytes`` (a
size: ``10GiB``) and ``max-delivery-rate`` (records/s) are a tenant's only, with no top-level
value (none: no limit); ``sidecar/store/quota.py`` and ``sidecar/engine/pacing.py`` enforce them.
A single-ingress deployment that wants a quota names its one tenant under ``tenants:``.
``kafka:`` (optional) holds librdkafka properties applied over
the deployment's ``kafka:`` for the producer that publishes the tenant's deliveries and dead
letters (``sidecar/engine/tenant_producers.py``), typically the tenant's own
``sasl.username``/``sasl.password`` so that the broker decides what the tenant may write. Each
value is a string, ``{file: PATH}`` (the file's content, a trailing newline stripped) or
``{env: NAME}`` (an environment variable), read at load; secrets are never logged (a tenant's
repr leaves the properties out, ``Settings.masked`` shows secret ones as ``***``). Without
``tenants:`` the top-level ``ingress-topic`` is one implicit tenant named ``default``: today's
single-ingress configuration. Everything else (the group, the data directory, the delivery mode,
the store's tuning) belongs to the deployment.

One consumer group subscribes to every tenant's ingress topic; each ingress partition has its
own store (``<data-dir>/<topic>-<partition>``), changelog partition (the tenant's changelog topic,
one partition per ingress partition), checkpoint and handover (``sidecar/engine/stores.py``:
the stores map is keyed by topic and partition). A store's rules (DLQ, allowlist, maximum delay)
are its tenant's.

Checked at load (``check``; errors name the tenant and the key): ingress topics are distinct, and
no tenant's ingress topic is any tenant's DLQ, changelog or history topic nor matches another
tenant's target allowlist; changelog topics are distinct. With ``delivery: exactly-once`` a tenant
with ``kafka:`` overrides runs its own transactions (engine/txn_lanes.py); ``etf1-tombstones: on``
is refused beside it (the tombstones are the deployment's writes: they would commit in another
transaction than the deliveries they follow).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.durations import format_duration_ms, format_size, parse_size

if TYPE_CHECKING:
    from sidecar.config import Settings

DEFAULT_TENANT = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")  # usable as a metric label and a log field
# a tenant's own settings: (option name, its Settings attribute)
TENANT_KEYS = ("ingress-topic", "dlq-topic", "target-allowlist", "max-delay", "changelog-topic")


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str) or not str(v).strip().isdigit() or int(v) <= 0:
        raise ValueError(f"{v!r} is not a positive whole number of records")
    return int(v)


def _rate(v: Any) -> float:
    try:
        rate = float(v) if not isinstance(v, bool) else -1.0
    except (TypeError, ValueError):
        rate = -1.0
    if not 0.001 <= rate <= 1e9:  # pacing.py keeps the rate in thousandths of a record per second
        raise ValueError(f"{v!r} is not a rate in records per second between 0.001 and 1e9")
    return rate


def _size(v: Any) -> int:
    n = parse_size(v)
    if n <= 0:
        raise ValueError(f"{v!r} is not a positive size (e.g. 10GiB)")
    return n


# a tenant's quotas (no top-level value): (option name, TenantSpec attribute, parser)
QUOTA_KEYS = {"max-pending": ("max_pending", _count), "max-disk-bytes": ("max_disk_bytes", _size),
              "max-delivery-rate": ("max_delivery_rate", _rate)}


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant as the YAML file gives it (None: the top-level value applies)."""

    name: str
    ingress_topic: str
    dlq_topic: str | None = None
    target_allowlist: tuple[str, ...] | None = None
    max_delay_ms: int | None = None
    changelog_topic: str | None = None
    max_pending: int | None = None
    max_disk_bytes: int | None = None
    max_delivery_rate: float | None = None
    kafka: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # librdkafka overrides, resolved


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant's resolved settings."""

    name: str
    ingress_topic: str
    dlq_topic: str
    target_allowlist: tuple[str, ...]
    max_delay_ms: int
    changelog_topic: str | None  # None: changelog off
    max_pending: int | None = None  # quotas: None for no limit
    max_disk_bytes: int | None = None
    max_delivery_rate: float | None = None
    # librdkafka properties over the deployment's, for the tenant's own producer (empty: the
    # deployment's producer publishes its records); secrets: never in the repr
    kafka: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def principal(self, deployment_kafka: Mapping[str, str]) -> str:
        """Who the broker sees publishing this tenant's records, for error texts: ``User:NAME``
        from ``sasl.username`` (the tenant's, else the deployment's), or a description."""
        user = dict(self.kafka).get("sasl.username") or deployment_kafka.get("sasl.username")
        if user:
            return f"User:{user}"
        return "the tenant's principal" if self.kafka else "the sidecar's principal"


class TenantError(ValueError):
    """A tenant's setting is wrong; the message names the tenant, the key and the value
    (``sidecar.config`` raises it as its ``ConfigError``)."""


KAFKA_FORMS = "a string, {file: PATH} or {env: NAME}"


def parse_kafka(raw: Any, where: str, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A tenant's ``kafka:`` mapping, each value resolved (module docstring); ``where`` names the
    tenant in errors, which never quote a value."""
    if not isinstance(raw, dict) or not raw:
        raise TenantError(f"{where}.kafka must be a mapping of librdkafka properties, each value {KAFKA_FORMS}")
    out = []
    for key, value in raw.items():
        key = str(key)
        at = f"{where}.kafka.{key}"
        if key in ("bootstrap.servers", "transactional.id", "group.id"):
            raise TenantError(f"{at}: a property of the deployment, not of a tenant's producer")
        if isinstance(value, dict):
            if len(value) != 1 or next(iter(value)) not in ("file", "env"):
                raise TenantError(f"{at}: must be {KAFKA_FORMS} (got a mapping with keys "
                                  f"{', '.join(map(str, value)) or 'none'})")
            (form, ref), = value.items()
            if not isinstance(ref, str) or not ref:
                raise TenantError(f"{at}: {{{form}: ...}} needs a non-empty {'path' if form == 'file' else 'name'}")
            if form == "file":
                try:
                    text = Path(ref).read_text()
                except OSError as e:
                    raise TenantError(f"{at}: cannot read {{file: {ref}}}: {e.strerror}") from None
                value = text[:-1] if text.endswith("\n") else text
            else:
                found = environ.get(ref)
                if found is None:
                    raise TenantError(f"{at}: {{env: {ref}}}: the environment variable {ref} is not set")
                value = found
        elif isinstance(value, (list, type(None))):
            raise TenantError(f"{at}: must be {KAFKA_FORMS}")
        out.append((key, str(value)))
    return tuple(out)


def parse_tenants(raw: Any, source: str, options: Mapping[str, Any],
                  environ: Mapping[str, str] | None = None) -> tuple[TenantSpec, ...]:
    """The ``tenants:`` mapping of a YAML file (``source`` names it in errors); ``options``: the
    configuration's options by name (``config.options``: each with ``attr`` and ``parse``);
    ``environ``: where ``{env: NAME}`` values are read (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    if not isinstance(raw, dict) or not raw:
        raise TenantError(f"{source}: 'tenants' must be a mapping of tenant names to their settings")
    out = []
    for name, conf in raw.items():
        name = str(name)
        if not _NAME.match(name):
            raise TenantError(f"{source}: tenant name {name!r} must be 1-63 letters, digits, '.', '_' or '-'")
        where = f"{source}: tenants.{name}"
        if not isinstance(conf, dict):
            raise TenantError(f"{where} must be a mapping of settings (at least ingress-topic)")
        values: dict[str, Any] = {}
        for key, value in conf.items():
            key = str(key)
            if key == "kafka":
                values["kafka"] = parse_kafka(value, where, env)
                continue
            if key in QUOTA_KEYS:
                attr, parse = QUOTA_KEYS[key]
                try:
                    values[attr] = parse(value)
                except ValueError as e:
                    raise TenantError(f"{where}.{key}: bad value: {e}") from None
                continue
            if key not in TENANT_KEYS:
                kind = "a setting of the whole deployment" if key in options else "not a setting"
                raise TenantError(f"{where}.{key}: {kind}, not of a tenant (a tenant takes "
                                  f"{', '.join((*TENANT_KEYS, *QUOTA_KEYS))}, kafka)")
            opt = options[key]
            try:
                values[opt.attr] = opt.parse(value)
            except ValueError as e:
                raise TenantError(f"{where}.{key}: bad value: {e}") from None
            if values[opt.attr] is None or values[opt.attr] == "":
                raise TenantError(f"{where}.{key}: bad value: empty")
        if "ingress_topic" not in values:
            raise TenantError(f"{where}: ingress-topic is required")
        out.append(TenantSpec(name=name, **values))
    return tuple(out)


def resolve(s: Settings) -> tuple[Tenant, ...]:
    """Every tenant with the top-level values filled in (the implicit ``default`` one without
    ``tenants:``)."""
    specs = s.tenant_specs or (TenantSpec(DEFAULT_TENANT, s.ingress_topic, changelog_topic=s.changelog_topic),)
    on = s.changelog == "on"
    return tuple(
        Tenant(
            name=t.name, ingress_topic=t.ingress_topic,
            dlq_topic=t.dlq_topic if t.dlq_topic is not None else s.dlq_topic,
            target_allowlist=t.target_allowlist if t.target_allowlist is not None else s.target_allowlist,
            max_delay_ms=t.max_delay_ms if t.max_delay_ms is not None else s.max_delay_ms,
            changelog_topic=(t.changelog_topic or f"{t.ingress_topic}.changelog") if on else None,
            max_pending=t.max_pending, max_disk_bytes=t.max_disk_bytes, max_delivery_rate=t.max_delivery_rate,
            kafka=t.kafka,
        )
        for t in specs
    )


def check(s: Settings, given: set[str]) -> None:
    """Refuse tenants that would read or write each other's topics (see the module docstring).
    ``given``: the top-level options set by a source (not defaults)."""
    tenants = s.tenants
    if s.tenant_specs:
        for name in ("ingress-topic", "changelog-topic"):
            if name in given:
                raise TenantError(f"{name} is set at the top level and 'tenants' is given: with tenants, each "
                                  f"tenant names its own {name} (tenants.<name>.{name})")
    for t in tenants:
        if t.kafka and s.exactly_once and s.etf1_tombstones == "on":
            raise TenantError(f"tenants.{t.name}.kafka: per-tenant Kafka credentials with delivery: exactly-once and "
                              "etf1-tombstones: on are not supported (the tombstones would commit in the deployment's "
                              "transactions, not in the tenant's with its deliveries); use etf1-tombstones: off, or "
                              "drop the tenant's kafka: overrides")
    ingress: dict[str, str] = {}
    for t in tenants:
        other = ingress.get(t.ingress_topic)
        if other is not None:
            raise TenantError(f"tenants.{t.name}.ingress-topic {t.ingress_topic!r} is also the ingress topic of "
                              f"tenant {other!r}: each tenant needs its own")
        ingress[t.ingress_topic] = t.name
    changelogs: dict[str, str] = {}
    for t in tenants:
        if t.changelog_topic is not None:
            other = changelogs.get(t.changelog_topic)
            if other is not None:
                raise TenantError(f"tenants.{t.name}.changelog-topic {t.changelog_topic!r} is also the changelog "
                                  f"topic of tenant {other!r}: each ingress topic needs its own")
            changelogs[t.changelog_topic] = t.name
        if t.max_disk_bytes is not None and t.max_disk_bytes < 2 * s.segment_bytes:
            # counted in whole commit-log segments (store/quota.py): less than two leaves a store
            # no segment to seal and free
            raise TenantError(f"tenants.{t.name}.max-disk-bytes ({format_size(t.max_disk_bytes)}) must be at least "
                              f"twice --segment-bytes ({format_size(s.segment_bytes)})")
        if s.levels_ms[-1] > t.max_delay_ms:
            raise TenantError(f"tenants.{t.name}.max-delay ({format_duration_ms(t.max_delay_ms)}) is shorter than "
                              f"the last level ({format_duration_ms(s.levels_ms[-1])})")
    for t in tenants:
        for u in tenants:
            if u.dlq_topic == t.ingress_topic:
                raise TenantError(f"tenants.{u.name}.dlq-topic {u.dlq_topic!r} is the ingress topic of tenant "
                                  f"{t.name!r}: dead letters would be scheduled again")
            if u.changelog_topic == t.ingress_topic:
                raise TenantError(f"tenants.{u.name}.changelog-topic {u.changelog_topic!r} is the ingress topic "
                                  f"of tenant {t.name!r}")
            if u is not t and any(re.fullmatch(p, t.ingress_topic) for p in u.target_allowlist):
                raise TenantError(f"tenants.{u.name}.target-allowlist matches {t.ingress_topic!r}, the ingress "
                                  f"topic of tenant {t.name!r}: one tenant may not schedule into another's intake")
        if s.history_topic is not None and s.history_topic in (t.ingress_topic, t.dlq_topic, t.changelog_topic):
            raise TenantError(f"--history-topic {s.history_topic!r} must differ from tenant {t.name!r}'s ingress, "
                              "DLQ and changelog topics")


def tenant_by_topic(s: Settings) -> dict[str, str]:
    """Each ingress topic's tenant name: a store's tenant is ``tenant_by_topic(s)[store.topic]``
    (the ``tenant`` label of its metrics and its ``stats`` counts)."""
    return {t.ingress_topic: t.name for t in s.tenants}


def named(s: Settings, name: str, flag: str = "--tenant") -> Tenant:
    """The tenant called ``name`` (a command's ``--tenant``); an unknown name is an error naming
    the accepted ones."""
    for t in s.tenants:
        if t.name == name:
            return t
    raise TenantError(f"{flag} {name!r}: no such tenant (the configuration has "
                      f"{', '.join(repr(t.name) for t in s.tenants)})")
