"""ACLs the sidecar needs only later, checked when it starts (docs/operations.md, "When Kafka
refuses the sidecar").

Exactly-once without Write on its transactional id, and the changelog's restore-time ACLs (Read on
the changelog topic, Describe on the group ``<group-id>.restore``, used only when a store is
restored, that is at a failover): ``run`` does not exit and does not wait for the failover to
find out. It answers ``/readyz`` 503 naming the operation, the resource and the principal, logs a
``kafka.waiting`` warning, consumes nothing, and once the ACL is granted it starts without a
restart: every record sent meanwhile arrives (read as a ``read_committed`` consumer), none early.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sidecar import acls, client
from sidecar.config import load_settings
from sidecar.contract import restore_group
from tests.integration.harness import consume_until
from tests.integration.refusals import Run, kafka_flags
from tests.secure.cluster import SecureCluster

pytestmark = pytest.mark.integration


def _refused_then_granted(tmp_path: Path, cluster: SecureCluster, delivery: str, missing_of: str) -> None:
    """Start ``run`` with every printed ACL but the one ``missing_of`` picks (``txn``, ``read``,
    ``restore``), check what it says, send records, grant the ACL, check they all arrive."""
    name = tmp_path.name
    user = cluster.new_user("later")
    principal = SecureCluster.principal(user)
    settings = load_settings({"ingress-topic": f"in-{name}", "dlq-topic": f"dlq-{name}", "group-id": f"g-{name}",
                              "delivery": delivery, "changelog": "on"}, environ={})
    changelog = settings.changelog_topic_name
    assert changelog is not None
    target = f"out-{name}"
    cluster.create_topics([settings.ingress_topic, settings.dlq_topic, target, changelog], compact=[changelog])
    printed = acls.acls_for("run", settings, [acls.Target(target)])
    [missing] = [a for a in printed if {
        "txn": a.resource == acls.TXN,
        "read": a.resource == acls.TOPIC and a.name == changelog and a.operation == "Read",
        "restore": a.resource == acls.GROUP and a.name == restore_group(settings.group_id),
    }[missing_of]]
    cluster.grant(principal, [a for a in printed if a != missing])
    run = Run(tmp_path, ["--delivery", delivery, "--changelog", "on", "--transaction-interval", "100ms",
                         *kafka_flags(user)])
    try:
        kafka = run.wait_readyz(30, "not-authorized")["kafka"]
        resource = {"txn": f"transactional-id g-{name}.", "read": f"topic {changelog}",
                    "restore": f"group g-{name}.restore"}[missing_of]
        assert kafka["operation"] == missing.operation and kafka["principal"] == principal, kafka
        # the transactional id is <group-id>.<the instance id kept in the data directory>
        assert kafka["resource"] == resource if missing_of != "txn" else kafka["resource"].startswith(resource)
        waiting = run.events("kafka.waiting")
        assert waiting and waiting[0]["resource"] == kafka["resource"] and waiting[0]["principal"] == principal
        assert f"allow {missing.operation} on {kafka['resource']}" in waiting[0]["message"]

        producer = Producer({**cluster.admin_conf, "enable.idempotence": True})
        values = [f"{missing_of}-{i}".encode() for i in range(3)]
        for v in values:
            client.send_delayed(producer, target, v, key=v, delay="1s", ingress_topic=settings.ingress_topic,
                                id=v.decode())
        assert producer.flush(30) == 0
        time.sleep(1.5)  # due by now: still refused, so nothing may have been delivered
        assert consume_until(cluster.bootstrap, [target], 1, 1, conf=cluster.admin_conf) == []
        assert run.proc.poll() is None and run.readyz()[0] == 503

        cluster.grant(principal, [missing])
        run.wait_readyz(60, None)
        got = consume_until(cluster.bootstrap, [target], 3, 60, settle_s=0.5,
                            conf={**cluster.admin_conf, "isolation.level": "read_committed"})
        assert sorted(r.value or b"" for r in got) == values
        assert all(r.lateness_ms >= 0 for r in got), [r.lateness_ms for r in got]
    finally:
        assert run.stop() == 0
    assert not run.events("kafka.unusable")


def test_exactly_once_waits_for_its_transactional_id(tmp_path: Path, secure_kafka: SecureCluster) -> None:
    _refused_then_granted(tmp_path, secure_kafka, "exactly-once", "txn")


@pytest.mark.parametrize("missing", ["read", "restore"], ids=["changelog-Read", "restore-group-Describe"])
def test_restore_acls_are_checked_at_start(tmp_path: Path, secure_kafka: SecureCluster, missing: str) -> None:
    _refused_then_granted(tmp_path, secure_kafka, "at-least-once", missing)
