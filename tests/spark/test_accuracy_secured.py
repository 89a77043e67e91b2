"""``delay-sidecar accuracy`` on the secured broker (SASL_SSL, SCRAM-SHA-512, ACLs enforced).

The crafted scenario of tests/spark/helpers.py is produced by the admin; the job then runs, on
the real local SparkSession, as a principal holding exactly what ``delay-sidecar acls --for
accuracy`` prints for it, with the Kafka Java client's properties Spark's connector needs: the
SCRAM login in ``sasl.jaas.config`` and the broker's CA in a JKS truststore (the Java client's
default type). Its figures are those of the plain-broker run (test_accuracy_batch.py). A JKS
truststore without the broker's CA fails before Spark starts, in one line naming the TLS cause.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.acls import Target, acls_for, render
from sidecar.config import load_settings
from spark.cli import accuracy_main
from tests.secure.cluster import SecureCluster
from tests.spark.helpers import produce_batch_scenario

pytestmark = [pytest.mark.spark, pytest.mark.integration]

STOREPASS = "truststore-pw"


def _jks(tmp_path: Path, ca_pem: Path, name: str) -> Path:
    store = tmp_path / f"{name}.jks"
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), "-keystore",
                    str(store), "-storetype", "JKS", "-storepass", STOREPASS], check=True, capture_output=True)
    return store


def _java_flags(user: dict[str, str], truststore: Path) -> list[str]:
    """Spark's Kafka options for a SCRAM user over TLS, as ``--kafka`` flags."""
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="{user["sasl.username"]}" password="{user["sasl.password"]}";')
    props = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas,
             "ssl.truststore.location": str(truststore), "ssl.truststore.password": STOREPASS}
    return [f for k, v in props.items() for f in ("--kafka", f"{k}={v}")]


def test_accuracy_under_its_printed_acls(spark: Any, secure_kafka: SecureCluster, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sc = produce_batch_scenario(secure_kafka.bootstrap, secure_kafka.admin_conf)
    user = secure_kafka.new_user("accuracy")
    printed = acls_for("accuracy", load_settings({"ingress-topic": sc.ingress}, environ={}), [Target(sc.target)])
    assert [(a.name, a.operation) for a in printed] == [(sc.ingress, "Read"), (sc.target, "Read")]
    assert render(printed, "kafka-acls", "User:x").count("--operation Read") == 2
    secure_kafka.grant(SecureCluster.principal(user), printed)
    truststore = _jks(tmp_path, secure_kafka.secure.ca_path, "broker-ca")
    argv = ["--bootstrap-servers", secure_kafka.bootstrap, "--ingress-topic", sc.ingress, "--targets", sc.pattern,
            "--since", str(sc.since), "--until", str(sc.until), "--out", str(tmp_path / "out"), "--json",
            "--no-chart", "--no-details", *_java_flags(user, truststore)]
    assert accuracy_main(argv) == 0
    totals = orjson.loads(capsys.readouterr().out)["totals"]
    assert {k: totals[k] for k in ("sent", "delivered", "lost", "pending", "duplicates", "early", "unmatched")} == {
        "sent": 9, "delivered": 7, "lost": 1, "pending": 1, "duplicates": 1, "early": 1, "unmatched": 1,
    }


def test_a_truststore_without_the_brokers_ca_fails_before_spark(secure_kafka: SecureCluster, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", "other.key", "-out", "other.pem", "-days", "1", "-subj", "/CN=another CA"],
                   cwd=tmp_path, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    truststore = _jks(tmp_path, tmp_path / "other.pem", "other-ca")
    user = secure_kafka.new_user("accuracy")
    argv = ["--bootstrap-servers", secure_kafka.bootstrap, "--targets", "x", "--out", str(tmp_path / "out"),
            *_java_flags(user, truststore)]
    assert accuracy_main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tls-failed (unknown-ca)" in err, err
