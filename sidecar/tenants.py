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
applies where a tenant gives none. Without ``tenants:`` the top-level ``ingress-topic`` is one
implicit tenant named ``default``: today's single-ingress configuration. Everything else (the
group, the data directory, the delivery mode, the store's tuning) belongs to the deployment.

One consumer group subscribes to every tenant's ingress topic; each ingress partition has its
own store (``<data-dir>/<topic>-<partition>``), changelog partition (the tenant's changelog topic,
one partition per ingress partition), checkpoint and handover (``sidecar/engine/stores.py``:
the stores map is keyed by topic and partition). A store's rules (DLQ, allowlist, maximum delay)
are its tenant's.

Checked at load (``check``; errors name the tenant and the key): ingress topics are distinct, and
no tenant's ingress topic is any tenant's DLQ, changelog or history topic nor matches another
tenant's target allowlist; changelog topics are distinct. Per-tenant quotas and ``kafka:``
overrides are refused as not supported yet, never accepted and ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.durations import format_duration_ms

if TYPE_CHECKING:
    from sidecar.config import Settings

DEFAULT_TENANT = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")  # usable as a metric label and a log field
# a tenant's own settings: (option name, its Settings attribute)
TENANT_KEYS = ("ingress-topic", "dlq-topic", "target-allowlist", "max-delay", "changelog-topic")
# planned per-tenant settings (the tenants issue): refused until they do something
NOT_YET = ("kafka", "max-pending", "max-delivery-rate", "disk-share", "max-disk-bytes")


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant as the YAML file gives it (None: the top-level value applies)."""

    name: str
    ingress_topic: str
    dlq_topic: str | None = None
    target_allowlist: tuple[str, ...] | None = None
    max_delay_ms: int | None = None
    changelog_topic: str | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant's resolved settings."""

    name: str
    ingress_topic: str
    dlq_topic: str
    target_allowlist: tuple[str, ...]
    max_delay_ms: int
    changelog_topic: str | None  # None: changelog off


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
            if key not in TENANT_KEYS:
                kind = "a setting of the whole deployment" if key in options else "not a setting"
                raise TenantError(f"{where}.{key}: {kind}, not of a tenant (a tenant takes "
                                  f"{', '.join(TENANT_KEYS)})")
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
