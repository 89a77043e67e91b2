"""Each printed ACL is needed, and missing it loses nothing.

For every ACL ``delay-sidecar acls`` prints for the sidecar (at-least-once with changelog and
history; exactly-once for the transactional id and the targets), the sidecar starts with all
the others: it must say so (exit, or log the broker's authorization error) and deliver nothing
that it would later lose. Then the ACL is granted (and the sidecar started again if it exited):
every record arrives, none early, and the bad record reaches the DLQ. A target without Write is
the exception by design: its records are dead-lettered (at-least-once: ``not-authorized``, the
broker's refusal; exactly-once: ``delivery-failed`` after ``delivery-grace``, the target never
produced to), never delivered and never dropped.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sidecar import acls
from sidecar import contract as c
from sidecar.config import load_settings
from tests.integration.harness import SidecarProcess, consume_until
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import Deployment

pytestmark = pytest.mark.integration

_SAMPLE = load_settings({"ingress-topic": "in", "group-id": "sc-in", "history-topic": "hist"}, environ={})
_EOS = load_settings({"ingress-topic": "in", "group-id": "sc-in", "delivery": "exactly-once"}, environ={})
_TARGET = [acls.Target("orders")]
# (mode, index of the ACL in the printed list); ids name the ACL
CASES = [("at-least-once", i, a) for i, a in enumerate(acls.acls_for("run", _SAMPLE, _TARGET))]
CASES += [("exactly-once", i, a) for i, a in enumerate(acls.acls_for("run", _EOS, _TARGET))
          if a.resource == acls.TXN or a.name == "orders"]
_ROLE = {"in": "ingress", "sc-in": "group", "delay.dlq": "dlq", "orders": "target", "in.changelog": "changelog",
         "sc-in.restore": "restore-group", "hist": "history", "sc-in.": "transactional-id"}


@pytest.fixture
def deployment(request: pytest.FixtureRequest, secure_kafka: SecureCluster, tmp_path: Path) -> Iterator[Deployment]:
    mode = request.param
    dep = Deployment(secure_kafka, tmp_path, delivery=mode, changelog="on", history=mode == "at-least-once",
                     extra=["--delivery-attempts", "2"])
    try:
        yield dep
    finally:
        dep.stop()


def _said_so(sc: SidecarProcess, timeout_s: float) -> None:
    """Wait until the sidecar exited or logged an authorization error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "authoriz" in sc.log_text().lower() or (sc.proc is not None and sc.proc.poll() is not None):
            return
        time.sleep(0.2)
    raise AssertionError(f"the sidecar neither exited nor logged an authorization error:\n{sc.log_text()[-4000:]}")


@pytest.mark.parametrize(("deployment", "index"), [(m, i) for m, i, _a in CASES], indirect=["deployment"],
                         ids=[f"{m}-{_ROLE[a.name]}-{a.operation}" for m, i, a in CASES])
def test_a_missing_acl_is_reported_and_loses_nothing(deployment: Deployment, index: int) -> None:
    dep = deployment
    missing = dep.acls()[index]
    dep.create_topics()
    dep.grant(skip=missing)
    sc = dep.sidecar("0")
    sc.start(wait_assigned=False)
    values = dep.send(3, delay_ms=1000)
    bad = Producer({**dep.producer_user, "enable.idempotence": True})
    bad.produce(dep.ingress, key=b"bad", value=b"bad", headers=[(c.TARGET_TOPIC, dep.target.encode()),
                                                                (c.DELAY_MS, b"soon")])
    assert bad.flush(30) == 0
    admin = dep.cluster.admin_conf

    if missing.resource == acls.TOPIC and missing.name == dep.target:
        # the target refuses the sidecar (or hides from it): dead-lettered, never delivered
        letters = consume_until(dep.cluster.bootstrap, [dep.dlq], 4, 60, settle_s=0.5, conf=admin)
        assert sorted(r.value or b"" for r in letters) == sorted([*values, b"bad"])
        # exactly-once too: its authorized operations are asked before a produce (nothing aborts)
        reasons = {(r.headers[c.DLQ_REASON] or b"").decode() for r in letters if r.value != b"bad"}
        assert reasons == {c.NOT_AUTHORIZED}
        assert dep.read_all(dep.target) == []
        return
    _said_so(sc, 30)
    early = dep.read_all(dep.target)
    dep.cluster.grant(SecureCluster.principal(dep.sidecar_user), [missing])
    assert sc.proc is not None
    if "kafka.unusable" in sc.log_text():  # it named the cause and is on its way out (init_transactions refused)
        try:
            sc.proc.wait(15)
        except subprocess.TimeoutExpired:
            sc.kill()
            raise AssertionError("the sidecar said kafka.unusable but did not exit") from None
    assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]
    if sc.proc.poll() is not None:
        sc.start(wait_assigned=False)
    got = consume_until(dep.cluster.bootstrap, [dep.target], 3, 60, settle_s=0.5, conf=admin)
    assert {r.value for r in got} == set(values), [r.value for r in early]
    assert all(r.lateness_ms >= 0 for r in got)
    letters = consume_until(dep.cluster.bootstrap, [dep.dlq], 1, 60, conf=admin)
    assert [r.value for r in letters] == [b"bad"]

