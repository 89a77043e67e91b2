"""``sidecar.acls``: the ACLs each command needs, their forms, the docs' tables, the start-up
warning of the trust model. Pure functions: no broker (tests/secure/ grants these lists on a
secured broker and shows each is enough and needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sidecar import acls
from sidecar.acls import LITERAL, PREFIXED, Acl, AclInputError, Target, acls_for, render, targets_from_allowlist
from sidecar.cli import main
from sidecar.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


def _rows(found: list[Acl]) -> list[tuple[str, str, str, str]]:
    return [(a.resource, a.name, a.pattern, a.operation) for a in found]


def test_at_least_once_without_changelog_is_four_acls() -> None:
    s = load_settings({"changelog": "off"}, environ={})
    assert _rows(acls_for("run", s, [Target("orders.paid")])) == [
        ("topic", "delay.ingress", LITERAL, "Read"),
        ("group", "delay-sidecar", LITERAL, "Read"),
        ("topic", "delay.dlq", LITERAL, "Write"),
        ("topic", "orders.paid", LITERAL, "Write"),
    ]


def test_each_setting_adds_what_it_uses() -> None:
    base = set(_rows(acls_for("run", load_settings({"changelog": "off"}, environ={}))))
    full = load_settings({"delivery": "exactly-once", "history-topic": "h", "changelog-topic": "cl",
                          "group-id": "g"}, environ={})
    extra = set(_rows(acls_for("run", full, create_topics=True))) - {
        (r, "g" if n == "delay-sidecar" else n, p, o) for r, n, p, o in base}
    assert extra == {
        ("topic", "cl", LITERAL, "Write"), ("topic", "cl", LITERAL, "Read"),
        ("topic", "cl", LITERAL, "DescribeConfigs"), ("group", "g.restore", LITERAL, "Describe"),
        ("topic", "h", LITERAL, "Write"), ("transactional-id", "g.", PREFIXED, "Write"),
        ("topic", "delay.ingress", LITERAL, "Create"), ("topic", "delay.dlq", LITERAL, "Create"),
        ("topic", "cl", LITERAL, "Create"), ("topic", "h", LITERAL, "Create"),
    }


def test_the_tools_need_no_sidecar_acls() -> None:
    s = load_settings({}, environ={})
    assert _rows(acls_for("status", s)) == [("group", "delay-sidecar", LITERAL, "Describe"),
                                           ("topic", "delay.ingress", LITERAL, "Describe")]
    assert _rows(acls_for("producer", s)) == [("topic", "delay.ingress", LITERAL, "Write")]
    redrive = _rows(acls_for("dlq-redrive", s, [Target("orders.", PREFIXED)], redrive_to="ingress"))
    assert ("topic", "delay.ingress", LITERAL, "Write") in redrive
    assert ("topic", "orders.", PREFIXED, "Write") not in redrive
    assert ("transactional-id", "delay-sidecar-redrive.delay.dlq", LITERAL, "Write") in redrive
    assert not any(op == "Write" for _r, _n, _p, op in _rows(acls_for("dlq-list", s)))


@pytest.mark.parametrize(("allowlist", "targets"), [
    ([r"orders\.paid"], [Target("orders.paid")]),
    ([r"orders\..*", "payments"], [Target("orders.", PREFIXED), Target("payments")]),
    ([], []),
])
def test_targets_from_the_allowlist(allowlist: list[str], targets: list[Target]) -> None:
    assert targets_from_allowlist(allowlist) == targets


@pytest.mark.parametrize("rx", ["orders|payments", "orders.paid", "o.*x", "[a-z]+"])
def test_an_allowlist_entry_that_is_no_topic_or_prefix_is_refused(rx: str) -> None:
    with pytest.raises(AclInputError, match="--target TOPIC or --target-prefix PREFIX"):
        targets_from_allowlist([rx])


def test_kafka_acls_commands() -> None:
    out = render(acls_for("run", load_settings({"delivery": "exactly-once"}, environ={}), [Target("o.", PREFIXED)]),
                 "kafka-acls", "User:sc", bootstrap="k:9093")
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert lines[0].startswith("kafka-acls.sh --bootstrap-server k:9093 --add --allow-principal User:sc "
                               "--operation Read --topic delay.ingress")
    assert any(re.search(r"--operation Write --transactional-id delay-sidecar\. --resource-pattern-type prefixed",
                         line) for line in lines)
    assert any("--group delay-sidecar.restore" in line for line in lines)


def test_strimzi_kafka_user_merges_the_operations_of_a_resource() -> None:
    doc = yaml.safe_load(render(acls_for("run", load_settings({}, environ={})), "strimzi", "User:sc", cluster="c1"))
    assert doc["kind"] == "KafkaUser" and doc["metadata"] == {"name": "sc", "labels": {"strimzi.io/cluster": "c1"}}
    assert doc["spec"]["authentication"] == {"type": "scram-sha-512"}
    entries = doc["spec"]["authorization"]["acls"]
    changelog = [e for e in entries if e["resource"].get("name") == "delay.ingress.changelog"]
    assert changelog == [{"resource": {"type": "topic", "name": "delay.ingress.changelog", "patternType": "literal"},
                          "operations": ["Write", "Read", "DescribeConfigs"], "host": "*"}]
    with pytest.raises(AclInputError, match="User:NAME"):
        render([], "strimzi", "Group:x")


def test_operations_md_shows_the_tables_the_command_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/operations.md, 'The ACLs each command needs': each table is the command's output."""
    monkeypatch.setenv("PAYMENTS_PASSWORD", "secret")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("delivery: exactly-once\nhistory-topic: delay.history\n")
    doc = (ROOT / "docs" / "operations.md").read_text()
    for command in acls.COMMANDS:
        if command == "tenant":
            continue  # its own configuration: below
        assert main(["acls", "--config", str(cfg), "--format", "table", "--target-prefix", "orders.",
                     "--create-topics", "--for", command]) == 0
        table = capsys.readouterr().out
        assert table in doc, f"docs/operations.md lacks the table of --for {command}:\n{table}"
    cfg.write_text(TENANTS)
    assert main(["acls", "--config", str(cfg), "--format", "table", "--for", "tenant"]) == 0
    tables = capsys.readouterr().out
    assert tables in doc, f"docs/operations.md lacks the tables of --for tenant:\n{tables}"
    assert main(["acls", "--config", str(cfg), "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert table in doc, f"docs/operations.md lacks the table of --for run with tenants:\n{table}"
    cfg.write_text(TENANTS.replace('changelog: "off"', "delivery: exactly-once"))  # each tenant's transactions
    for command in ("tenant", "run"):
        assert main(["acls", "--config", str(cfg), "--format", "table", "--for", command]) == 0
        tables = capsys.readouterr().out
        assert tables in doc, f"docs/operations.md lacks the exactly-once tables of --for {command}:\n{tables}"


# the configuration of the docs' tenant tables (docs/operations.md, "Tenants' own principals")
TENANTS = """changelog: "off"
tenants:
  payments:
    ingress-topic: payments.delay
    dlq-topic: payments.dlq
    target-allowlist: ['payments\\..*']
    kafka:
      sasl.username: payments
      sasl.password: {env: PAYMENTS_PASSWORD}
  search:
    ingress-topic: search.delay
    dlq-topic: search.dlq
    target-allowlist: ['search\\.index']
    kafka:
      sasl.username: search
"""


def test_cli_errors_name_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("target-allowlist: ['a|b']\n")
    assert main(["acls", "--config", str(cfg)]) == 2
    assert "target-allowlist entry 'a|b'" in capsys.readouterr().err
    assert main(["acls", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["acls"]) == 0
    captured = capsys.readouterr()
    assert "no target topics" in captured.err and "--operation Read --topic delay.ingress" in captured.out


def test_dev_kafka_user_needs_secure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev-kafka", "--user", "alice"]) == 2
    assert "--user needs --secure" in capsys.readouterr().err
    assert main(["dev-kafka", "--secure", "--user", "a,b"]) == 2
    assert "bad value for --user" in capsys.readouterr().err


@pytest.mark.parametrize(("kafka", "allowlist", "warned"), [
    ({"security.protocol": "SASL_SSL"}, (), True),
    ({"security.protocol": "ssl"}, (), True),
    ({"security.protocol": "SASL_PLAINTEXT"}, (), True),
    ({"security.protocol": "SASL_SSL"}, ("orders",), False),
    ({}, (), False),
    ({"security.protocol": "PLAINTEXT"}, (), False),
])
def test_open_targets_warning(kafka: dict[str, str], allowlist: tuple[str, ...], warned: bool) -> None:
    s = load_settings({"kafka": kafka, "target-allowlist": ",".join(allowlist) or None}, environ={})
    risk = acls.open_targets(s)
    assert (risk is not None) == warned
    if risk is not None:
        assert "delay.ingress" in risk["risk"] and "target-allowlist" in risk["action"]


def test_tenant_acls_name_the_tenant_and_refuse_what_does_not_exist(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYMENTS_PASSWORD", "secret")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TENANTS)
    assert main(["acls", "--config", str(cfg), "--tenant", "search", "--principal", "User:srch"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# tenant search, User:srch\n") and "--topic search.index" in out
    assert "payments" not in out and "secret" not in out
    assert main(["acls", "--config", str(cfg), "--tenant", "nobody"]) == 2
    assert "--tenant 'nobody': not a tenant of the configuration (its tenants: payments, search)" in (
        capsys.readouterr().err)
    assert main(["acls", "--config", str(cfg), "--for", "tenant", "--format", "strimzi"]) == 0
    users = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [u["metadata"]["name"] for u in users] == ["payments", "search"]
    cfg.write_text("delivery: exactly-once\ngroup-id: grp\ntenants:\n  a:\n    ingress-topic: a.in\n")
    assert main(["acls", "--config", str(cfg), "--for", "tenant"]) == 0
    out = capsys.readouterr().out
    assert "--operation Write --transactional-id grp.a: --resource-pattern-type prefixed" in out, out
    assert "--operation Write --topic a.in.changelog " in out and "--operation Read --group grp " in out
    assert "--operation Read --topic a.in " in out and "IdempotentWrite" not in out
