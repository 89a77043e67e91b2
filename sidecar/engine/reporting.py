"""Reporting: the loop's state told to the operator (metrics, ``stats`` lines, readiness).

The hot path only bumps plain integers (``Counters``) and appends lateness samples; once a second
:meth:`Reporting.sync_metrics` pushes the deltas since the previous sync to the Prometheus
metrics (with the pending records per tier, the changelog's and the restores' state, the
transactions and the history writer), and every ``stats-interval`` :meth:`Reporting.stats` logs
the totals as one ``stats`` event. Tenants (``engine/tenant_counts.py``): delivered records, dead
letters, pending records and lateness are synced per tenant (the metrics' ``tenant`` label), and
the ``stats`` event names each tenant's counts (``tenants``: at most ``STATS_TENANTS`` of them,
those with the most pending records first; ``tenants_omitted`` counts the rest). Readiness
(``/readyz``: partitions assigned, broker reachable) is pushed to the health server whenever
either changes.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sidecar import logs
from sidecar.engine.backpressure import Backpressure
from sidecar.engine.changelog import Restorer, StoreMirror
from sidecar.engine.history import HistoryWriter
from sidecar.engine.page_waits import PageWaits
from sidecar.engine.publishing import Publishing
from sidecar.engine.standbys import Standbys
from sidecar.engine.stores import StoreKey, Stores
from sidecar.engine.tenant_counts import TenantCounts
from sidecar.engine.transactions import Transactions
from sidecar.engine.turns import TurnWatch
from sidecar.store.partition import Counters

STATS_TENANTS = 20  # tenants a stats line names at most: the line stays bounded with many tenants

_V = TypeVar("_V")

log = logs.get("sidecar")


class Reporting:
    def __init__(
        self, stores: Stores, counts: TenantCounts, pub: Publishing, turns: TurnWatch, backpressure: Backpressure,
        page_waits: PageWaits, *, restorer: Restorer | None, standbys: Standbys | None, txn: Transactions | None,
        history: HistoryWriter | None, metrics: Any, health: Any,
    ) -> None:
        self.stores = stores
        self.counts = counts
        self.pub = pub
        self.turns = turns
        self.backpressure = backpressure
        self.page_waits = page_waits
        self.restorer = restorer
        self.standbys = standbys
        self.several_topics = False  # several tenants' ingress topics (the loop sets it): how partitions are named
        self.txn = txn
        self.history = history
        self.metrics = metrics
        self.health = health
        self.assigned = False
        self._last = Counters()
        self._tiers_seen: dict[str, set[str]] = {name: set() for name in counts.by_name}  # by tenant
        self._tenant_synced: dict[str, tuple[int, dict[str, int]]] = {}  # tenant -> (delivered, dlq) in the metrics
        self._restored_synced = 0  # restored records already counted in the metrics
        self._txn_synced = (0, 0)  # (committed, aborted) already counted in the metrics
        self._history_synced = (0, 0)  # (written, failed) already counted in the metrics

    # -- readiness --------------------------------------------------------------------------------
    def set_assigned(self, assigned: bool) -> None:
        """Partitions are held (owned or restoring), or none are."""
        self.assigned = assigned
        self.readiness()

    def broker_status(self, up: bool, source: str) -> None:
        st = self.pub.state
        if up == st.broker_up:
            return
        st.broker_up = up
        if up:
            log.info("broker.reachable", source=source)
        else:
            log.warning("broker.unreachable", source=source)
        self.readiness()

    def readiness(self) -> None:
        if self.health is not None:
            self.health.set_assigned(self.assigned)
            self.health.set_broker_reachable(self.pub.state.broker_up)

    # -- metrics and stats ------------------------------------------------------------------------
    def statistics(self, stats_json: str) -> None:
        """librdkafka's statistics (``stats_cb``)."""
        if self.metrics is not None:
            self.metrics.update_from_stats(stats_json)

    def pending_by_tenant(self) -> dict[str, dict[str, int]]:
        """Pending records by tenant and tier over the owned stores (a tier seen once stays, at 0)."""
        out = {name: dict.fromkeys(seen, 0) for name, seen in self._tiers_seen.items()}
        by_topic = self.counts.by_topic
        for store in self.stores.values():
            pending = out[by_topic[store.topic].name]
            for tier, n in store.pending().items():
                pending[tier] = pending.get(tier, 0) + n
        for name, pending in out.items():
            self._tiers_seen[name].update(pending)
        return out

    def tenant_stats(self, pending: dict[str, dict[str, int]]) -> dict[str, Any]:
        """The ``stats`` event's per-tenant fields (see the module docstring)."""
        rows = sorted(((name, sum(pending[name].values()), t.counters) for name, t in self.counts.by_name.items()),
                      key=lambda r: (-r[1], r[0]))
        out: dict[str, Any] = {"tenants": {
            name: {"pending": p, "delivered": k.delivered, "dlq": sum(k.dlq.values())}
            for name, p, k in rows[:STATS_TENANTS]}}
        if len(rows) > STATS_TENANTS:
            out["tenants_omitted"] = len(rows) - STATS_TENANTS
        return out

    def stats(self) -> None:
        """The ``stats`` event: totals since start, and the turns since the previous one."""
        by_tenant = self.pending_by_tenant()
        pending: dict[str, int] = {}
        for by_tier in by_tenant.values():
            for tier, n in by_tier.items():
                if n:
                    pending[tier] = pending.get(tier, 0) + n
        k = self.counts.totals()
        turn_count, slow_turns, slowest_turn_ms = self.turns.take()
        late_wakes, latest_wake_ms = self.turns.take_wakes()
        log.info(
            "stats", ingested=k.ingested, scheduled=k.scheduled, delivered=k.delivered, cancelled=k.cancelled,
            duplicates=k.duplicates, replaced=k.replaced, fired=k.fired, missed=k.missed, dlq=sum(k.dlq.values()),
            published_direct=k.published_direct, dlq_by_reason={r: n for r, n in k.dlq.items() if n},
            pending=sum(pending.values()), pending_by_tier=pending, in_flight=self.pub.in_flight,
            retry_queue=len(self.pub.retries), early=k.early, paused=self.backpressure.paused, turns=turn_count,
            slow_turns=slow_turns, slowest_turn_ms=slowest_turn_ms, late_wakes=late_wakes,
            latest_wake_ms=latest_wake_ms, page_waits=self.page_waits.count,
            **({"transactions_committed": self.txn.committed, "transactions_aborted": self.txn.aborted}
               if self.txn is not None else {}),
            **({"standby_lag": {str(p): n for p, n in self._labelled(self.standbys.lag()).items()}}
               if self.standbys is not None and self.restorer is not None and self.restorer.standby else {}),
            **self.tenant_stats(by_tenant),
        )

    def _labelled(self, by_key: dict[StoreKey, _V]) -> dict[int | str, _V]:
        """Per-partition values keyed as the ``partition`` label names them: the partition number
        with one ingress topic (as before tenants), ``<topic>-<n>`` with several."""
        if not self.several_topics:
            return {k.partition: v for k, v in by_key.items()}
        return {str(k): v for k, v in by_key.items()}

    def sync_metrics(self) -> None:
        """Push counter deltas since the last sync (the hot path only bumps plain integers)."""
        m, last = self.metrics, self._last
        if m is None:
            return
        k = self.counts.totals()
        m.ingested(k.ingested - last.ingested)
        m.scheduled(k.scheduled - last.scheduled)
        m.cancelled(k.cancelled - last.cancelled)
        m.duplicates(k.duplicates - last.duplicates)
        m.replaced(k.replaced - last.replaced)
        m.recurring(k.fired - last.fired, k.missed - last.missed)
        m.publish_retries(k.publish_retries - last.publish_retries)
        if self.restorer is not None:
            mirrors = self._labelled({p: s.mirror for p, s in self.stores.items() if isinstance(s.mirror, StoreMirror)})
            m.set_changelog({p: x.produced - x.acked for p, x in mirrors.items()},
                            {p: x.failed for p, x in mirrors.items()}, self._labelled(self.restorer.remaining()))
            m.restored(self.restorer.applied - self._restored_synced)
            m.set_standby_lag(self._labelled(self.standbys.lag()) if self.standbys is not None else {})
            self._restored_synced = self.restorer.applied
        if self.txn is not None:
            t = self.txn
            m.transactions(t.committed - self._txn_synced[0], t.aborted - self._txn_synced[1], t.commit_s)
            t.commit_s = []
            self._txn_synced = (t.committed, t.aborted)
        if self.history is not None:
            hw, hf = self.history.written, self.history.failed
            m.history(hw - self._history_synced[0], hf - self._history_synced[1])
            self._history_synced = (hw, hf)
        self.sync_tenants(m)
        self._last = Counters(
            ingested=k.ingested, scheduled=k.scheduled, delivered=k.delivered, cancelled=k.cancelled,
            duplicates=k.duplicates, replaced=k.replaced, publish_retries=k.publish_retries, dlq=dict(k.dlq),
            fired=k.fired, missed=k.missed,
        )

    def sync_tenants(self, m: Any) -> None:
        """The per-tenant series: counter deltas, the lateness taken since, pending by tier."""
        pending = self.pending_by_tenant()
        for name, tally in self.counts.by_name.items():
            tm = m.tenant(name)
            k = tally.counters
            delivered, dlq = self._tenant_synced.get(name, (0, {}))
            tm.delivered(k.delivered - delivered)
            tm.dead_lettered_by_reason({r: n - dlq.get(r, 0) for r, n in k.dlq.items()})
            self._tenant_synced[name] = (k.delivered, dict(k.dlq))
            tm.observe_lateness_ms(tally.lateness)
            tally.lateness.clear()  # in place: the stores (and the C delivery reports) hold this list
            tm.set_pending_many(pending[name])

