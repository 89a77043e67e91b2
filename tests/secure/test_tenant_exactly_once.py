"""Exactly-once per tenant on the secured broker: each tenant's transactions run as the tenant.

Two tenants, ``delivery: exactly-once``, each with ``kafka:`` credentials of its own holding
exactly the ACLs ``delay-sidecar acls --for tenant`` prints (its transactional ids, its changelog,
the group's offsets of its ingress topic, its DLQ and targets); the sidecar's principal holds
those of ``--for run``: no Write on any target nor on the tenants' changelogs. So every
transactional request of a tenant's partitions (the deliveries, the changelog writes, the
offsets) is the tenant's, authorized by the broker as the tenant.

Tenant A schedules a record into tenant B's target, which A's principal may not write: it lands
in A's DLQ as ``not-authorized`` (asked before the produce: nothing aborts), naming the topic and
the principal; B's target never sees it. Every other record is seen once by a ``read_committed``
reader, through a SIGKILL and a restart under load (the restart's producers fence the killed
ones and the broker aborts what they left open).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sidecar import contract as c
from sidecar.acls import Target, acls_for, tenant_acls
from tests.integration.harness import TenantSidecar, consume_until
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import TwoTenants, kafka_flags, read_all

pytestmark = pytest.mark.integration

PARTITIONS = 2
LOAD = 300  # records per tenant sent while the sidecar is killed and restarted


def _uncommitted(cl: SecureCluster, topic: str) -> int:
    """How many records ``topic`` holds, aborted transactions' included."""
    cons = Consumer({**cl.admin_conf, "group.id": f"t-{uuid.uuid4().hex[:8]}", "isolation.level": "read_uncommitted"})
    try:
        total = 0
        for p in range(len(cons.list_topics(topic, timeout=10).topics[topic].partitions)):
            low, high = cons.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        cons.close()


def test_each_tenant_delivers_exactly_once_as_itself(secure_kafka: SecureCluster, tmp_path: Path) -> None:
    cl = secure_kafka
    two = TwoTenants.make(cl, tmp_path, "e", PARTITIONS)
    a_in, b_in, a_dlq, b_dlq, a_out, b_out = two.topics.values()
    s, env, sidecar, alice, bob = two.settings, two.env, two.sidecar, two.alice, two.bob
    a, b = s.tenants
    run = acls_for("run", s)
    assert not [x for x in run if x.operation == "Write" and x.resource == "topic"], run  # nothing to write
    cl.grant(SecureCluster.principal(sidecar), run)
    cl.grant(SecureCluster.principal(alice), tenant_acls(s, a, [Target(a_out)]))
    cl.grant(SecureCluster.principal(bob), tenant_acls(s, b, [Target(b_out)]))
    sc = TenantSidecar(cl.bootstrap, tmp_path / "data", a_in, a_dlq, instance="0", env=env,
                       extra=["--delivery-attempts", "2", "--transaction-interval", "100ms",
                              "--ingress-partitions", str(PARTITIONS), *kafka_flags(sidecar)])
    sc.config = two.config
    p = Producer({**cl.admin_conf, "enable.idempotence": True, "linger.ms": 5})

    def send(topic: str, target: str, rid: str, delay_ms: int) -> None:
        p.produce(topic, key=rid.encode(), value=rid.encode(), headers=[
            (c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, rid.encode())])

    try:
        sc.start()
        send(a_in, b_out, "steal", 200)
        for i in range(5):
            send(a_in, a_out, f"a-{i}", 300 + 50 * i)
            send(b_in, b_out, f"b-{i}", 300 + 50 * i)
        assert p.flush(30) == 0
        letters = consume_until(cl.bootstrap, [a_dlq], 1, 60, conf=cl.admin_conf)
        assert [r.value for r in letters] == [b"steal"]
        assert letters[0].headers[c.DLQ_REASON] == c.NOT_AUTHORIZED.encode()
        error = (letters[0].headers[c.DLQ_ERROR] or b"").decode()
        assert f"User:{alice['sasl.username']} may not write topic '{b_out}'" in error, error
        assert "TOPIC_AUTHORIZATION_FAILED" in error, error
        consume_until(cl.bootstrap, [a_out, b_out], 10, 60, conf=cl.admin_conf)
        log = sc.log_text()
        assert '"event":"transaction.aborted"' not in log, log[-3000:]  # the refused target was never produced
        assert '"event":"target.not_writable"' in log

        # load on both tenants, a SIGKILL and a restart in the middle of it
        done = threading.Event()

        def load() -> None:  # 30 records per tenant every 0.2 s: about 2 s
            for start in range(0, LOAD, 30):
                for i in range(start, min(LOAD, start + 30)):
                    send(a_in, a_out, f"la-{i}", 100 + (i * 7) % 900)
                    send(b_in, b_out, f"lb-{i}", 100 + (i * 11) % 900)
                p.poll(0)
                time.sleep(0.2)
            p.flush(30)
            done.set()

        t = threading.Thread(target=load, daemon=True)
        t.start()
        time.sleep(1.0)
        sc.kill()
        sc.start()
        t.join(60)
        assert done.is_set()
        want = 5 + LOAD
        got_a = consume_until(cl.bootstrap, [a_out], want, 90, settle_s=1, conf=cl.admin_conf)
        got_b = consume_until(cl.bootstrap, [b_out], want, 90, settle_s=1, conf=cl.admin_conf)
        for got, prefix in ((got_a, "a"), (got_b, "b")):
            seen = Counter((r.value or b"").decode() for r in got)
            assert not {k: n for k, n in seen.items() if n > 1}, "delivered twice"
            assert set(seen) == {f"{prefix}-{i}" for i in range(5)} | {f"l{prefix}-{i}" for i in range(LOAD)}
        assert read_all(cl, b_dlq) == []
        assert [r.value for r in read_all(cl, a_dlq)] == [b"steal"]
        assert read_all(cl, b_out) and all((r.value or b"") != b"steal" for r in read_all(cl, b_out))
        written = _uncommitted(cl, a_out) + _uncommitted(cl, b_out)
        print(f"\ntenant exactly-once: {2 * want} deliveries seen once by read_committed through a SIGKILL; "
              f"{written - 2 * want} more in aborted transactions")
        log = sc.log_text()
        assert not [x for x in (alice, bob, sidecar) if x["sasl.password"] in log], "a password in the log"
        assert sc.terminate() == 0
    finally:
        sc.stop_quietly()
