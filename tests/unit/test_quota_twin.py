"""Tenant quotas on the Kafka twin and virtual time (sidecar/store/quota.py, sidecar/engine/pacing.py):
records over a tenant's ``max-pending`` or ``max-disk-bytes`` go to its DLQ as ``quota-exceeded``
and every record is accounted for; replaces and cancels are taken at the limit; a tenant with a
``max-delivery-rate`` is delivered at that rate, never early, and the other tenant on time."""

from __future__ import annotations

from pathlib import Path

from sidecar import contract as c
from sidecar.engine.loop import Sidecar
from sidecar.tenants import TenantSpec
from tests.unit.helpers.world import TARGET, World

A, B = "team-a.in", "team-b.in"


def _pending(sc: Sidecar, topic: str) -> int:
    return sum(n for k, st in sc.stores.items() if k.topic == topic for n in st.pending().values())


def _dead(w: World, topic: str) -> dict[bytes, bytes]:
    """The tenant's dead letters: id -> reason."""
    return {dict(m.headers() or [])[c.ID] or b"": dict(m.headers() or [])[c.DLQ_REASON] or b""
            for m in w.cluster.records(f"{topic}.dlq")}


def _specs(**a: object) -> tuple[TenantSpec, TenantSpec]:
    return TenantSpec("a", A, dlq_topic=f"{A}.dlq", **a), TenantSpec("b", B, dlq_topic=f"{B}.dlq")  # type: ignore[arg-type]


def _delivered_ids(w: World) -> set[bytes]:
    return {dict(m.headers() or [])[c.ID] or b"" for m in w.delivered()}


def _metric(sc: Sidecar, line: str) -> float:
    text = sc.metrics.render().decode()
    return float(next(x for x in text.splitlines() if x.startswith(line)).rsplit(" ", 1)[1])


def test_records_over_max_pending_go_to_the_dlq_and_replaces_and_cancels_are_taken(tmp_path: Path) -> None:
    w = World(tmp_path, tenants=(A, B))
    sc = w.sidecar("a", changelog="off", tenant_specs=_specs(max_pending=20))
    w.send(30, lambda i: 60_000, prefix="a", topic=A)
    w.send(30, lambda i: 60_000, prefix="b", topic=B)  # no quota: all taken
    w.run([sc], lambda: sc.counters.ingested >= 60 and len(_dead(w, A)) >= 10)
    assert _pending(sc, A) == 20 and _pending(sc, B) == 30
    dead = _dead(w, A)
    assert set(dead.values()) == {c.QUOTA_EXCEEDED.encode()} and len(dead) == 10
    error = dict(w.cluster.records(f"{A}.dlq")[0].headers() or [])[c.DLQ_ERROR] or b""
    assert error.endswith(b"records pending in this process's partitions, its max-pending is 20"), error
    taken = sorted(i for i in range(30) if b"a%d" % i not in dead)
    # at the limit, a replace of a pending id and a cancel are taken (neither adds a pending record);
    # new records are not: the replaced and the cancelled entries count until their due time passes
    moved, gone = b"a%d" % taken[0], b"a%d" % taken[1]
    w.cluster.append(A, taken[0] % 4, b"k", b"v2", [(c.TARGET_TOPIC, TARGET.encode()), (c.DELAY_MS, b"30000"),
                                                    (c.ID, moved), (c.REPLACE, b"true")])
    w.sent[moved] = w.clock.now_ms + 30_000
    w.cluster.append(A, taken[1] % 4, b"k", None, [(c.CANCEL, gone)])
    del w.sent[gone]
    w.send(2, lambda i: 1000, prefix="late", topic=A)
    w.run([sc], lambda: sc.counters.ingested >= 64 and len(_dead(w, A)) >= 12)
    assert sc.counters.replaced == 1 and sc.counters.cancelled == 1
    assert len(_dead(w, A)) == 12 and {b"late0", b"late1"} <= set(_dead(w, A))
    assert _metric(sc, 'delay_sidecar_quota_rejections_total{reason="max-pending",tenant="a"}') == 12
    assert sc.counters.dlq[c.QUOTA_EXCEEDED] == 12
    # nothing lost: every record is delivered on time, or in the DLQ
    end = max(w.sent.values()) + 1000
    w.run([sc], lambda: w.clock.now_ms >= end)
    w.check(set(w.sent) - set(_dead(w, A)))
    # delivered, the records leave the count: new ones are taken again
    w.send(5, lambda i: 1000, prefix="again", topic=A)
    w.run([sc], lambda: {b"again%d" % i for i in range(5)} <= _delivered_ids(w))
    assert len(_dead(w, A)) == 12
    assert not _dead(w, B)
    sc.shutdown()


