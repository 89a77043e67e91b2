"""``cancel --tenant`` and ``dlq redrive --tenant`` run as the tenant, under exactly the ACLs
``delay-sidecar acls --for tenant`` prints for it, on the secured broker.

One tenant principal holds those ACLs and nothing more (the topics, the redrive's marker topic
included, made beforehand by the admin); the commands log in as it (``--kafka`` with its
credentials, and its ``kafka:`` for their producers). ``cancel`` writes its cancel record;
``dlq redrive`` sends dead letters back to their target and to the ingress topic. Then, one at a
time, each ACL those commands use is taken away: the command fails with one line naming the
operation, the resource and the principal (no traceback), or, for a target it may not write, the
redrive skips that target's dead letters and its summary names the ACL; nothing is redriven, so
the last, complete run still sends every dead letter exactly once.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sidecar import contract as c
from sidecar.acls import Acl, Target, tenant_acls
from sidecar.cli import main
from sidecar.config import load_settings
from tests.secure.cluster import SecureCluster
from tests.secure.deploy import kafka_flags, read_all

pytestmark = pytest.mark.integration

TARGET_REASON, INGRESS_REASON = c.NOT_AUTHORIZED, c.QUOTA_EXCEEDED


@dataclass
class Tenant:
    cluster: SecureCluster
    cfg: Path
    user: dict[str, str]
    ingress: str
    dlq: str
    target: str
    acls: list[Acl]

    @property
    def principal(self) -> str:
        return SecureCluster.principal(self.user)

    def run(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        """``delay-sidecar ARGS --tenant t`` logged in as the tenant: (exit status, stdout, stderr)."""
        code = main([*args, "--tenant", "t", "--config", str(self.cfg), "--json", "--timeout", "10s",
                     *kafka_flags(self.user)])
        out, err = capsys.readouterr()
        return code, out, err

    def cancel(self, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        return self.run(capsys, "cancel", "order-1", "--key", "order-1")

    def redrive(self, capsys: pytest.CaptureFixture[str], to: str) -> tuple[int, str, str]:
        return self.run(capsys, "dlq", "redrive", "--to", to, "--reason",
                        TARGET_REASON if to == "target" else INGRESS_REASON)


@pytest.fixture
def tenant(secure_kafka: SecureCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tenant:
    cl = secure_kafka
    u = uuid.uuid4().hex[:8]
    ingress, dlq, target = f"tc-in-{u}", f"tc-dlq-{u}", f"tc-out-{u}"
    cl.create_topics([ingress, dlq, target])
    cl.create_topics([dlq + ".redrive"], compact=[dlq + ".redrive"])
    nobody, user = cl.new_user("nobody"), cl.new_user("tenant")
    cfg = tmp_path / "sidecar.yaml"
    # the deployment's file: its own principal (here one without any ACL) at the top, the tenant's below
    cfg.write_text(
        f"bootstrap-servers: {cl.bootstrap}\nchangelog: \"off\"\n"
        f"kafka: {json.dumps({k: v for k, v in nobody.items() if k != 'bootstrap.servers'})}\n"
        f"tenants:\n  t:\n    ingress-topic: {ingress}\n    dlq-topic: {dlq}\n"
        f"    kafka:\n      sasl.username: {user['sasl.username']}\n      sasl.password: {{env: T_PASSWORD}}\n")
    monkeypatch.setenv("T_PASSWORD", user["sasl.password"])
    s = load_settings({}, config_file=cfg)
    acls = tenant_acls(s, s.tenants[0], [Target(target)])
    cl.grant(SecureCluster.principal(user), acls)
    # the dead letters, as the sidecar writes them: two for the target, one back through ingress
    p = Producer({**cl.admin_conf, "enable.idempotence": True})
    for i, reason in enumerate((TARGET_REASON, TARGET_REASON, INGRESS_REASON)):
        p.produce(dlq, key=b"k%d" % i, value=b"v%d" % i, headers=[
            (c.TARGET_TOPIC, target.encode()), (c.DELIVER_AT, b"1000"), (c.ID, b"id-%d" % i),
            (c.DLQ_REASON, reason.encode()), (c.DLQ_SOURCE_TOPIC, ingress.encode()),
            (c.DLQ_SOURCE_PARTITION, b"0"), (c.DLQ_SOURCE_OFFSET, b"%d" % i)])
    assert p.flush(30) == 0
    return Tenant(cl, cfg, user, ingress, dlq, target, acls)


def _acl(t: Tenant, resource: str, name: str, operation: str) -> Acl:
    (found,) = [a for a in t.acls if (a.resource, a.name, a.operation) == (resource, name, operation)]
    return found


# each binding a command uses: (command, resource, name, operation, exit status without it); a
# redrive goes on without a target it may not write, naming it among the dead letters not sent
MISSING = [
    ("cancel", "topic", "{ingress}", "Write", 1),
    ("redrive-target", "topic", "{dlq}", "Read", 1),
    ("redrive-target", "topic", "{dlq}.redrive", "Read", 1),
    ("redrive-target", "topic", "{dlq}.redrive", "Write", 1),
    ("redrive-target", "transactional-id", "delay-sidecar-redrive.{dlq}", "Write", 1),
    ("redrive-target", "group", "delay-sidecar-dlq-", "Describe", 1),
    ("redrive-target", "topic", "{target}", "Write", 0),
    ("redrive-ingress", "topic", "{ingress}", "Write", 1),
]


def test_the_printed_acls_are_enough_and_each_is_needed(tenant: Tenant, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = tenant.cancel(capsys)
    assert code == 0, err
    assert json.loads(out)["ingress_topic"] == tenant.ingress
    code, out, err = tenant.redrive(capsys, "ingress")  # and the marker topic has something to read
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["sent"] == 1, out

    names = {"ingress": tenant.ingress, "dlq": tenant.dlq, "target": tenant.target}
    unclear = []  # every refusal whose message does not say what is missing
    for command, resource, name, operation, status in MISSING:
        acl = _acl(tenant, resource, name.format(**names), operation)
        tenant.cluster.revoke_acls(tenant.principal, [acl])
        try:
            code, out, err = (tenant.cancel(capsys) if command == "cancel"
                              else tenant.redrive(capsys, command.removeprefix("redrive-")))
        finally:
            tenant.cluster.grant(tenant.principal, [acl])
        said = err if status else json.loads(out)["why"]  # one line on stderr, or why some were not sent
        clear = (code == status and "Traceback" not in err and (status == 0 or err.count("\n") == 1)
                 and f"{operation} on {resource} {acl.name}" in str(said) and tenant.principal in str(said))
        if not clear:
            unclear.append((f"{command} without {operation} on {resource} {acl.name}", code, out, err))
    assert unclear == [], "\n".join(f"{what}: exit {code}, stdout {out!r}, stderr {err!r}"
                                     for what, code, out, err in unclear)

    code, out, err = tenant.redrive(capsys, "target")
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["sent"] == 2, out  # none of the refused runs sent any
    assert sorted(r.value or b"" for r in read_all(tenant.cluster, tenant.target)) == [b"v0", b"v1"]
    ingress = read_all(tenant.cluster, tenant.ingress)
    assert sorted(r.value or b"" for r in ingress) == [b"", b"v2"]
    assert [r.headers[c.CANCEL] for r in ingress if c.CANCEL in r.headers] == [b"order-1"]
