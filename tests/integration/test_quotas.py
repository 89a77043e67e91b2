"""Tenant quotas on the real broker, one sidecar process, two tenants (``tenants:`` in the YAML file).

Tenant ``q`` has ``max-pending: 40``: of 60 records scheduled at once, 40 are delivered and 20
land in its DLQ as ``quota-exceeded``, none lost. Tenant ``p`` has ``max-delivery-rate: 100``:
200 records due at the same moment are delivered at about 100/s, none early. The metrics name
both (``quota_rejections_total``, ``pacing_lag_seconds``).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.harness import TenantSidecar, consume_until, create_topics, free_port, producer

pytestmark = pytest.mark.integration


def test_quota_excess_goes_to_the_dlq_and_a_paced_tenant_keeps_its_rate(
        kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    q_in, p_in, target = f"quota-q-{unique}", f"quota-p-{unique}", f"quota-out-{unique}"
    create_topics(kafka_bootstrap, [q_in, p_in], 2)
    create_topics(kafka_bootstrap, [target], 2)
    port = free_port()
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(
        f"ingress-partitions: 2\nhttp-port: {port}\nhttp-host: 127.0.0.1\n"
        "tenants:\n"
        f"  q:\n    ingress-topic: {q_in}\n    dlq-topic: {q_in}.dlq\n    max-pending: 40\n"
        f"  p:\n    ingress-topic: {p_in}\n    dlq-topic: {p_in}.dlq\n    max-delivery-rate: 100\n"
    )
    sc = TenantSidecar(kafka_bootstrap, tmp_path / "m1", q_in, f"{q_in}.dlq")
    sc.config = cfg
    sent: dict[str, int] = {}
    try:
        sc.start()
        p = producer(kafka_bootstrap)
        now = int(time.time() * 1000)
        for topic, prefix, n, due in ((q_in, "q", 60, now + 4000), (p_in, "p", 200, now + 3000)):
            for i in range(n):
                rid = f"{prefix}-{i}"
                sent[rid] = due
                p.produce(topic, value=b"v", key=rid.encode(), headers=[
                    ("delay.target-topic", target.encode()), ("delay.deliver-at", str(due).encode()),
                    ("delay.id", rid.encode())])
        assert p.flush(30) == 0
        dead = consume_until(kafka_bootstrap, [f"{q_in}.dlq"], 20, 30, settle_s=0.5)
        got = consume_until(kafka_bootstrap, [target], 240, 60, settle_s=1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        sc.stop_quietly()
    assert {r.headers["delay.dlq.reason"] for r in dead} == {b"quota-exceeded"} and len(dead) == 20
    ids = [(r.headers["delay.id"] or b"").decode() for r in got]
    assert len(ids) == len(set(ids)) == 240, "each delivered once"
    lost = set(sent) - set(ids) - {(r.headers["delay.id"] or b"").decode() for r in dead}
    assert not lost, f"lost: {sorted(lost)[:5]}"
    assert not [r for r in got if r.lateness_ms < 0], "delivered early"
    paced = sorted(r.timestamp_ms for r in got if r.topic == target and (r.headers["delay.id"] or b"")[:2] == b"p-")
    span_s = (paced[-1] - paced[0]) / 1000
    assert 1.5 <= span_s <= 3.0, f"200 records at 100/s (a burst of 10 first) took {span_s:.2f} s"
    assert 'delay_sidecar_quota_rejections_total{reason="max-pending",tenant="q"} 20.0' in metrics
    assert 'delay_sidecar_pacing_lag_seconds{tenant="p"}' in metrics
