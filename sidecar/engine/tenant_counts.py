"""Counts per tenant: what the metrics' ``tenant`` label and the ``stats`` lines' tenant counts read.

The hot path bumps plain integers on ``store.counters`` and appends delivery lateness to
``store.lateness`` (``PartitionStore``, ``engine/publishing.py`` and its C twin). Each tenant's
stores share one :class:`Tally` (its ``Counters`` and its lateness list), given to a store when it is
made (``engine/opening.py``), so counting per tenant costs no look-up per record: the store already
holds its tenant's objects.

With one tenant (the implicit ``default`` one, or a single entry under ``tenants:``) its
``Counters`` are the loop's own, which publishing also counts into (early deliveries, publish
retries), and :meth:`TenantCounts.totals` is that object itself, live, as before tenants. With
several, each tenant has its own ``Counters`` and the loop's own hold only publishing's counts;
:meth:`TenantCounts.totals` sums them all into a fresh ``Counters`` (read once per sync, not per
record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from sidecar.store.partition import Counters
from sidecar.tenants import Tenant

_SUMMED = tuple(f.name for f in fields(Counters) if f.name != "dlq")


@dataclass(slots=True)
class Tally:
    """One tenant's counts, shared by its stores."""

    name: str
    counters: Counters
    lateness: list[int] = field(default_factory=list)  # ms, the deliveries the metrics have not taken yet


class TenantCounts:
    def __init__(self, tenants: Sequence[Tenant]) -> None:
        self.loop = Counters()  # publishing's own counts; the only tenant's too when there is one
        single = len(tenants) == 1
        self.by_name = {t.name: Tally(t.name, self.loop if single else Counters()) for t in tenants}
        self.by_topic = {t.ingress_topic: self.by_name[t.name] for t in tenants}

    def totals(self) -> Counters:
        """Every count of the loop (see the module docstring: live with one tenant, a sum with several)."""
        if len(self.by_name) == 1:
            return self.loop
        parts = [self.loop, *(t.counters for t in self.by_name.values())]
        out = Counters()
        for name in _SUMMED:
            setattr(out, name, sum(getattr(p, name) for p in parts))
        for p in parts:
            for reason, n in p.dlq.items():
                out.dlq[reason] = out.dlq.get(reason, 0) + n
        return out
