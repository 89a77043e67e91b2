"""``--tenant NAME``: the commands that address one tenant's topics take them from the configuration.

``status``, ``cancel``, ``dlq list`` and ``dlq redrive`` read and write a tenant's ingress topic
(``status`` also asks the sidecars about that topic's partitions only) and ``dlq`` its DLQ topic.
With ``--tenant`` those come from the sidecar's YAML file (``--config``: its ``tenants:``,
``sidecar/tenants.py``) instead of ``--ingress-topic`` and ``--dlq-topic``, so an operator names
the team, not its topics (``--tenant`` wins over those flags). An unknown name is an error
naming the tenants the file has.

``cancel`` and ``dlq redrive`` also write as the tenant: their producer takes the tenant's
``kafka:`` properties (its own ``sasl.username``/``sasl.password``, say) over the ones the command
uses otherwise (``--config``'s ``kafka:`` and ``--kafka``), built as the sidecar builds the
tenant's producer (``engine/tenant_producers.over``), so the broker authorizes the tenant's
principal for what the command writes. The command's other clients (metadata checks, the DLQ's
consumer) stay on the command's own properties. Property values are never printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from sidecar import tenants
from sidecar.config import ConfigError, Settings

HELP = ("the tenant (a name under tenants: in --config) whose ingress topic{dlq} to use (instead of "
        "--ingress-topic{dlq_flag})")


def add(p: argparse.ArgumentParser, dlq: bool = False) -> None:
    """Add ``--tenant`` to ``p`` (``dlq``: the command also uses the tenant's DLQ topic)."""
    p.add_argument("--tenant", metavar="NAME", help=HELP.format(dlq=" and DLQ topic" if dlq else "",
                                                                dlq_flag=" and --dlq-topic" if dlq else ""))


def apply(ns: argparse.Namespace, settings: Settings | None) -> None:
    """Set ``ns.ingress_topic`` (and ``ns.dlq_topic`` where the command has one) from ``--tenant``'s
    entry in ``settings`` (the ``--config`` file's; None: no file given)."""
    name = getattr(ns, "tenant", None)
    if name is None:
        return
    if settings is None:
        raise ConfigError(f"--tenant {name!r} needs --config FILE: the sidecar's configuration with its tenants")
    try:
        t = tenants.named(settings, name)
    except tenants.TenantError as e:
        raise ConfigError(str(e)) from None
    ns.ingress_topic = t.ingress_topic
    if hasattr(ns, "dlq_topic"):
        ns.dlq_topic = t.dlq_topic
    ns.tenant_settings = t


def producer_kafka(ns: argparse.Namespace, kafka: Mapping[str, Any]) -> dict[str, Any]:
    """The librdkafka properties of the command's producer: ``kafka`` (the command's own), with the
    ``--tenant``'s ``kafka:`` over them once ``apply`` found one."""
    from sidecar.engine.tenant_producers import over  # the engine's clients: only when writing

    t: tenants.Tenant | None = getattr(ns, "tenant_settings", None)
    return dict(kafka) if t is None else over(kafka, t)
