"""librdkafka's log through structlog (``sidecar.kafka_logs``), with a real librdkafka client."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from structlog.testing import capture_logs

from sidecar.kafka_logs import EVENT, KafkaLog, expected_error, is_transport


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_events(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == EVENT]


def test_levels_are_mapped_and_fields_kept() -> None:
    with capture_logs() as logs:
        klog = KafkaLog()
        for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG):
            klog.log(level, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", f"line at {level}")
    got = [(e["log_level"], e["facility"], e["client"], e["message"]) for e in kafka_events(logs)]
    assert got == [
        ("error", "CONFWARN", "rdkafka#producer-1", "line at 50"),
        ("error", "CONFWARN", "rdkafka#producer-1", "line at 40"),
        ("warning", "CONFWARN", "rdkafka#producer-1", "line at 30"),
        ("info", "CONFWARN", "rdkafka#producer-1", "line at 20"),
        ("debug", "CONFWARN", "rdkafka#producer-1", "line at 10"),
    ]


def test_disconnects_are_debug_only_while_stopping_or_closing() -> None:
    line = ("FAIL", "rdkafka#consumer-2", "127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: "
            "Connection refused (after 0ms in state CONNECT)")
    with capture_logs() as logs:
        klog = KafkaLog()
        klog.log(logging.ERROR, "%s [%s] %s", *line)  # running: a broker refuses connections
        with klog.closing():
            klog.log(logging.ERROR, "%s [%s] %s", *line)
            klog.log(logging.WARNING, "%s [%s] %s", "MAXPOLL", "rdkafka#consumer-2", "max.poll.interval.ms exceeded")
        klog.log(logging.ERROR, "%s [%s] %s", *line)  # closed: running again
        klog.stop()
        klog.log(logging.ERROR, "%s [%s] %s", "REQTMOUT", "rdkafka#producer-1", "Disconnected while requesting")
        klog.log(logging.ERROR, "%s [%s] %s", "OFFSET", "rdkafka#consumer-2", "Failed to commit: Unknown member")
    got = [(e["log_level"], e["facility"], e.get("demoted_from")) for e in kafka_events(logs)]
    assert got == [
        ("error", "FAIL", None),
        ("debug", "FAIL", "error"),
        ("warning", "MAXPOLL", None),  # only transport failures are expected while closing
        ("error", "FAIL", None),
        ("debug", "REQTMOUT", "error"),  # "Disconnected" in the text
        ("error", "OFFSET", None),
    ]


def test_a_property_meant_for_the_other_client_kind_is_no_warning() -> None:
    """``--kafka`` properties go to every client: the producer ignoring a consumer property is by design."""
    with capture_logs() as logs:
        KafkaLog().log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1",
                       "[thrd:app]: Configuration property session.timeout.ms is a consumer property and will be "
                       "ignored by this producer instance")
        KafkaLog().log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1",
                       "[thrd:app]: Configuration property fetch.wait.max.ms is deprecated")
    assert [(e["log_level"], e.get("demoted_from")) for e in kafka_events(logs)] == [
        ("debug", "warning"), ("warning", None)]


def test_a_warning_librdkafka_retries_on_its_own_is_info() -> None:
    with capture_logs() as logs:
        KafkaLog().log(logging.WARNING, "%s [%s] %s", "GETPID", "rdkafka#producer-3",
                       "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:39991/1: Broker: "
                       "Coordinator load in progress: retrying")
        KafkaLog().log(logging.ERROR, "%s [%s] %s", "GETPID", "rdkafka#producer-3", "Fatal: not retrying")
    assert [(e["log_level"], e.get("demoted_from")) for e in kafka_events(logs)] == [
        ("info", "warning"), ("error", None)]


def test_transport_lines() -> None:
    assert is_transport("FAIL", "anything")
    assert is_transport("REQTMOUT", "GroupCoordinator: Disconnected (after 3ms in state UP)")
    assert is_transport("ERROR", "1/1 brokers are down: All broker connections are down")
    assert not is_transport("CONFWARN", "Configuration property x is a consumer property and will be ignored")


def test_expected_errors_follow_the_same_rule() -> None:
    klog = KafkaLog()
    assert not expected_error(klog, "_TRANSPORT")
    assert not expected_error(None, "_TRANSPORT")
    with klog.closing():
        assert expected_error(klog, "_TRANSPORT") and expected_error(klog, "_ALL_BROKERS_DOWN")
        assert not expected_error(klog, "_FATAL")
    klog.stop()
    assert expected_error(klog, "_ALL_BROKERS_DOWN")


def test_a_real_client_logs_through_it_not_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    """librdkafka without a logger prints ``%3|...|FAIL|...`` to stderr from its own threads; with
    one, every line arrives as a ``kafka.log`` event when the client is polled."""
    port = closed_port()
    with capture_logs() as logs:
        klog = KafkaLog()
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "logger": klog, "reconnect.backoff.ms": 50,
                      "reconnect.backoff.max.ms": 100})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e["log_level"] == "error" for e in kafka_events(logs)):
            p.poll(0.1)
        running = list(kafka_events(logs))
        klog.stop()
        logs.clear()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not kafka_events(logs):
            p.poll(0.1)
        stopping = list(kafka_events(logs))
        p.close()
    refused = [e for e in running if "Connection refused" in e["message"]]
    assert refused and refused[0]["log_level"] == "error" and refused[0]["facility"] == "FAIL"
    assert refused[0]["client"].startswith("rdkafka#producer")
    assert stopping and {e["log_level"] for e in stopping} == {"debug"}
    assert {e["demoted_from"] for e in stopping} == {"error"}
    err = capfd.readouterr().err
    assert "|FAIL|" not in err and "Connection refused" not in err
