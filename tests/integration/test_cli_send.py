"""``delay-sidecar send`` / ``cancel`` as a user runs them: a subprocess against the session's
real broker. Each prints one line per record, and what it prints is checked against the record
read back from Kafka at the printed partition and offset. Against a port with no broker they fail
within seconds with one line on stderr (no librdkafka log lines) and exit status 1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import datetime

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from tests.integration.harness import create_topics, free_port

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "sidecar"]


def run_cli(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def fields(line: str) -> dict[str, str]:
    """``sent id=x partition=2 ...`` -> {"id": "x", "partition": "2", ...}."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def record_at(bootstrap: str, topic: str, partition: int, offset: int) -> Message:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cli-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, offset)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                assert (m.partition(), m.offset()) == (partition, offset)
                return m
    finally:
        c.close()
    raise AssertionError(f"no record at {topic}[{partition}]@{offset}")


def headers_of(m: Message) -> dict[str, bytes]:
    return {k: v for k, v in (m.headers() or []) if isinstance(v, bytes)}


def iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000 + 0.5)


@pytest.fixture
def ingress(kafka_bootstrap: str, unique: str) -> str:
    topic = f"cli-in-{unique}"
    create_topics(kafka_bootstrap, [topic], partitions=3)
    return topic


def test_send_and_cancel_print_what_they_wrote(kafka_bootstrap: str, ingress: str, unique: str) -> None:
    common = ["--bootstrap-servers", kafka_bootstrap, "--ingress-topic", ingress]
    rid = f"order-{unique}"
    r, _ = run_cli("send", *common, "--topic", "orders.timeout", "--delay", "5s", "--key", rid, "--id", rid,
                   "--value", "v1", "--header", "h=1")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout.count("\n") == 1 and r.stdout.startswith("sent "), (r.stdout, r.stderr)
    out = fields(r.stdout)
    assert (out["id"], out["ingress"], out["target"]) == (rid, ingress, "orders.timeout")
    m = record_at(kafka_bootstrap, ingress, int(out["partition"]), int(out["offset"]))
    h = headers_of(m)
    assert (m.key(), m.value()) == (rid.encode(), b"v1")
    assert (h["delay.ms"], h["delay.id"], h["delay.target-topic"], h["h"]) == (b"5000", rid.encode(),
                                                                             b"orders.timeout", b"1")
    assert int(out["due_ms"]) == m.timestamp()[1] + 5000 == iso_ms(out["due"])

    r, _ = run_cli("cancel", rid, "--key", rid, *common)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("sent cancel "), r.stdout
    cancel = fields(r.stdout)
    assert cancel["id"] == rid and cancel["partition"] == out["partition"]  # same key, same partition
    m = record_at(kafka_bootstrap, ingress, int(cancel["partition"]), int(cancel["offset"]))
    assert headers_of(m)["delay.cancel"] == rid.encode() and m.value() is None


def test_send_json_at_and_level(kafka_bootstrap: str, ingress: str) -> None:
    common = ["--bootstrap-servers", kafka_bootstrap, "--ingress-topic", ingress, "--json", "--topic", "t"]
    r, _ = run_cli("send", *common, "--at", "2030-01-01T00:00:00.250+01:00", "--value", "x", "--key", "k")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)
    assert out["due_ms"] == 1_893_452_400_250 and out["due"] == "2029-12-31T23:00:00.250Z"
    assert out["id"] == f"{ingress}:{out['partition']}:{out['offset']}"  # the sidecar's default id
    m = record_at(kafka_bootstrap, ingress, out["partition"], out["offset"])
    assert headers_of(m)["delay.deliver-at"] == b"1893452400250" and "delay.id" not in headers_of(m)

    r, _ = run_cli("send", *common, "--level", "3", "--value", "y")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)
    m = record_at(kafka_bootstrap, ingress, out["partition"], out["offset"])
    assert headers_of(m)["delay.level"] == b"3" and out["level"] == 3
    assert out["due_ms"] == m.timestamp()[1] + 10_000  # level 3 of the default table is 10s


def test_send_to_a_missing_ingress_topic(kafka_bootstrap: str, unique: str) -> None:
    r, took = run_cli("send", "--bootstrap-servers", kafka_bootstrap, "--ingress-topic", f"nope-{unique}",
                      "--topic", "t", "--delay", "1s", "--value", "x")
    assert r.returncode == 1 and r.stdout == "" and took < 10
    assert r.stderr.count("\n") == 1 and f"the ingress topic 'nope-{unique}' does not exist" in r.stderr, r.stderr


@pytest.mark.parametrize("command", [["send", "--topic", "t", "--delay", "5s", "--value", "x"],
                                     ["cancel", "some-id", "--key", "k"]])
def test_unreachable_broker_fails_fast_with_one_line(command: list[str]) -> None:
    port = free_port()  # nothing listens there once the probe socket is closed
    r, took = run_cli(*command, "--bootstrap-servers", f"127.0.0.1:{port}")
    assert r.returncode == 1 and r.stdout == ""
    assert took < 10, took
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr  # librdkafka's own FAIL lines do not reach the terminal
    assert lines[0].startswith(f"delay-sidecar {command[0]}: error: no answer from Kafka at 127.0.0.1:{port} "
                               "within 5s (--timeout)"), lines[0]
    assert "Connection refused" in lines[0]


def test_reschedule_lands_in_the_message_partition_with_replace(kafka_bootstrap: str, ingress: str,
                                                                 unique: str) -> None:
    common = ["--bootstrap-servers", kafka_bootstrap, "--ingress-topic", ingress]
    rid = f"order-{unique}"
    r, _ = run_cli("send", *common, "--topic", "orders.timeout", "--delay", "5m", "--key", rid, "--id", rid,
                   "--value", "v1")
    assert r.returncode == 0, r.stderr
    first = fields(r.stdout)
    r, _ = run_cli("reschedule", rid, *common, "--topic", "orders.timeout", "--at", "2030-01-01T00:00:00Z",
                   "--key", rid, "--value", "v2")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("sent reschedule "), r.stdout
    out = fields(r.stdout)
    assert out["id"] == rid and out["partition"] == first["partition"]  # same key, same partition
    assert int(out["offset"]) > int(first["offset"])
    assert out["due"] == "2030-01-01T00:00:00.000Z"
    m = record_at(kafka_bootstrap, ingress, int(out["partition"]), int(out["offset"]))
    h = headers_of(m)
    assert (m.key(), m.value()) == (rid.encode(), b"v2")
    assert (h["delay.id"], h["delay.replace"], h["delay.deliver-at"]) == (rid.encode(), b"true", b"1893456000000")
