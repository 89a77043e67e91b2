"""spark/kafka_check.py and the check ``delay-sidecar accuracy`` runs before Spark starts: Java
client properties translated for librdkafka, and one line (no Java stack trace) when Kafka
refuses them."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from spark.cli import accuracy_main
from spark.kafka_check import librdkafka_conf
from tests.infra import needs


def test_java_properties_translated() -> None:
    conf = librdkafka_conf("b:9093", {
        "kafka.security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="svc" password="p\\"w";',
        "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "PEM",
        "ssl.endpoint.identification.algorithm": "", "isolation.level": "read_committed",
    })
    assert conf == {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "svc", "sasl.password": 'p"w', "ssl.ca.location": "/ca.pem",
                    "ssl.endpoint.identification.algorithm": "none"}
    jks = librdkafka_conf("b:9093", {"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"})
    assert jks["enable.ssl.certificate.verification"] == "false" and "ssl.ca.location" not in jks


def test_accuracy_names_the_cause_before_spark_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = accuracy_main(["--targets", "t", "--bootstrap-servers", f"127.0.0.1:{port}", "--timeout", "1s"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "broker-unreachable" in err[0] and "bootstrap.servers" in err[0]
    rc = accuracy_main(["--targets", "t", "--bootstrap-servers", f"127.0.0.1:{port}",
                        "--kafka", "security.protocol=SASL_SSL", "--kafka", "sasl.mechanism=NOPE"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad-config" in err[0] and "sasl.mechanism" in err[0]


@needs(shutil.which("keytool") is not None and shutil.which("openssl") is not None, "keytool and openssl")
@pytest.mark.parametrize("password", ["secret1", None], ids=["with-password", "unverified"])
def test_a_jks_truststore_is_read_with_keytool(tmp_path: Path, password: str | None) -> None:
    """The probe trusts what the JKS store holds (listed by keytool, with or without its password);
    a store keytool cannot read turns the probe's verification off, Spark will say why."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test CA"],
                   cwd=tmp_path, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", "-keystore", "t.jks",
                    "-storetype", "JKS", "-storepass", "secret1"], cwd=tmp_path, check=True, capture_output=True)
    java = {"security.protocol": "SSL", "ssl.truststore.location": str(tmp_path / "t.jks"),
            **({"ssl.truststore.password": password} if password else {})}
    conf = librdkafka_conf("b:9093", java, tmp_path)
    assert "enable.ssl.certificate.verification" not in conf
    assert Path(conf["ssl.ca.location"]).read_text().split() == (tmp_path / "ca.pem").read_text().split()
    wrong = librdkafka_conf("b:9093", {**java, "ssl.truststore.password": "wrong-pw"}, tmp_path)
    assert wrong.get("enable.ssl.certificate.verification") == "false" and "ssl.ca.location" not in wrong
