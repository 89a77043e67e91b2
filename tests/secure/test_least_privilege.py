"""The sidecar under exactly the ACLs ``delay-sidecar acls`` prints, on the secured broker.

Each mode (at-least-once; changelog with a standby and a history topic; exactly-once) runs with a
principal that holds those ACLs and nothing more (the topics made beforehand by the admin, as
docs/operations.md recommends): every delayed record arrives, none early, none dead-lettered, and
the sidecar logs no authorization error. ``status``, ``dlq list`` and ``dlq redrive`` run the same
way under their own printed ACLs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar import contract as c
from tests.integration.harness import consume_until
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import Deployment, kafka_flags

pytestmark = pytest.mark.integration

MODES = {
    "at-least-once": {"delivery": "at-least-once", "changelog": "off"},
    "changelog-standby-history": {"delivery": "at-least-once", "changelog": "on", "history": True, "partitions": 2,
                                  "extra": ["--standby-replicas", "1"]},
    "exactly-once": {"delivery": "exactly-once", "changelog": "on"},
}


@pytest.fixture
def deployment(request: pytest.FixtureRequest, secure_kafka: SecureCluster, tmp_path: Path) -> Iterator[Deployment]:
    dep = Deployment(secure_kafka, tmp_path, **MODES[request.param])
    try:
        yield dep
    finally:
        dep.stop()


@pytest.mark.parametrize("deployment", list(MODES), indirect=True)
def test_every_mode_under_the_printed_acls(deployment: Deployment) -> None:
    dep = deployment
    dep.create_topics()
    dep.grant()
    sidecars = [dep.sidecar("0")]
    if dep.partitions > 1:  # a second member: each keeps a standby of the other's partition
        sidecars.append(dep.sidecar("1"))
    for sc in sidecars:
        sc.start(wait_assigned=False)
    for sc in sidecars:
        sc.wait_for("partitions.assigned", 60)
    values = dep.send(6, delay_ms=1000)
    got = consume_until(dep.cluster.bootstrap, [dep.target], want=6, timeout_s=60, settle_s=0.5,
                        conf=dep.cluster.admin_conf)
    assert sorted(r.value or b"" for r in got) == sorted(values)
    assert all(r.lateness_ms >= 0 for r in got), [r.lateness_ms for r in got]
    assert dep.read_all(dep.dlq) == []
    if dep.history_topic is not None:
        events = [json.loads(r.value or b"{}")["event"] for r in dep.read_all(dep.history_topic)]
        assert events.count("delivered") == 6, events
    if dep.partitions > 1:
        for sc in sidecars:
            sc.wait_for("standby.started", 30)
    for sc in sidecars:
        assert "authoriz" not in sc.log_text().lower(), sc.log_text()[-3000:]


def _cli(dep: Deployment, conf: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", *args, "--bootstrap-servers", dep.cluster.bootstrap,
                           "--ingress-topic", dep.ingress, "--json", "--timeout", "20s", *kafka_flags(conf)],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("deployment", ["at-least-once"], indirect=True)
def test_status_and_dlq_commands_under_their_printed_acls(deployment: Deployment, secure_kafka: SecureCluster,
                                                          tmp_path: Path) -> None:
    dep = deployment
    dep.create_topics()
    dep.grant()
    http = str(_free_port())
    sc = dep.sidecar("0", ("--http-port", http, "--http-host", "127.0.0.1", "--delivery-attempts", "1"))
    sc.start()
    # no topic yet, and no ACL on it: the broker answers TOPIC_AUTHORIZATION_FAILED (a principal
    # that may not Describe a topic is not told whether it exists): dead-lettered as not-authorized
    late = f"late-{dep.ingress}"
    dep.send(2, delay_ms=200, target=late, prefix="late")
    dep.send(1, delay_ms=200, prefix="ok")
    assert len(consume_until(dep.cluster.bootstrap, [dep.dlq], 2, 60, conf=dep.cluster.admin_conf)) == 2

    status_user = secure_kafka.new_user("status")
    secure_kafka.grant(SecureCluster.principal(status_user), dep.acls("status"))
    st = _cli(dep, status_user, "status", "ok-0", "--group", f"sc-{dep.ingress}", "--key", "ok-0")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["state"] in ("delivered", "pending"), st.stdout

    lister = secure_kafka.new_user("dlq-list")
    secure_kafka.grant(SecureCluster.principal(lister), dep.acls("dlq-list"))
    listed = _cli(dep, lister, "dlq", "list", "--dlq-topic", dep.dlq)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout.splitlines()[-1])["by_reason"] == {c.NOT_AUTHORIZED: 2}, listed.stdout

    secure_kafka.create_topics([late, dep.dlq + ".redrive"], compact=[dep.dlq + ".redrive"])
    dep.targets.append(late)
    redriver = secure_kafka.new_user("redrive")
    secure_kafka.grant(SecureCluster.principal(redriver), dep.acls("dlq-redrive"))
    red = _cli(dep, redriver, "dlq", "redrive", "--dlq-topic", dep.dlq, "--reason", c.NOT_AUTHORIZED, "--to", "target")
    assert red.returncode == 0, red.stderr
    assert json.loads(red.stdout.splitlines()[-1])["sent"] == 2, red.stdout
    assert sorted(r.value or b"" for r in dep.read_all(late)) == [b"late-0", b"late-1"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
