"""docs/operations.md, "When Kafka refuses the sidecar": the rows that need the secured broker.

Wrong password and wrong SASL mechanism (SCRAM-SHA-256 for a SCRAM-SHA-512 user) make ``run``
exit with status 3, an unknown CA and a host name the certificate does not hold (the broker
reached through 127.0.0.2, its certificate names localhost and 127.0.0.1) with status 4, each
after one ``kafka.unusable`` event; a missing ACL heals: ``run`` waits with ``/readyz`` 503
naming the cause, and with the ACLs granted it becomes ready without a restart. The other
commands fail with one line naming the same causes. An expired broker certificate needs a broker
of its own: tests/secure/test_expired_certificate.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.acls import acls_for
from sidecar.config import load_settings
from tests.integration.refusals import COMMANDS, Run, cli_fails, kafka_flags, refused_everywhere
from tests.secure.cluster import SecureCluster
from tests.secure.deliveries import Deliveries

pytestmark = pytest.mark.integration


@pytest.fixture
def user(secure_kafka: SecureCluster) -> dict[str, str]:
    return secure_kafka.new_user("refused")


def _forward(listen: socket.socket, to: tuple[str, int]) -> None:
    """A TCP forwarder: each connection to ``listen`` is piped to ``to``."""

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    while True:
        try:
            client, _ = listen.accept()
        except OSError:
            return
        upstream = socket.create_connection(to)
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()


@pytest.fixture
def other_address(secure_kafka: SecureCluster) -> Iterator[str]:
    """The secured broker at 127.0.0.2:<port>, an address its certificate does not name."""
    host, _, port = secure_kafka.bootstrap.rpartition(":")
    listen = socket.socket()
    listen.bind(("127.0.0.2", 0))
    listen.listen()
    threading.Thread(target=_forward, args=(listen, (host, int(port))), daemon=True).start()
    yield f"127.0.0.2:{listen.getsockname()[1]}"
    listen.close()


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL)


@pytest.fixture
def other_ca(tmp_path: Path) -> str:
    """A CA that signed nothing the broker presents."""
    _openssl(tmp_path, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "other.key", "-out", "other.pem", "-days", "1", "-subj", "/CN=another CA")
    return str(tmp_path / "other.pem")


def test_wrong_password(tmp_path: Path, user: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    conf = {**user, "sasl.password": "not-" + user["sasl.password"]}
    refused_everywhere(tmp_path, capsys, conf, 3, "auth-failed", "wrong-credentials", "sasl.username", COMMANDS)


def test_wrong_mechanism(tmp_path: Path, user: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    conf = {**user, "sasl.mechanisms": "SCRAM-SHA-256"}
    refused_everywhere(tmp_path, capsys, conf, 3, "auth-failed", "wrong-mechanism", "sasl.mechanism")


def test_unknown_ca(tmp_path: Path, user: dict[str, str], other_ca: str, capsys: pytest.CaptureFixture[str]) -> None:
    conf = {**user, "ssl.ca.location": other_ca}
    refused_everywhere(tmp_path, capsys, conf, 4, "tls-failed", "unknown-ca", "ssl.ca.location")


def test_host_name_mismatch(tmp_path: Path, user: dict[str, str], other_address: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    conf = {**user, "bootstrap.servers": other_address}
    refused_everywhere(tmp_path, capsys, conf, 4, "tls-failed", "hostname-mismatch", "bootstrap.servers")


def test_plaintext_to_a_tls_listener(tmp_path: Path, user: dict[str, str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    conf = {"bootstrap.servers": user["bootstrap.servers"]}
    refused_everywhere(tmp_path, capsys, conf, 4, "tls-failed", "tls-expected", "security.protocol")


def test_missing_acl_heals_once_granted(tmp_path: Path, secure_kafka: SecureCluster, user: dict[str, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """No ACL: run waits naming the first refused operation; granted the documented ACLs, it
    becomes ready without a restart."""
    name = tmp_path.name
    secure_kafka.create_topics([f"in-{name}", f"dlq-{name}"])
    run = Run(tmp_path, kafka_flags(user))
    try:
        doc = run.wait_readyz(20, "not-authorized")
        assert doc["kafka"]["operation"] == "Describe" and doc["kafka"]["resource"] == f"topic in-{name}"
        assert run.events("kafka.waiting")[0]["code"] == "not-authorized"
        settings = load_settings({"ingress-topic": f"in-{name}", "dlq-topic": f"dlq-{name}", "changelog": "off",
                                  "group-id": f"g-{name}"}, environ={})
        secure_kafka.grant(secure_kafka.principal(user), acls_for("run", settings))
        run.wait_readyz(60, None)
    finally:
        assert run.stop() == 0
    line = cli_fails(capsys, ["dlq", "list", "--dlq-topic", "nobody-may-read", *kafka_flags(user)], 1,
                     "not-authorized")
    assert "Read on topic nobody-may-read" in line


def test_acl_revoked_while_running(tmp_path: Path, secure_kafka: SecureCluster, user: dict[str, str]) -> None:
    """Read on the ingress topic revoked while the sidecar runs: /readyz names it and a record
    sent meanwhile waits in Kafka; once the ACL is back it is delivered, without a restart."""
    d = Deliveries(tmp_path, secure_kafka, user)
    read = [(a, b) for a, b in zip(d.acls, d.bindings, strict=True)
            if a.resource == "topic" and a.name == d.ingress and a.operation == "Read"]
    try:
        d.run.wait_readyz(60, None)
        secure_kafka.revoke(d.principal, [b for _, b in read])
        doc = d.run.wait_readyz(30, "not-authorized")
        assert doc["kafka"]["resource"] == f"topic {d.ingress}", doc
        d.send(b"meanwhile")
        secure_kafka.grant(d.principal, [a for a, _ in read])
        d.run.wait_readyz(60, None)
        assert len(d.run.events("kafka.refused")) == 1  # one warning, not one per error
        assert d.first_delivered() == b"meanwhile"
    finally:
        assert d.run.stop() == 0


def test_credentials_changed_while_running(tmp_path: Path, secure_kafka: SecureCluster,
                                           user: dict[str, str]) -> None:
    """The sidecar's password changed on the broker and the broker restarted (its connections log
    in again): /readyz names auth-failed, a record sent meanwhile waits; with the old password
    back the sidecar logs in again and delivers it, without a restart."""
    from devkafka.secure import add_user

    d = Deliveries(tmp_path, secure_kafka, user)
    try:
        d.run.wait_readyz(60, None)
        add_user(secure_kafka.admin, user["sasl.username"], "changed-" + user["sasl.password"])
        secure_kafka.kafka.restart(timeout=120)
        doc = d.run.wait_readyz(60, "auth-failed")
        assert doc["kafka"]["reason"] == "wrong-credentials" and doc["broker_reachable"] is False
        d.send(b"meanwhile")
        add_user(secure_kafka.admin, user["sasl.username"], user["sasl.password"])
        d.run.wait_readyz(60, None)
        codes = [e["code"] for e in d.run.events("kafka.refused")]
        # a handshake cut while the broker's listener stops for the restart may be named first
        assert "auth-failed" in codes and set(codes) <= {"auth-failed", "tls-failed", "broker-unreachable"}, codes
        assert d.first_delivered() == b"meanwhile"
    finally:
        assert d.run.stop() == 0