def test_records_beyond_max_disk_bytes_go_to_the_dlq(tmp_path: Path) -> None:
    """A 2-segment share of 64 KiB segments, 2 KiB records: the first segment's worth is taken."""
    w = World(tmp_path, tenants=(A, B), partitions=1)
    seg = 64 * 1024
    sc = w.sidecar("a", changelog="off", segment_bytes=seg, max_record_bytes=8192,
                   tenant_specs=_specs(max_disk_bytes=2 * seg))
    for i in range(100):
        rid = b"a%d" % i
        w.sent[rid] = w.clock.now_ms + 60_000
        w.cluster.append(A, 0, b"k", b"x" * 2000, [(c.TARGET_TOPIC, TARGET.encode()), (c.DELAY_MS, b"60000"),
                                                   (c.ID, rid)])
    w.send(100, lambda i: 60_000, prefix="b", topic=B)
    w.run([sc], lambda: sc.counters.ingested >= 200 and _pending(sc, A) + len(_dead(w, A)) >= 100)
    dead = _dead(w, A)
    assert set(dead.values()) == {c.QUOTA_EXCEEDED.encode()}
    assert 20 <= _pending(sc, A) <= 2 * seg // 2000 and _pending(sc, A) + len(dead) == 100
    assert _pending(sc, B) == 100
    assert _metric(sc, 'delay_sidecar_quota_rejections_total{reason="max-disk-bytes",tenant="a"}') == len(dead)
    end = max(w.sent.values()) + 1000
    w.run([sc], lambda: w.clock.now_ms >= end)
    w.check(set(w.sent) - set(dead))
    sc.shutdown()


def test_a_paced_tenant_is_delivered_at_its_rate_never_early_and_the_other_on_time(tmp_path: Path) -> None:
    w = World(tmp_path, tenants=(A, B))
    sc = w.sidecar("a", changelog="off", tenant_specs=_specs(max_delivery_rate=50.0))
    w.send(100, lambda i: 1000, prefix="a", topic=A)  # all due at once: paced over ~2 s
    w.send(100, lambda i: 1000 + 10 * i, prefix="b", topic=B)
    start = w.clock.now_ms
    lags: list[float] = []

    def done() -> bool:
        lags.append(_metric(sc, 'delay_sidecar_pacing_lag_seconds{tenant="a"}'))
        return len(w.delivered()) >= 200

    w.run([sc], done)
    w.check(set(w.sent))  # all 200, each once, none early
    at: dict[bytes, int] = {dict(m.headers() or [])[c.ID] or b"": m.timestamp()[1] for m in w.delivered()}
    late_b = [at[b"b%d" % i] - w.sent[b"b%d" % i] for i in range(100)]
    assert max(late_b) <= 20, "the other tenant is not held back"
    times = sorted(at[b"a%d" % i] for i in range(100))
    # 50/s: a burst of 5 (0.1 s), then one every 20 ms: about 1.9 s for 100
    assert 1800 <= times[-1] - (start + 1000) <= 2100
    for i, t0 in enumerate(times):  # at most burst + rate x window in any window
        n = sum(1 for t in times[i:] if t - t0 <= 1000)
        assert n <= 5 + 50 + 1
    assert max(lags) >= 1.5  # the last ones are ~1.9 s behind their due time
    sc.shutdown()
