"""Two tenants served by two sidecar processes in one consumer group, on the real broker.

Each tenant has its own ingress topic, DLQ and changelog (``tenants:`` in the YAML file). Both
processes subscribe to both ingress topics; the group splits the partitions of both between
them, and a graceful scale-in hands one member's partitions of both tenants to the other with
their pending records (restored from each tenant's changelog). Every record of each tenant is
delivered, none early, none twice; each tenant's bad input lands in its own DLQ.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.harness import TenantSidecar, consume_until, create_topics, producer

pytestmark = pytest.mark.integration

PARTITIONS = 3


def test_two_tenants_two_processes_one_group(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    a_in, b_in = f"ten-a-{unique}", f"ten-b-{unique}"
    target = f"ten-out-{unique}"
    create_topics(kafka_bootstrap, [a_in, b_in], PARTITIONS)
    create_topics(kafka_bootstrap, [target], 2)
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(
        f"ingress-partitions: {PARTITIONS}\n"
        "tenants:\n"
        f"  a:\n    ingress-topic: {a_in}\n    dlq-topic: {a_in}.dlq\n"
        f"  b:\n    ingress-topic: {b_in}\n    dlq-topic: {b_in}.dlq\n    target-allowlist: ['{target}']\n"
    )
    members = []
    for name in ("m1", "m2"):
        sc = TenantSidecar(kafka_bootstrap, tmp_path / name, a_in, f"{a_in}.dlq", instance=name)
        sc.config = cfg
        members.append(sc)
    m1, m2 = members
    try:
        m1.start()
        m2.start()
        deadline = time.monotonic() + 60
        while '"event":"partition.restored"' not in m2.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)  # m2 owns some of the partitions
        sent: dict[str, int] = {}
        p = producer(kafka_bootstrap)
        for i in range(300):
            topic, rid = (a_in, f"a-{i}") if i % 2 == 0 else (b_in, f"b-{i}")
            d = 2500 + (i % 20) * 100
            sent[rid] = int(time.time() * 1000) + d
            p.produce(topic, value=b"v", key=rid.encode(), headers=[
                ("delay.target-topic", target.encode()), ("delay.ms", str(d).encode()), ("delay.id", rid.encode())])
        for topic, rid, dest in ((a_in, "a-bad", a_in), (b_in, "b-bad", f"{a_in}.dlq")):
            # a: its own ingress topic; b: outside its allowlist
            p.produce(topic, value=b"v", key=rid.encode(), headers=[
                ("delay.target-topic", dest.encode()), ("delay.ms", "10"), ("delay.id", rid.encode())])
        assert p.flush(30) == 0
        time.sleep(1)
        assert m2.terminate() == 0  # scale-in: m1 takes m2's partitions of both tenants, with their pending records
        got = consume_until(kafka_bootstrap, [target], len(sent), 90, settle_s=2)
        dead_a = consume_until(kafka_bootstrap, [f"{a_in}.dlq"], 1, 30, settle_s=0.5)
        dead_b = consume_until(kafka_bootstrap, [f"{b_in}.dlq"], 1, 30, settle_s=0.5)
    finally:
        for sc in members:
            sc.stop_quietly()
    ids = Counter((r.headers["delay.id"] or b"").decode() for r in got)
    lost = sorted(set(sent) - set(ids))
    assert not lost, f"{len(lost)} of {len(sent)} never delivered, e.g. {lost[:5]}"
    assert not [r for r in got if r.lateness_ms < 0], "delivered early"
    assert all(n == 1 for n in ids.values()), ids.most_common(3)
    assert [r.headers["delay.id"] for r in dead_a] == [b"a-bad"]
    assert [r.headers["delay.id"] for r in dead_b] == [b"b-bad"]
    m1_log = m1.log_text()
    assert f'"topic":"{a_in}"' in m1_log and f'"topic":"{b_in}"' in m1_log
