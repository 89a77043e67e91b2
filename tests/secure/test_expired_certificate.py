"""docs/operations.md, "When Kafka refuses the sidecar": an expired broker certificate, on a
real Kafka broker.

The broker (started here, once for this module: the session's secured broker has a valid
certificate) has a second SASL_SSL listener whose certificate, signed by the same CA for the same
names, ended yesterday (devkafka/secure.py, ``expired_listener``). Connected to it, ``status``
and ``send`` fail with one line naming ``tls-failed (expired)``; ``run`` does not exit (renewing
the broker's certificate heals it) but waits with ``/readyz`` 503 naming the expiry, and once the
listener's keystore is replaced on the running broker (a dynamic broker config, as an operator
renews a certificate) it becomes ready without a restart. A certificate that expires while the
sidecar runs is met at its clients' next connection (a broker restart here: a keystore change
keeps established connections): deliveries stop, ``/readyz`` names it, and they resume once the
certificate is renewed, without a restart of the sidecar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devkafka.local import LocalKafka
from devkafka.secure import SecureBroker, expire_listener_again, renew_expired_listener
from tests.conftest import start_or_unavailable
from tests.integration.refusals import Run, cli_fails, kafka_flags
from tests.secure.cluster import SecureCluster
from tests.secure.deliveries import Deliveries

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def expired_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    """A secured broker whose ``EXPIRED`` listener presents an expired certificate; the
    :class:`SecureCluster` administers it through its valid listener."""
    kafka = LocalKafka(data_dir=tmp_path_factory.mktemp("expired-kafka"), prefer_docker=False,
                       secure=SecureBroker(expired_listener=True))
    bootstrap, _ = start_or_unavailable(kafka, "the secured broker with an expired certificate")
    with SecureCluster.serving(kafka, bootstrap) as cluster:
        yield cluster


def _expired_conf(cluster: SecureCluster) -> dict[str, str]:
    """The super user's properties at the expired listener: only the certificate can refuse."""
    return {**cluster.admin_conf, "bootstrap.servers": cluster.secure.expired_bootstrap}


@pytest.mark.parametrize("argv", [["status", "some-id"], ["send", "--topic", "t", "--value", "v", "--delay", "1s"]])
def test_commands_name_an_expired_certificate(expired_kafka: SecureCluster, argv: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_fails(capsys, [*argv, *kafka_flags(_expired_conf(expired_kafka))], 1, "tls-failed")
    assert "(expired)" in line and "renew" in line, line


def test_expired_certificate_heals_once_renewed(tmp_path: Path, expired_kafka: SecureCluster) -> None:
    """run waits naming the expiry (one kafka.waiting event, no exit); the broker's certificate
    renewed while it waits, it becomes ready without a restart."""
    run = Run(tmp_path, kafka_flags(_expired_conf(expired_kafka)))
    renewed = False
    try:
        doc = run.wait_readyz(30, "tls-failed")
        assert doc["kafka"]["reason"] == "expired", doc
        assert "renew" in doc["kafka"]["setting"], doc
        assert [e["reason"] for e in run.events("kafka.waiting")][:1] == ["expired"]
        assert run.proc.poll() is None  # an expiry heals: no exit
        renew_expired_listener(expired_kafka.admin, expired_kafka.secure)
        renewed = True
        run.wait_readyz(60, None)
    finally:
        status = run.stop()
        if renewed:  # once it stopped: a client it opens meanwhile would meet the expired one
            expire_listener_again(expired_kafka.admin, expired_kafka.secure)
    assert status == 0 and not run.events("kafka.unusable")


def test_certificate_expired_while_running_heals_once_renewed(tmp_path: Path, expired_kafka: SecureCluster) -> None:
    """Delivering through the listener (renewed), its certificate expires: the expired keystore
    back and the broker restarted, the sidecar's clients reconnect and meet it. /readyz names
    tls-failed and a record sent meanwhile waits; renewed, it is delivered without a restart."""
    user = {**expired_kafka.new_user("expiring"), "bootstrap.servers": expired_kafka.secure.expired_bootstrap}
    renew_expired_listener(expired_kafka.admin, expired_kafka.secure)
    d = Deliveries(tmp_path, expired_kafka, user)
    try:
        d.run.wait_readyz(60, None)
        expire_listener_again(expired_kafka.admin, expired_kafka.secure)
        expired_kafka.kafka.restart(timeout=120)
        doc = d.run.wait_readyz(60, "tls-failed")
        assert doc["broker_reachable"] is False and doc["kafka"].get("reason") == "expired", doc
        d.send(b"meanwhile")
        renew_expired_listener(expired_kafka.admin, expired_kafka.secure)
        d.run.wait_readyz(60, None)
        refused = d.run.events("kafka.refused")
        assert "tls-failed" in [e["code"] for e in refused], refused
        assert d.first_delivered() == b"meanwhile"
    finally:
        status = d.run.stop()
        expire_listener_again(expired_kafka.admin, expired_kafka.secure)
    assert status == 0
