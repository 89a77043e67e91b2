"""The quotas' series: ``quota_rejections_total{tenant,reason}`` and ``pacing_lag_seconds{tenant}``.

A collector read at each scrape (on the HTTP thread) from plain numbers the loop keeps: each
tenant's ``Quota.rejected`` counts (``store/quota.py``; ``reason``: ``max-pending`` or
``max-disk-bytes``) and ``Pacing.lag_s`` (``engine/pacing.py``). Reading a dict's values while the
loop updates them is safe: the loop never adds or removes a key after start. Only tenants with a
quota have series (every reason of a tenant with limits exists at 0, so alerts see 0, not "no
data").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from sidecar.contract import METRIC_PREFIX as PREFIX
from sidecar.engine.pacing import Pacing
from sidecar.store.quota import Quota


class QuotaCollector(Collector):
    def __init__(self, quotas: Iterable[Quota], pacing: Pacing) -> None:
        self.quotas = tuple(quotas)
        self.pacing = pacing

    def collect(self) -> Iterator[Metric]:
        rejections = CounterMetricFamily(PREFIX + "quota_rejections", "Records sent to the DLQ as quota-exceeded, by "
                                         "tenant and the limit they were over", labels=["tenant", "reason"])
        for q in self.quotas:
            for reason, n in list(q.rejected.items()):
                rejections.add_metric([q.tenant, reason], n)
        yield rejections
        lag = GaugeMetricFamily(PREFIX + "pacing_lag_seconds", "How far behind its due times a tenant with a "
                                "max-delivery-rate is: the lateness of its last paced batch", labels=["tenant"])
        for tenant, s in list(self.pacing.lag_s.items()):
            lag.add_metric([tenant], s)
        yield lag


def register(registry: CollectorRegistry | None, quotas: Iterable[Quota | None], pacing: Pacing) -> None:
    """Add the series to ``registry`` (a ``Metrics.registry``; None: no metrics)."""
    if registry is not None:
        registry.register(QuotaCollector((q for q in quotas if q is not None), pacing))
