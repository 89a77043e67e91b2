"""spark/kafka_check.py and the check ``delay-sidecar accuracy`` runs before Spark starts: Java
client properties translated for librdkafka, and one line (no Java stack trace) when Kafka
refuses them."""

from __future__ import annotations

import socket

import pytest

from spark.cli import accuracy_main
from spark.kafka_check import librdkafka_conf


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
