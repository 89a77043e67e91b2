"""Settings: precedence defaults < YAML < environment < flags; errors name the flag and value."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.config import OPTIONS, ConfigError, Settings, env_name, load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ingress-topic: from-yaml\ndlq-topic: dlq-yaml\nmax-retries: 3\nkafka:\n  linger.ms: 7\n")
    env = {"DELAY_SIDECAR_DLQ_TOPIC": "dlq-env", "DELAY_SIDECAR_MAX_RETRIES": "4",
           "DELAY_SIDECAR_KAFKA_SASL_PASSWORD": "hunter2", "KAFKA_BOOTSTRAP_SERVERS": "b:1"}
    s = load_settings({"max-retries": "5"}, config_file=cfg, environ=env)
    assert (s.ingress_topic, s.dlq_topic, s.max_retries, s.bootstrap_servers) == ("from-yaml", "dlq-env", 5, "b:1")
    assert s.kafka == {"linger.ms": "7", "sasl.password": "hunter2"}
    assert s.masked()["kafka"]["sasl.password"] == "***"


def test_durations_sizes_and_lists() -> None:
    s = load_settings({"max-delay": "30d", "segment-bytes": "16MiB", "levels": "1s 2s 1m",
                       "target-allowlist": "orders\\..*, billing"}, environ={})
    assert s.max_delay_ms == 30 * 86_400_000 and s.segment_bytes == 16 << 20
    assert s.levels_ms == (1000, 2000, 60_000) and s.target_allowlist == ("orders\\..*", "billing")


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        ({"scheduler": "fifo"}, {}, "--scheduler"),
        ({"max-delay": "soon"}, {}, "--max-delay"),
        ({"levels": "5s 1s"}, {}, "--levels"),
        ({"target-allowlist": "(unclosed"}, {}, "--target-allowlist"),
        ({}, {"DELAY_SIDECAR_HTTP_PORT": "99999"}, "DELAY_SIDECAR_HTTP_PORT"),
        ({"ingress-topic": "x", "dlq-topic": "x"}, {}, "--dlq-topic"),
    ],
)
def test_errors_name_the_setting_and_value(flags: dict[str, str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(flags, environ=env)
    assert needle in str(e.value)


def test_yaml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("no-such-option: 1\n")
    with pytest.raises(ConfigError, match="no-such-option"):
        load_settings(config_file=bad, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(config_file=tmp_path / "missing.yaml", environ={})


def test_cli_reports_bad_flag_and_exit_code() -> None:
    r = subprocess.run([sys.executable, "-m", "sidecar", "run", "--scheduler", "fifo"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "--scheduler" in r.stderr and "fifo" in r.stderr


def test_readme_documents_every_option_header_and_reason() -> None:
    readme = (ROOT / "README.md").read_text()
    for opt in OPTIONS:
        assert f"`{opt.name}`" in readme, opt.name
    for name in (c.TARGET_TOPIC, c.DELAY_MS, c.DELIVER_AT, c.LEVEL, c.TARGET_PARTITION, c.ID, c.CANCEL,
                 c.RETRY_COUNT, c.ENQUEUED_AT, c.SOURCE, c.DLQ_REASON, c.DLQ_ERROR, c.DLQ_SOURCE_TOPIC,
                 c.DLQ_SOURCE_PARTITION, c.DLQ_SOURCE_OFFSET, c.DLQ_ATTEMPTS, c.REDRIVE_ID, *c.REASONS):
        assert f"`{name}`" in readme, name


def test_readme_defaults_are_the_written_defaults() -> None:
    """The README's configuration table shows each default as OPTIONS writes it (``64MiB``, not
    67108864), the form ``run --help`` shows too; docs/operations.md's full table also gives each
    option's environment variable."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| `([^`]*)` \|", readme, re.M)
    shown = dict(rows)
    ops = (ROOT / "docs" / "operations.md").read_text()
    full = {name: (env, default) for name, env, default in
            re.findall(r"^\| `([a-z0-9-]+)` \| `([A-Z0-9_]+)` \| `([^`]*)` \|", ops, re.M)}
    for opt in OPTIONS:
        written = opt.default_text()
        for where, default in (("README", shown[opt.name]), ("docs/operations.md", full[opt.name][1])):
            assert default.strip("()") == written, f"{opt.name}: {where} {default!r}, OPTIONS {written!r}"
        assert full[opt.name][0] == env_name(opt.name), opt.name


