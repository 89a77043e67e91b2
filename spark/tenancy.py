"""Tenants in the accuracy reports: which tenant a record belongs to, by its ingress topic.

A deployment with tenants (sidecar/tenants.py) reads one ingress topic per tenant. The batch job
knows each sent record's ingress topic (it reads them); a delivered record names it in its
``delay.source`` header (``<ingress-topic>:<partition>:<offset>``), which is all the streaming
job sees. ``tenant_column`` maps that topic to the tenant's name through ``tenants`` (ingress
topic -> tenant, from the sidecar's configuration: ``tenants_from_config``); a topic the mapping
does not name is its own tenant, so a report without a configuration still breaks down by
ingress topic. A delivered record without ``delay.source`` (not the sidecar's) has no tenant
(null).

Kept free of the sidecar package except ``tenants_from_config`` (which the CLI calls), so the jobs
still run as files under spark-submit with only pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

H_SOURCE = "delay.source"  # the wire contract's header (docs/design.md 1)
_SOURCE = r"^(.*):[0-9]+:[0-9]+$"


def source_topic(source: Column) -> Column:
    """The ingress topic of a ``delay.source`` value (null when absent or not of that form)."""
    from pyspark.sql import functions as F

    return F.when(source.rlike(_SOURCE), F.regexp_extract(source, _SOURCE, 1))


def tenant_column(topic: Column, tenants: Mapping[str, str] | None) -> Column:
    """The tenant of ingress topic ``topic``: its name in ``tenants``, else the topic itself."""
    from pyspark.sql import functions as F

    if not tenants:
        return topic
    mapping = F.create_map(*[F.lit(x) for kv in sorted(tenants.items()) for x in kv])
    return F.coalesce(mapping[topic], topic)


def tenants_from_config(path: str) -> dict[str, str]:
    """Ingress topic -> tenant name from the sidecar's YAML configuration (its ``tenants:``; the
    implicit ``default`` tenant's topic without)."""
    from sidecar.config import load_settings
    from sidecar.tenants import tenant_by_topic

    return tenant_by_topic(load_settings({}, config_file=path))
