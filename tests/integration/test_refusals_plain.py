"""docs/operations.md, "When Kafka refuses the sidecar": the rows a plain broker can show.

An unreachable broker (a port nobody listens on) heals: ``run`` keeps retrying with ``/readyz``
503 ``broker-unreachable`` and stops cleanly on SIGTERM; the PLAINTEXT broker addressed with
SASL_SSL is a TLS failure ``run`` exits for (status 4); an unsupported SASL mechanism is a bad
setting (status 2). The other commands fail with one line naming the same cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.refusals import COMMANDS, Run, cli_fails, exits_with, free_port

pytestmark = pytest.mark.integration

SASL_SSL = ["--kafka", "security.protocol=SASL_SSL", "--kafka", "sasl.mechanism=SCRAM-SHA-512",
            "--kafka", "sasl.username=u", "--kafka", "sasl.password=p"]


def test_run_retries_an_unreachable_broker(tmp_path: Path) -> None:
    run = Run(tmp_path, ["--bootstrap-servers", f"127.0.0.1:{free_port()}"])
    try:
        doc = run.wait_readyz(20, "broker-unreachable")
        assert doc["kafka"]["setting"].startswith("bootstrap.servers") and "kafka_ok" in doc["not_ready"]
        assert run.events("kafka.waiting")[0]["code"] == "broker-unreachable"
    finally:
        rc = run.stop()
    assert rc == 0 and "Traceback" not in run.stderr()


def test_run_exits_for_tls_to_a_plaintext_listener(tmp_path: Path, kafka_bootstrap: str) -> None:
    ev = exits_with(tmp_path, ["--bootstrap-servers", kafka_bootstrap, *SASL_SSL], 4, "tls-failed", "not-tls")
    assert ev["setting"].startswith("security.protocol")


def test_run_exits_for_an_unknown_mechanism(tmp_path: Path, kafka_bootstrap: str) -> None:
    ev = exits_with(tmp_path, ["--bootstrap-servers", kafka_bootstrap, "--kafka", "security.protocol=SASL_SSL",
                               "--kafka", "sasl.mechanism=SCRAM-SHA-1024", "--kafka", "sasl.username=u",
                               "--kafka", "sasl.password=p"], 2, "bad-config")
    assert ev["setting"] == "sasl.mechanism"


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_commands_name_the_cause(capsys: pytest.CaptureFixture[str], argv: list[str], kafka_bootstrap: str) -> None:
    line = cli_fails(capsys, [*argv, "--bootstrap-servers", f"127.0.0.1:{free_port()}"], 1, "broker-unreachable")
    assert "bootstrap.servers" in line
    line = cli_fails(capsys, [*argv, "--bootstrap-servers", kafka_bootstrap, *SASL_SSL], 1, "tls-failed")
    assert "security.protocol" in line
    line = cli_fails(capsys, [*argv, "--bootstrap-servers", kafka_bootstrap, "--kafka",
                              "security.protocol=SASL_PLAINTEXT", "--kafka", "sasl.mechanism=NOPE"], 2, "bad-config")
    assert "sasl.mechanism" in line


def test_commands_read_the_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       kafka_bootstrap: str) -> None:
    """--config gives the commands the sidecar's kafka: properties and brokers."""
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(f"bootstrap-servers: {kafka_bootstrap}\nkafka:\n  security.protocol: SASL_SSL\n"
                   "  sasl.mechanism: SCRAM-SHA-512\n  sasl.username: u\n  sasl.password: p\n")
    cli_fails(capsys, ["status", "some-id", "--config", str(cfg)], 1, "tls-failed")
