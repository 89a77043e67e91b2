"""Tenants in the configuration (sidecar/tenants.py): the ``tenants:`` mapping, its defaults from
the top level, the implicit ``default`` tenant, and every refusal naming the tenant and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.acls import acls_for
from sidecar.cli import main
from sidecar.config import ConfigError, load_settings
from sidecar.tenants import DEFAULT_TENANT, Tenant

TWO = """
dlq-topic: shared.dlq
max-delay: 30d
tenants:
  payments:
    ingress-topic: payments.delay
    dlq-topic: payments.dlq
    target-allowlist: ["payments\\\\..*"]
  search:
    ingress-topic: search.delay
    max-delay: 7d
    changelog-topic: search.delay.cl
"""


def _load(tmp_path: Path, text: str, flags: dict[str, str] | None = None) -> tuple[Tenant, ...]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    return load_settings(flags, config_file=cfg, environ={}).tenants


def test_two_tenants_take_the_top_level_values_they_do_not_set(tmp_path: Path) -> None:
    pay, search = _load(tmp_path, TWO)
    assert pay == Tenant("payments", "payments.delay", "payments.dlq", ("payments\\..*",), 30 * 86_400_000,
                         "payments.delay.changelog")
    assert search == Tenant("search", "search.delay", "shared.dlq", (), 7 * 86_400_000, "search.delay.cl")


def test_changelog_off_gives_no_tenant_a_changelog(tmp_path: Path) -> None:
    assert all(t.changelog_topic is None for t in _load(tmp_path, TWO, {"changelog": "off"}))


def test_without_tenants_the_top_level_ingress_topic_is_the_default_tenant(tmp_path: Path) -> None:
    (only,) = _load(tmp_path, "ingress-topic: orders.delay\nchangelog-topic: orders.cl\ntarget-allowlist: [a]\n")
    assert only == Tenant(DEFAULT_TENANT, "orders.delay", "delay.dlq", ("a",), 400 * 86_400_000, "orders.cl")
    (dflt,) = load_settings({}, environ={}).tenants
    assert (dflt.name, dflt.ingress_topic, dflt.changelog_topic) == ("default", "delay.ingress",
                                                                     "delay.ingress.changelog")


def _tenants(body: str) -> str:
    return "tenants:\n  a:\n    ingress-topic: a.in\n" + body


@pytest.mark.parametrize(("text", "flags", "needle"), [
    ("tenants: []\n", None, "'tenants' must be a mapping"),
    ("tenants:\n  a: a.in\n", None, "tenants.a must be a mapping"),
    ("tenants:\n  'a b':\n    ingress-topic: x\n", None, "tenant name 'a b'"),
    ("tenants:\n  a:\n    dlq-topic: d\n", None, "tenants.a: ingress-topic is required"),
    ("tenants:\n  a:\n    ingress-topic: ''\n", None, "tenants.a.ingress-topic: bad value"),
    (_tenants("    max-delay: soon\n"), None, "tenants.a.max-delay: bad value"),
    (_tenants("    target-allowlist: ['(']\n"), None, "tenants.a.target-allowlist: bad value"),
    (_tenants("    max-pending: 0\n"), None, "tenants.a.max-pending: bad value: 0 is not a positive whole number"),
    (_tenants("    max-pending: 1.5\n"), None, "tenants.a.max-pending: bad value"),
    (_tenants("    max-delivery-rate: fast\n"), None, "tenants.a.max-delivery-rate: bad value: 'fast' is not a rate"),
    (_tenants("    max-delivery-rate: 0\n"), None, "tenants.a.max-delivery-rate: bad value"),
    (_tenants("    max-disk-bytes: lots\n"), None, "tenants.a.max-disk-bytes: bad value"),
    (_tenants("    max-disk-bytes: 100MiB\n"), None,
     "tenants.a.max-disk-bytes (100MiB) must be at least twice --segment-bytes (64MiB)"),
    (_tenants("    disk-share: 10GiB\n"), None, "tenants.a.disk-share: not a setting"),
    (_tenants("    scheduler: levels\n"), None, "tenants.a.scheduler: a setting of the whole deployment"),
    (_tenants("    colour: red\n"), None, "tenants.a.colour: not a setting"),
    (_tenants("  b:\n    ingress-topic: a.in\n"), None, "tenants.b.ingress-topic 'a.in' is also the ingress topic of "
                                                        "tenant 'a'"),
    (_tenants("  b:\n    ingress-topic: b.in\n    dlq-topic: a.in\n"), None,
     "tenants.b.dlq-topic 'a.in' is the ingress topic of tenant 'a'"),
    (_tenants("    dlq-topic: a.in\n"), None, "tenants.a.dlq-topic 'a.in' is the ingress topic of tenant 'a'"),
    (_tenants("  b:\n    ingress-topic: b.in\n    changelog-topic: a.in\n"), None,
     "tenants.b.changelog-topic 'a.in' is the ingress topic of tenant 'a'"),
    (_tenants("    changelog-topic: cl\n  b:\n    ingress-topic: b.in\n    changelog-topic: cl\n"), None,
     "tenants.b.changelog-topic 'cl' is also the changelog topic of tenant 'a'"),
    (_tenants("  b:\n    ingress-topic: b.in\n    target-allowlist: ['.*\\.in']\n"), None,
     "tenants.b.target-allowlist matches 'a.in', the ingress topic of tenant 'a'"),
    (_tenants("    max-delay: 1m\n"), {"levels": "1s 2h"}, "tenants.a.max-delay (1m) is shorter than the last level"),
    (_tenants(""), {"ingress-topic": "x.in"}, "ingress-topic is set at the top level and 'tenants' is given"),
    (_tenants(""), {"history-topic": "a.in"}, "--history-topic 'a.in' must differ from tenant 'a'"),
])
def test_bad_tenants_are_refused_naming_the_tenant_and_the_key(
        tmp_path: Path, text: str, flags: dict[str, str] | None, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text, flags)
    assert needle in str(e.value)


def test_a_bad_tenant_exits_like_any_bad_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_tenants("    max-delivery-rate: -5\n"))
    assert main(["run", "--config", str(cfg), "--bootstrap-servers", "127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "tenants.a.max-delivery-rate: bad value: -5 is not a rate in records per second" in err


def test_quotas_are_a_tenants_own_with_no_limit_where_none_is_given(tmp_path: Path) -> None:
    a, b = _load(tmp_path, _tenants("    max-pending: 1000\n    max-disk-bytes: 10GiB\n    max-delivery-rate: 2.5\n"
                                    "  b:\n    ingress-topic: b.in\n"))
    assert (a.max_pending, a.max_disk_bytes, a.max_delivery_rate) == (1000, 10 << 30, 2.5)
    assert (b.max_pending, b.max_disk_bytes, b.max_delivery_rate) == (None, None, None)


def test_the_run_acls_name_every_tenants_topics(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TWO)
    s = load_settings({"delivery": "at-least-once"}, config_file=cfg, environ={})
    got = {(a.name, a.operation) for a in acls_for("run", s, create_topics=True)}
    for topic in ("payments.delay", "search.delay"):
        assert (topic, "Read") in got and (topic, "Create") in got
    assert {("payments.dlq", "Write"), ("shared.dlq", "Write"), ("payments.delay.changelog", "Write"),
            ("search.delay.cl", "Read")} <= got
    assert not any(name.startswith("delay.ingress") for name, _op in got)
