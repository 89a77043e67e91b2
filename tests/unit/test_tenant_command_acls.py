"""``acls --for tenant``: besides the sidecar's deliveries, what ``cancel --tenant`` and ``dlq
list``/``dlq redrive --tenant`` need when they run as the tenant (tests/secure/
test_tenant_commands.py grants exactly these on a secured broker)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sidecar.acls import LITERAL, PREFIXED, Target, tenant_acls
from sidecar.cli import main
from sidecar.config import load_settings

CONFIG = """changelog: "off"
tenants:
  payments:
    ingress-topic: payments.delay
    dlq-topic: payments.dlq
    target-allowlist: ['payments\\..*']
    kafka: {sasl.username: payments}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(CONFIG)
    return path


def test_the_tenants_commands_are_covered(config: Path) -> None:
    s = load_settings({}, config_file=config)
    rows = [(a.resource, a.name, a.pattern, a.operation, a.when) for a in tenant_acls(s, s.tenants[0])]
    assert rows == [
        ("topic", "payments.dlq", LITERAL, "Write", "always"),
        ("topic", "payments.", PREFIXED, "Write", "each target"),  # deliveries, and a redrive --to target
        ("topic", "payments.delay", LITERAL, "Write", "cancel --tenant"),  # and a redrive --to ingress
        ("topic", "payments.dlq", LITERAL, "Read", "dlq --tenant"),
        ("topic", "payments.dlq.redrive", LITERAL, "Read", "dlq --tenant"),
        ("group", "delay-sidecar-dlq-", PREFIXED, "Describe", "dlq --tenant"),
        ("topic", "payments.dlq.redrive", LITERAL, "Write", "dlq redrive --tenant"),
        ("transactional-id", "delay-sidecar-redrive.payments.dlq", LITERAL, "Write", "dlq redrive --tenant"),
    ]
    created = tenant_acls(s, s.tenants[0], [Target("x")], create_topics=True)
    assert [(a.name, a.operation, a.when) for a in created if a.operation == "Create"] == [
        ("payments.dlq.redrive", "Create", "dlq redrive --tenant --create-topics")]


def test_every_format_has_them(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acls", "--config", str(config), "--for", "tenant"]) == 0
    out = capsys.readouterr().out
    assert "--operation Write --topic payments.delay" in out
    assert "--operation Write --transactional-id delay-sidecar-redrive.payments.dlq" in out
    assert "--operation Describe --group delay-sidecar-dlq- --resource-pattern-type prefixed" in out
    assert main(["acls", "--config", str(config), "--for", "tenant", "--format", "strimzi"]) == 0
    user = yaml.safe_load(capsys.readouterr().out)
    ops = {(e["resource"]["type"], e["resource"]["name"]): e["operations"]
           for e in user["spec"]["authorization"]["acls"]}
    assert ops[("topic", "payments.dlq")] == ["Write", "Read"]
    assert ops[("topic", "payments.dlq.redrive")] == ["Read", "Write"]
    assert ops[("transactionalId", "delay-sidecar-redrive.payments.dlq")] == ["Write"]
    assert ops[("group", "delay-sidecar-dlq-")] == ["Describe"]
    assert main(["acls", "--config", str(config), "--for", "tenant", "--format", "table"]) == 0
    assert "| topic | `payments.delay` | literal | Write | cancel --tenant |" in capsys.readouterr().out
