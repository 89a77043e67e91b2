"""No confused deputy in the recommended deployment: Write on the ingress topic is not Write on T.

``mallory`` may write the ingress topic and nothing else. The sidecar is deployed as the docs
recommend, one of two ways: its principal holds Write only on the targets of the producers it
serves (``acls``), or it holds more but ``target-allowlist`` names only those targets
(``allowlist``). Either way a record mallory aims at ``payments`` never reaches ``payments``: it
is dead-lettered (``not-authorized``: the broker refuses the sidecar; ``target-is-internal``: the
allowlist refuses it), and mallory's records after it, for an allowed target, still arrive.
The start-up warning ``security.open_targets`` is logged once exactly when the allowlist is empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.acls import Acl
from tests.integration.harness import consume_until
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import Deployment

pytestmark = pytest.mark.integration


@pytest.fixture
def deployment(secure_kafka: SecureCluster, tmp_path: Path) -> Iterator[Deployment]:
    dep = Deployment(secure_kafka, tmp_path, extra=["--delivery-attempts", "2"])
    try:
        yield dep
    finally:
        dep.stop()


@pytest.mark.parametrize("narrowed_by", ["acls", "allowlist"])
def test_ingress_writer_cannot_reach_a_topic_it_may_not_write(deployment: Deployment, narrowed_by: str) -> None:
    dep = deployment
    payments = f"payments-{dep.ingress}"
    extra: tuple[str, ...] = ()
    if narrowed_by == "allowlist":  # the principal may write payments (another team's), the allowlist says no
        extra = ("--target-allowlist", dep.target)
    dep.targets.append(payments)  # made by the admin; the sidecar's Write on it only with the allowlist
    dep.create_topics()
    if narrowed_by == "acls":
        dep.targets.remove(payments)
    dep.grant()
    sc = dep.sidecar("0", extra)
    sc.start()
    dep.send(1, delay_ms=200, target=payments, prefix="steal")  # as mallory: Write on ingress only
    values = dep.send(3, delay_ms=500, prefix="ok")

    letters = consume_until(dep.cluster.bootstrap, [dep.dlq], 1, 60, conf=dep.cluster.admin_conf)
    arrived = consume_until(dep.cluster.bootstrap, [dep.target], 3, 60, conf=dep.cluster.admin_conf)
    assert [r.value for r in letters] == [b"steal-0"]
    reason = c.NOT_AUTHORIZED if narrowed_by == "acls" else c.TARGET_IS_INTERNAL
    assert letters[0].headers[c.DLQ_REASON] == reason.encode(), letters[0].headers
    assert sorted(r.value or b"" for r in arrived) == values
    assert dep.read_all(payments) == []
    warnings = sc.log_text().count('"event":"security.open_targets"')
    assert warnings == (1 if narrowed_by == "acls" else 0), sc.log_text()[:3000]


def test_exactly_once_dead_letters_a_target_it_may_see_but_not_write(secure_kafka: SecureCluster,
                                                                     tmp_path: Path) -> None:
    """A principal that may Describe ``payments`` but not Write it (a Describe granted on every
    topic, say): in a transaction such a produce would abort it, and again after every abort,
    stalling the partition. The sidecar asks which operations it may do on a new target first:
    the record goes to the DLQ as ``not-authorized`` without a produce, the records after it
    arrive."""
    dep = Deployment(secure_kafka, tmp_path, delivery="exactly-once", changelog="on",
                     extra=["--delivery-attempts", "2"])
    try:
        payments = f"payments-{dep.ingress}"
        dep.create_topics()
        secure_kafka.create_topics([payments])
        dep.grant()
        secure_kafka.grant(SecureCluster.principal(dep.sidecar_user), [Acl("topic", payments, "literal", "Describe")])
        sc = dep.sidecar("0")
        sc.start()
        dep.send(1, delay_ms=200, target=payments, prefix="steal")
        values = dep.send(3, delay_ms=500, prefix="ok")
        letters = consume_until(dep.cluster.bootstrap, [dep.dlq], 1, 60, conf=dep.cluster.admin_conf)
        arrived = consume_until(dep.cluster.bootstrap, [dep.target], 3, 60, conf=dep.cluster.admin_conf)
        assert [r.value for r in letters] == [b"steal-0"]
        assert letters[0].headers[c.DLQ_REASON] == c.NOT_AUTHORIZED.encode()
        assert sorted(r.value or b"" for r in arrived) == values
        assert dep.read_all(payments) == []
        assert '"event":"target.not_writable"' in sc.log_text()
        assert '"event":"transaction.aborted"' not in sc.log_text()
    finally:
        dep.stop()
