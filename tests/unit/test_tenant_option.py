"""``--tenant NAME`` of status, cancel and dlq (sidecar/tenant_option.py): the tenant's topics from
the configuration file, checked before anything connects, and the look-up narrowed to its topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import _common_inputs, build_parser, main
from sidecar.health import HealthServer
from sidecar.metrics import Metrics
from sidecar.status import Member, find

CONFIG = """\
bootstrap-servers: 127.0.0.1:1
dlq-topic: shared.dlq
tenants:
  payments:
    ingress-topic: payments.delay
    dlq-topic: payments.dlq
  search:
    ingress-topic: search.delay
"""


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "sidecar.yaml"
    path.write_text(CONFIG)
    return str(path)


@pytest.mark.parametrize("command", [
    ["status", "order-1"], ["cancel", "order-1", "--key", "k"], ["dlq", "list"],
    ["dlq", "redrive", "--reason", "too-large", "--to", "target"],
])
def test_an_unknown_tenant_names_the_accepted_ones(
    capsys: pytest.CaptureFixture[str], config: str, command: list[str],
) -> None:
    assert main([*command, "--tenant", "billing", "--config", config]) == 2
    err = capsys.readouterr().err
    assert "--tenant 'billing': no such tenant (the configuration has 'payments', 'search')" in err, err
    assert err.count("\n") == 1


def test_a_tenant_needs_the_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--tenant", "payments", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    assert "--tenant 'payments' needs --config FILE" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "ingress", "dlq"), [
    (["dlq", "list", "--tenant", "payments"], "payments.delay", "payments.dlq"),
    (["dlq", "redrive", "--reason", "too-large", "--to", "ingress", "--tenant", "search"], "search.delay",
     "shared.dlq"),  # search has no DLQ of its own: the top-level one
    (["status", "order-1", "--tenant", "search", "--ingress-topic", "other"], "search.delay", None),
    (["cancel", "order-1", "--key", "k", "--tenant", "payments"], "payments.delay", None),
])
def test_a_tenant_names_its_topics(config: str, command: list[str], ingress: str, dlq: str | None) -> None:
    ns = build_parser().parse_args([*command, "--config", config])
    _common_inputs(ns)
    assert ns.ingress_topic == ingress
    assert getattr(ns, "dlq_topic", None) == dlq


def test_without_tenant_the_flags_stay(config: str) -> None:
    ns = build_parser().parse_args(["dlq", "list", "--dlq-topic", "x.dlq", "--config", config])
    _common_inputs(ns)
    assert ns.dlq_topic == "x.dlq" and ns.ingress_topic == "delay.ingress"


def test_status_asks_about_the_tenants_topic_only() -> None:
    asked: list[tuple[bytes, int | None, str | None]] = []

    def lookup(rid: bytes, partition: int | None, topic: str | None) -> tuple[int, dict[str, Any]]:
        asked.append((rid, partition, topic))
        return 200, {"state": "pending"}

    server = HealthServer("127.0.0.1", 0, Metrics())
    server.lookup = lookup
    server.start()
    try:
        owner = Member("m1", "delay-sidecar", "/127.0.0.1", f"127.0.0.1:{server.port}", {1})
        assert find([owner], b"a/b", 1, "g", 5, "team a.in")["state"] == "pending"
        assert find([owner], b"x", None, "g", 5)["state"] == "pending"
    finally:
        server.stop()
    assert asked == [(b"a/b", 1, "team a.in"), (b"x", None, None)]
