"""Exactly-once: one tenant's transactional id revoked while both tenants' records flow.

Two tenants with principals of their own, each holding exactly the ACLs
``delay-sidecar acls --for tenant`` prints. Write on tenant a's transactional ids is revoked
while records keep coming in for both: a's lane waits for the ACL (engine/txn_refusal.py,
txn_lanes.TopicHold), a's target sees nothing new meanwhile, and b's records, sent and falling
due during a's wait, keep being delivered. Once the ACL is granted again, a resumes with a new
transactional producer, without a restart, and a ``read_committed`` reader of each target sees
every record sent before, during and after exactly once, none early.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from sidecar import acls
from sidecar import contract as c
from tests.integration.harness import TenantSidecar, consume_until
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import TwoTenants, kafka_flags

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 2


class _Reader:
    """A read_committed reader of one target kept open: how many it has seen so far."""

    def __init__(self, conf: dict[str, str], topic: str) -> None:
        self.c = Consumer({**conf, "group.id": f"reader-{topic}", "enable.auto.commit": False,
                           "isolation.level": "read_committed"})
        self.c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.seen = 0

    def read_for(self, seconds: float) -> int:
        """Read for ``seconds`` (a stream never goes quiet); the records seen so far."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.seen += sum(1 for m in self.c.consume(1000, 0.2) if m.error() is None)
        return self.seen

    def close(self) -> None:
        self.c.close()


def test_a_tenants_revoked_transactional_id_holds_only_its_lane(secure_kafka: SecureCluster, tmp_path: Path) -> None:
    cl = secure_kafka
    two = TwoTenants.make(cl, tmp_path, "r", PARTITIONS)
    a_in, b_in, a_dlq, _b_dlq, a_out, b_out = two.topics.values()
    s, env, sidecar, alice, bob = two.settings, two.env, two.sidecar, two.alice, two.bob
    a, b = s.tenants
    cl.grant(SecureCluster.principal(sidecar), acls.acls_for("run", s))
    alice_acls = acls.tenant_acls(s, a, [acls.Target(a_out)])
    txn_acls = [x for x in alice_acls if x.resource == acls.TXN]
    assert txn_acls, alice_acls
    cl.grant(SecureCluster.principal(alice), alice_acls)
    cl.grant(SecureCluster.principal(bob), acls.tenant_acls(s, b, [acls.Target(b_out)]))
    sc = TenantSidecar(cl.bootstrap, tmp_path / "data", a_in, a_dlq, instance="0", env=env,
                       extra=["--transaction-interval", "100ms", "--ingress-partitions", str(PARTITIONS),
                              *kafka_flags(sidecar)])
    sc.config = two.config
    p = Producer({**cl.admin_conf, "enable.idempotence": True, "linger.ms": 5})
    sent: dict[str, list[str]] = {a_out: [], b_out: []}
    stop = threading.Event()

    def send_steadily() -> None:  # both tenants, 20 records/s each, 300 ms delays
        i = 0
        while not stop.is_set():
            for topic, target, prefix in ((a_in, a_out, "a"), (b_in, b_out, "b")):
                rid = f"{prefix}-{i}"
                p.produce(topic, key=rid.encode(), value=rid.encode(), headers=[
                    (c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, b"300"), (c.ID, rid.encode())])
                sent[target].append(rid)
            i += 1
            p.poll(0)
            time.sleep(0.05)

    conf = {**cl.admin_conf, "isolation.level": "read_committed"}
    reader_a, reader_b = _Reader(conf, a_out), _Reader(conf, b_out)
    sender = threading.Thread(target=send_steadily, daemon=True)
    try:
        sc.start()
        sender.start()
        assert consume_until(cl.bootstrap, [a_out, b_out], 10, 60, conf=conf)  # both delivering
        cl.revoke_acls(SecureCluster.principal(alice), txn_acls)
        deadline = time.monotonic() + 60
        while '"event":"transactions.refused"' not in sc.log_text():
            assert time.monotonic() < deadline, sc.log_text()[-3000:]
            time.sleep(0.2)
        # a waits: nothing new of a's; b's records sent and due meanwhile are delivered
        a_at, b_at = reader_a.read_for(1.0), reader_b.read_for(0.2)
        b_later = reader_b.read_for(3.0)
        a_later = reader_a.read_for(0.2)
        assert a_later == a_at, (a_at, a_later)
        assert b_later - b_at >= 40, (b_at, b_later)  # ~20/s for 3 s and more: b was not held
        assert sc.proc is not None and sc.proc.poll() is None
        refused = [line for line in sc.log_text().splitlines() if '"event":"transactions.refused"' in line]
        assert f"User:{alice['sasl.username']}" in refused[0] and f"{s.group_id}.a:" in refused[0], refused[0]
        cl.grant(SecureCluster.principal(alice), txn_acls)
        deadline = time.monotonic() + 60
        while '"event":"transactions.resumed"' not in sc.log_text():
            assert time.monotonic() < deadline, sc.log_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1)
        stop.set()
        sender.join(10)
        assert p.flush(30) == 0
        for target in (a_out, b_out):
            got = consume_until(cl.bootstrap, [target], len(sent[target]), 90, settle_s=2, conf=conf)
            seen = Counter((r.value or b"").decode() for r in got)
            assert not {k: n for k, n in seen.items() if n > 1}, "delivered twice"
            assert set(seen) == set(sent[target]), (target, len(seen), len(sent[target]))
            assert all(r.lateness_ms >= 0 for r in got), min(r.lateness_ms for r in got)
        print(f"\ntenant a's transactional id revoked for ~5 s: b delivered {b_later - b_at} records in 3 s of it; "
              f"{len(sent[a_out])} + {len(sent[b_out])} seen once by read_committed")
        assert sc.terminate() == 0
    finally:
        stop.set()
        reader_a.close()
        reader_b.close()
        sc.stop_quietly()
