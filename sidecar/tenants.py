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
A single-ingress deployment that wants a quota names its one tenant under ``tenants:``. Without
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
tenant's target allowlist; changelog topics are distinct. Per-tenant ``kafka:`` overrides are
refused as not supported yet, never accepted and ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.durations import format_duration_ms, format_size, parse_size

if TYPE_CHECKING:
    from sidecar.config import Settings

DEFAULT_TENANT = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")  # usable as a metric label and a log field
# a tenant's own settings: (option name, its Settings attribute)
TENANT_KEYS = ("ingress-topic", "dlq-topic", "target-allowlist", "max-delay", "changelog-topic")
# planned per-tenant settings (the tenants issue): refused until they do something
NOT_YET = ("kafka",)


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


class TenantError(ValueError):
    """A tenant's setting is wrong; the message names the tenant, the key and the value
    (``sidecar.config`` raises it as its ``ConfigError``)."""


def parse_tenants(raw: Any, source: str, options: Mapping[str, Any]) -> tuple[TenantSpec, ...]:
    """The ``tenants:`` mapping of a YAML file (``source`` names it in errors); ``options``: the
    configuration's options by name (``config.options``: each with ``attr`` and ``parse``)."""
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
            if key in NOT_YET:
                raise TenantError(f"{where}.{key}: per-tenant {key!r} is not supported yet")
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
                                  f"{', '.join((*TENANT_KEYS, *QUOTA_KEYS))})")
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