def test_option_defaults_are_written_forms_of_the_settings_defaults() -> None:
    """OPTIONS holds each default as a person writes it; parsing it gives the Settings default."""
    defaults = Settings()
    for opt in OPTIONS:
        if opt.default is not None:
            assert opt.parse(opt.default) == getattr(defaults, opt.attr), opt.name
        if opt.metavar == "DURATION":
            assert isinstance(opt.default, str) and opt.default[-1].isalpha(), opt.name


@pytest.mark.parametrize(
    ("yaml_text", "env", "flags", "needles"),
    [
        ("commit-interval: 1000\n", {}, {}, ["commit-interval", "1000 has no unit"]),
        ("levels: [1000, 5000]\n", {}, {}, ["levels", "1000 has no unit"]),
        ("max-delay: 5 s\n", {}, {}, ["max-delay", "'5 s' has a space"]),
        ("wheel-window: -1h\n", {}, {}, ["wheel-window", "'-1h' is negative"]),
        ("", {"DELAY_SIDECAR_FSYNC_INTERVAL": "1000"}, {}, ["DELAY_SIDECAR_FSYNC_INTERVAL", "'1000' has no unit"]),
        ("", {"DELAY_SIDECAR_RETRY_LADDER": "10s 30 1m"}, {}, ["DELAY_SIDECAR_RETRY_LADDER", "'30' has no unit"]),
        ("", {"DELAY_SIDECAR_SHUTDOWN_TIMEOUT": "-30s"}, {}, ["DELAY_SIDECAR_SHUTDOWN_TIMEOUT", "'-30s' is negative"]),
        ("", {}, {"delivery-grace": "60"}, ["--delivery-grace", "'60' has no unit (write 60ms or 60s)"]),
        ("", {}, {"stats-interval": "1.5s"}, ["--stats-interval", "'1.5s' is not a whole number"]),
        ("", {}, {"segment-bytes": "64 MiB"}, ["--segment-bytes", "'64 MiB' has a space", "64MiB"]),
    ],
)
def test_durations_need_their_unit_in_every_source(
    tmp_path: Path, yaml_text: str, env: dict[str, str], flags: dict[str, str], needles: list[str]
) -> None:
    """The same rule and the same message for a flag, a YAML key and an environment variable."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text or "{}\n")
    with pytest.raises(ConfigError) as e:
        load_settings(flags, config_file=cfg, environ=env)
    for needle in needles:
        assert needle in str(e.value), str(e.value)
    if "bytes" not in needles[0]:
        assert "a duration is an integer directly followed by ms, s, m, h or d" in str(e.value)


def test_written_durations_load_from_every_source(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("commit-interval: 250ms\nlevels: [1s, 1m]\nmax-delay: 2d\n")
    s = load_settings({"delivery-grace": "90s"}, config_file=cfg, environ={"DELAY_SIDECAR_FSYNC_INTERVAL": " 2s "})
    assert (s.commit_interval_ms, s.levels_ms, s.max_delay_ms) == (250, (1000, 60_000), 2 * 86_400_000)
    assert (s.delivery_grace_ms, s.fsync_interval_ms) == (90_000, 2000)


def test_consistency_errors_show_written_values() -> None:
    with pytest.raises(ConfigError, match=r"--levels: the last level \(2h\) exceeds --max-delay \(1h\)"):
        load_settings({"max-delay": "1h"}, environ={})
    with pytest.raises(ConfigError, match=r"--segment-bytes \(1MiB\) must exceed --max-record-bytes \(1MiB\)"):
        load_settings({"segment-bytes": "1MiB", "max-record-bytes": "1MiB"}, environ={})


def test_the_native_producer_is_at_least_once_only() -> None:
    assert load_settings({}, environ={}).producer == "auto"
    assert load_settings({"producer": "native"}, environ={}).producer == "native"
    assert load_settings({}, environ={"DELAY_SIDECAR_PRODUCER": "Native"}).producer == "native"
    with pytest.raises(ConfigError, match="--producer native is at-least-once only"):
        load_settings({"producer": "native", "delivery": "exactly-once"}, environ={})
    with pytest.raises(ConfigError, match=r"producer.*auto, confluent, native"):
        load_settings({"producer": "rust"}, environ={})
