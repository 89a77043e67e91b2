"""KDS_BENCH_PASSTHROUGH: the bench's passthrough replaced by another command (the C one)."""

from __future__ import annotations

import pytest

from bench.workload import DELIVERY_PRODUCER, INGRESS_CONSUMER, PASSTHROUGH_ENV, passthrough_cmd, rdkafka_value

ARGS = ["--bootstrap", "b:9092", "--source", "in", "--target", "out", "--count", "5", "--group", "g"]


def test_unset_means_the_python_passthrough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSTHROUGH_ENV, raising=False)
    assert passthrough_cmd(ARGS) is None
    monkeypatch.setenv(PASSTHROUGH_ENV, "")
    assert passthrough_cmd(ARGS) is None


def test_the_command_gets_the_args_and_every_client_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSTHROUGH_ENV, "/opt/native-forward -a 4")
    cmd = passthrough_cmd(ARGS)
    assert cmd is not None
    assert cmd[:3 + len(ARGS)] == ["/opt/native-forward", "-a", "4", *ARGS]
    rest = cmd[3 + len(ARGS):]
    pairs = list(zip(rest[::2], rest[1::2], strict=True))
    assert pairs[:len(DELIVERY_PRODUCER)] == [("-P", f"{k}={v}") for k, v in (
        (k, str(v).lower() if isinstance(v, bool) else v) for k, v in DELIVERY_PRODUCER.items())]
    consumer = dict(p[1].split("=", 1) for p in pairs[len(DELIVERY_PRODUCER):])
    assert {f for f, _ in pairs[len(DELIVERY_PRODUCER):]} == {"-C"}
    assert consumer.keys() == INGRESS_CONSUMER.keys()
    # librdkafka takes booleans as true / false, not Python's True / False
    assert ("-P", "enable.idempotence=true") in pairs and consumer["enable.auto.commit"] == "false"


def test_rdkafka_value_spells_booleans_as_librdkafka_does_and_nothing_else() -> None:
    assert [rdkafka_value(v) for v in (True, False, 1, 0, 5.5, "lz4", "True")] == [
        "true", "false", "1", "0", "5.5", "lz4", "True"
    ]
