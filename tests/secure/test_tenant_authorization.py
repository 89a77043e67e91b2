"""Each tenant publishes as its own principal, so the broker decides what a tenant may write.

Two tenants behind one sidecar on the secured broker, each with ``kafka:`` credentials of its own
(alice's password from a file, bob's from an environment variable) holding exactly the ACLs
``delay-sidecar acls --for tenant`` prints, the sidecar's principal those of ``--for run`` (no
Write on any target). Tenant A schedules a record into tenant B's target, which alice may not
write: it lands in A's DLQ as ``not-authorized``, naming the topic and alice; B's target never
sees it; A's other records and all of B's (so, through bob's producer) arrive, once each.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sidecar import contract as c
from sidecar.acls import Target, acls_for, tenant_acls
from sidecar.config import load_settings
from tests.integration.harness import TenantSidecar, consume_until
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import kafka_flags, read_all

pytestmark = pytest.mark.integration


def test_a_tenant_cannot_deliver_into_another_tenants_target(secure_kafka: SecureCluster, tmp_path: Path) -> None:
    cl = secure_kafka
    u = uuid.uuid4().hex[:8]
    a_in, b_in, a_dlq, b_dlq, a_out, b_out = (f"{n}-{u}" for n in ("ta", "tb", "ta-dlq", "tb-dlq", "ta-out", "tb-out"))
    cl.create_topics([a_in, b_in, a_dlq, b_dlq, a_out, b_out])
    sidecar, alice, bob = cl.new_user("sidecar"), cl.new_user("alice"), cl.new_user("bob")
    (tmp_path / "alice.pw").write_text(alice["sasl.password"] + "\n")
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(
        'changelog: "off"\n'
        "tenants:\n"
        f"  a:\n    ingress-topic: {a_in}\n    dlq-topic: {a_dlq}\n"
        f"    kafka:\n      sasl.username: {alice['sasl.username']}\n"
        f"      sasl.password: {{file: {tmp_path / 'alice.pw'}}}\n"
        f"  b:\n    ingress-topic: {b_in}\n    dlq-topic: {b_dlq}\n"
        f"    kafka:\n      sasl.username: {bob['sasl.username']}\n      sasl.password: {{env: BOB_PASSWORD}}\n"
    )
    env = {"BOB_PASSWORD": bob["sasl.password"]}
    s = load_settings({"group-id": f"sc-{a_in}"}, config_file=cfg, environ=env)
    a, b = s.tenants
    cl.grant(SecureCluster.principal(sidecar), acls_for("run", s))
    cl.grant(SecureCluster.principal(alice), tenant_acls(s, a, [Target(a_out)]))
    cl.grant(SecureCluster.principal(bob), tenant_acls(s, b, [Target(b_out)]))
    sc = TenantSidecar(cl.bootstrap, tmp_path / "data", a_in, a_dlq, instance="0",
                       extra=["--delivery-attempts", "2", *kafka_flags(sidecar)], env=env)
    sc.config = cfg
    try:
        sc.start()
        p = Producer({**cl.admin_conf, "enable.idempotence": True, "linger.ms": 5})

        def send(topic: str, target: str, rid: str, delay_ms: int = 300) -> None:
            p.produce(topic, key=rid.encode(), value=rid.encode(), headers=[
                (c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, rid.encode())])

        send(a_in, b_out, "steal")
        for i in range(3):
            send(a_in, a_out, f"a-{i}")
        for i in range(5):
            send(b_in, b_out, f"b-{i}", 300 + 100 * i)
        assert p.flush(30) == 0

        letters = consume_until(cl.bootstrap, [a_dlq], 1, 60, conf=cl.admin_conf)
        got_b = consume_until(cl.bootstrap, [b_out], 5, 60, settle_s=1, conf=cl.admin_conf)
        got_a = consume_until(cl.bootstrap, [a_out], 3, 60, conf=cl.admin_conf)
        assert [r.value for r in letters] == [b"steal"]
        assert letters[0].headers[c.DLQ_REASON] == c.NOT_AUTHORIZED.encode()
        error = (letters[0].headers[c.DLQ_ERROR] or b"").decode()
        assert f"User:{alice['sasl.username']} may not write topic '{b_out}'" in error, error
        assert "TOPIC_AUTHORIZATION_FAILED" in error, error
        assert sorted(r.value or b"" for r in got_b) == [b"b-%d" % i for i in range(5)]  # no steal, none twice
        assert sorted(r.value or b"" for r in got_a) == [b"a-%d" % i for i in range(3)]
        assert read_all(cl, b_dlq) == []
        assert [r.value for r in read_all(cl, a_dlq)] == [b"steal"]
        log = sc.log_text()
        assert not [u for u in (alice, bob, sidecar) if u["sasl.password"] in log], "a password in the log"
        assert '"event":"tenant.producer"' in log
    finally:
        sc.stop_quietly()
