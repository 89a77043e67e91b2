"""``devkafka.secure``: what the secured dev broker is made of, without starting it
(tests/secure/ starts it). Needs the ``openssl`` command, as the broker does."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from devkafka.secure import ADMIN, AUTHORIZER, SecureBroker, SecureBrokerError
from tests.infra import needs

pytestmark = needs(shutil.which("openssl") is not None, "the openssl command")


def test_certificates_users_and_properties(tmp_path: Path) -> None:
    sb = SecureBroker({"alice": None, "bob": "bob-pw"})
    sb.prepare(tmp_path)
    tls = tmp_path / "tls"
    assert {p.name for p in tls.iterdir()} >= {"ca.pem", "broker.pem", "broker.p12", "users.json"}
    assert stat.S_IMODE((tls / "users.json").stat().st_mode) == 0o600
    # the broker's certificate is the CA's and names the address clients connect to
    verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.pem", "broker.pem"], cwd=tls, capture_output=True,
                            text=True, check=False)
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(["openssl", "x509", "-in", "broker.pem", "-noout", "-text"], cwd=tls, capture_output=True,
                          text=True, check=True).stdout
    assert "DNS:localhost" in text and "IP Address:127.0.0.1" in text
    assert set(sb.passwords) == {ADMIN, "alice", "bob"} and sb.passwords["bob"] == "bob-pw"
    assert sb.format_args().count("--add-scram") == 3
    assert "SCRAM-SHA-512=[name=alice,password=" + sb.passwords["alice"] + "]" in sb.format_args()
    props = sb.broker_properties(9093, 9094)
    assert props["authorizer.class.name"] == AUTHORIZER and props["allow.everyone.if.no.acl.found"] == "false"
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094"
    assert sb.client_config("alice") == {
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice",
        "sasl.password": sb.passwords["alice"], "ssl.ca.location": str(tls / "ca.pem")}
    lines = sb.describe_users().splitlines()
    assert lines[0].startswith("user admin (super user): --kafka security.protocol=SASL_SSL")
    assert f"--kafka sasl.password={sb.passwords['alice']}" in lines[1]


def test_a_restart_keeps_the_passwords_and_the_ca(tmp_path: Path) -> None:
    first = SecureBroker({"alice": None})
    first.prepare(tmp_path)
    ca = (tmp_path / "tls" / "ca.pem").read_bytes()
    again = SecureBroker({"alice": None})
    again.prepare(tmp_path)
    assert again.passwords == first.passwords and again.keystore_password == first.keystore_password
    assert (tmp_path / "tls" / "ca.pem").read_bytes() == ca
    assert json.loads((tmp_path / "tls" / "users.json").read_text())["alice"] == first.passwords["alice"]


@pytest.mark.parametrize("name", ["a,b", "a=b", "", "x]y", "ü"])
def test_names_that_would_break_the_scram_syntax_are_refused(name: str) -> None:
    with pytest.raises(SecureBrokerError, match="letters, digits"):
        SecureBroker({name: None})
    with pytest.raises(SecureBrokerError, match="unknown user"):
        SecureBroker().client_config("nobody")
