"""Per-tenant visibility on the Kafka twin (tests/unit/helpers/world.py): the metrics' ``tenant``
label and the ``stats`` event's tenant counts, for two tenants and for the one implicit tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar import contract as c
from sidecar.engine import reporting
from sidecar.engine.reporting import STATS_TENANTS
from sidecar.engine.tenant_counts import TenantCounts
from sidecar.metrics import Metrics
from sidecar.tenants import DEFAULT_TENANT, Tenant
from tests.unit.helpers.world import World

A, B = "team-a.in", "team-b.in"
P = "delay_sidecar_"


def series(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One family's samples named ``name``: labels -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.seen.append((event, kw))

    def warning(self, event: str, **kw: Any) -> None:
        self.seen.append((event, kw))


def test_two_tenants_each_have_their_own_series_and_stats_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(tmp_path, tenants=(A, B))
    sc = w.sidecar("a", changelog="off")
    w.run([sc], lambda: bool(sc.stores))
    w.send(30, lambda i: 200, prefix="a", topic=A)
    w.send(10, lambda i: 300, prefix="b", topic=B)
    w.send(3, lambda i: 100, prefix="b-bad", topic=B, target=A)  # another tenant's ingress topic: refused
    w.send(5, lambda i: 60_000, prefix="b-later", topic=B)  # still pending at the end
    w.run([sc], lambda: len(w.delivered()) >= 40 and len(w.cluster.records(f"{B}.dlq")) >= 3)
    m = sc.metrics
    sc.reporting.sync_metrics()
    # B's dead letters are delivered too: to B's DLQ
    assert series(m, P + "delivered_records_total") == {(("tenant", A),): 30, (("tenant", B),): 13}
    dlq = series(m, P + "dlq_records_total")
    assert dlq[(("reason", c.TARGET_IS_INTERNAL), ("tenant", B))] == 3
    assert dlq[(("reason", c.TARGET_IS_INTERNAL), ("tenant", A))] == 0
    assert sum(dlq.values()) == 3
    counts = series(m, P + "delivery_lateness_seconds_count")
    assert counts == {(("tenant", A),): 30, (("tenant", B),): 13}
    pending = series(m, P + "pending_records")
    assert sum(n for k, n in pending.items() if ("tenant", B) in k) == 5
    assert sum(n for k, n in pending.items() if ("tenant", A) in k) == 0
    assert sc.counters.delivered == 43 and sum(sc.counters.dlq.values()) == 3  # the totals: both tenants'

    # a second sync adds only what is new: deltas per tenant, the lateness taken once
    w.send(2, lambda i: 100, prefix="a2", topic=A)
    w.run([sc], lambda: len(w.delivered()) >= 42)
    sc.reporting.sync_metrics()
    assert series(m, P + "delivered_records_total")[(("tenant", A),)] == 32
    assert series(m, P + "delivery_lateness_seconds_count")[(("tenant", A),)] == 32
    assert series(m, P + "delivered_records_total")[(("tenant", B),)] == 13

    events = Events()
    monkeypatch.setattr(reporting, "log", events)
    sc.reporting.stats()
    [(_, stats)] = [e for e in events.seen if e[0] == "stats"]
    assert stats["tenants"] == {B: {"pending": 5, "delivered": 13, "dlq": 3},
                                A: {"pending": 0, "delivered": 32, "dlq": 0}}
    assert list(stats["tenants"]) == [B, A]  # the most pending first
    assert "tenants_omitted" not in stats and stats["delivered"] == 45 and stats["pending"] == 5
    sc.shutdown()


def test_one_implicit_tenant_is_labelled_default(tmp_path: Path) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a", changelog="off")
    w.send(5, lambda i: 100)
    w.run([sc], lambda: len(w.delivered()) >= 5)
    sc.reporting.sync_metrics()
    assert series(sc.metrics, P + "delivered_records_total") == {(("tenant", DEFAULT_TENANT),): 5}
    assert series(sc.metrics, P + "delivery_lateness_seconds_count") == {(("tenant", DEFAULT_TENANT),): 5}
    assert sc.counts.totals() is sc.counts.loop  # one tenant: the loop's own counters, live
    sc.shutdown()


def test_a_stats_line_names_a_bounded_number_of_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    n = STATS_TENANTS + 7
    tenants = [Tenant(f"t{i:02}", f"t{i:02}.in", "dlq", (), 1000, None) for i in range(n)]
    counts = TenantCounts(tenants)
    for i, t in enumerate(counts.by_name.values()):
        t.counters.delivered = i
    r = reporting.Reporting.__new__(reporting.Reporting)
    r.counts = counts
    pending = {name: {"wheel": i} for i, name in enumerate(counts.by_name)}
    out = r.tenant_stats(pending)
    assert len(out["tenants"]) == STATS_TENANTS and out["tenants_omitted"] == 7
    assert next(iter(out["tenants"])) == f"t{n - 1:02}"  # the most pending first
    assert counts.totals().delivered == sum(range(n))


def test_a_lookup_narrowed_to_a_tenants_topic_sees_only_its_stores(tmp_path: Path) -> None:
    """The same id pending in two tenants' topics: each topic's look-up finds its own record."""
    w = World(tmp_path, tenants=(A, B))
    sc = w.sidecar("a", changelog="off")
    w.send(1, lambda i: 60_000, prefix="same", topic=A)
    w.send(1, lambda i: 120_000, prefix="same", topic=B)
    w.run([sc], lambda: sc.counters.ingested >= 2)
    status_a, doc_a = sc.lookup(b"same0", None, A)
    status_b, doc_b = sc.lookup(b"same0", None, B)
    assert status_a == status_b == 200
    assert doc_b["due_ms"] - doc_a["due_ms"] == 60_000
    assert sc.lookup(b"same0", None, "nobody.in")[0] == 404
    sc.shutdown()
