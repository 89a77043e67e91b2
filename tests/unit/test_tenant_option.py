"""``--tenant NAME`` of status, cancel and dlq (sidecar/tenant_option.py): the tenant's topics from
the configuration file, checked before anything connects, and the look-up narrowed to its topic;
cancel and dlq redrive produce with the tenant's ``kafka:`` over the command's own properties,
never printing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar import cli, tenant_option
from sidecar.cli import _common_inputs, build_parser, main
from sidecar.config import load_settings
from sidecar.engine.tenant_producers import TenantProducers
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


# ---- cancel and dlq redrive write as the tenant ---------------------------------------------

SECURED = """\
bootstrap-servers: 127.0.0.1:1
dlq-topic: shared.dlq
kafka:
  security.protocol: SASL_PLAINTEXT
  sasl.mechanism: PLAIN
  sasl.username: sidecar
  sasl.password: deployment-secret
tenants:
  payments:
    ingress-topic: payments.delay
    dlq-topic: payments.dlq
    kafka:
      sasl.username: payments
      sasl.password: {env: PAYMENTS_KAFKA_PASSWORD}
  search:
    ingress-topic: search.delay
"""
PAYMENTS_SECRET = "payments-secret-from-env"


@pytest.fixture
def secured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PAYMENTS_KAFKA_PASSWORD", PAYMENTS_SECRET)
    path = tmp_path / "secured.yaml"
    path.write_text(SECURED)
    return str(path)


def _producer_kafka(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the command's own properties, its producer's) for ``args``."""
    ns = build_parser().parse_args(args)
    _timeout, kafka = _common_inputs(ns)
    return kafka, tenant_option.producer_kafka(ns, kafka)


def test_cancel_writes_with_the_tenants_credentials_over_the_deployments(secured: str) -> None:
    own, producer = _producer_kafka(["cancel", "order-1", "--key", "k", "--tenant", "payments", "--config", secured,
                                     "--kafka", "client.id=ops"])
    assert own["sasl.username"] == "sidecar"  # the command's other clients: the deployment's principal
    assert producer == {**own, "sasl.username": "payments", "sasl.password": PAYMENTS_SECRET}
    # built as the sidecar builds the tenant's own producer: the same properties over the same base
    settings = load_settings({}, config_file=secured)
    made: list[dict[str, Any]] = []
    TenantProducers(settings).start(lambda conf: made.append(conf), lambda: dict(own), lambda key: False)
    (sidecar_conf,) = made
    assert {k: v for k, v in sidecar_conf.items() if k != "error_cb"} == producer


def test_a_tenant_without_kafka_overrides_writes_as_the_command(secured: str) -> None:
    own, producer = _producer_kafka(["cancel", "order-1", "--key", "k", "--tenant", "search", "--config", secured])
    assert producer == own and producer["sasl.username"] == "sidecar"
    own, producer = _producer_kafka(["cancel", "order-1", "--key", "k", "--config", secured])  # no --tenant
    assert producer == own


def test_redrive_produces_as_the_tenant_and_reads_as_the_command(
    secured: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the broker probe before the job (an unreachable address here) is not what this test is about
    monkeypatch.setattr(cli, "_require_kafka", lambda *a, **k: None)
    ns = build_parser().parse_args(["dlq", "redrive", "--reason", "too-large", "--to", "target", "--tenant",
                                    "payments", "--config", secured])
    job = cli._dlq_job(ns)
    assert job.dlq_topic == "payments.dlq"
    assert job.kafka["sasl.username"] == "sidecar"  # DLQ consumer and admin: the command's principal
    assert job.producer_kafka is not None
    assert job.producer_kafka["sasl.username"] == "payments"
    assert job.producer_kafka["sasl.password"] == PAYMENTS_SECRET
    assert {k: v for k, v in job.producer_kafka.items() if not k.startswith("sasl.")} == {
        k: v for k, v in job.kafka.items() if not k.startswith("sasl.")}


def test_a_failed_cancel_as_a_tenant_prints_no_secret(
    secured: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: list[dict[str, Any]] = []

    class Writer(cli._Writer):  # the real producer, its properties noted
        def __init__(self, ns: Any, timeout_ms: int, kafka: dict[str, str]) -> None:
            given.append(dict(kafka))
            super().__init__(ns, timeout_ms, kafka)

    monkeypatch.setattr(cli, "_Writer", Writer)
    for extra in ([], ["--json"]):
        code = main(["cancel", "order-1", "--key", "k", "--tenant", "payments", "--config", secured,
                     "--timeout", "1s", *extra])
        assert code != 0  # nothing listens at 127.0.0.1:1
        out, err = capsys.readouterr()
        assert err or out
        for secret in (PAYMENTS_SECRET, "deployment-secret"):
            assert secret not in out + err
    assert [(k["sasl.username"], k["sasl.password"]) for k in given] == [("payments", PAYMENTS_SECRET)] * 2
