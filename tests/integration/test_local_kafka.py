"""The session broker is a real Kafka: records round-trip, and survive a broker stop/start.

These are the canaries for every other integration test: if they fail, look at the broker log
printed in the session header (``<pytest basetemp>/kafka0/broker.log``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.cli import broker_exit
from devkafka.local import LocalKafka

pytestmark = pytest.mark.integration


def _create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(timeout=60)


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value in records:
        producer.produce(topic, value=value, key=key, headers=[("h", key)], on_delivery=on_delivery)
    assert producer.flush(60) == 0, "records still in flight after 60s"
    assert errors == []


def _consume_all(bootstrap: str, topic: str, expected: int, group: str) -> list[tuple[bytes, bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    out: list[tuple[bytes, bytes, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            headers = dict(msg.headers() or [])
            out.append((msg.key(), msg.value(), headers["h"]))
    finally:
        consumer.close()
    return out


def test_produce_consume_round_trip(kafka_bootstrap: str, unique: str) -> None:
    topic = f"roundtrip-{unique}"
    _create_topic(kafka_bootstrap, topic)
    records = [(f"k{i}".encode(), f"value-{i}".encode()) for i in range(20)]
    _produce(kafka_bootstrap, topic, records)

    got = _consume_all(kafka_bootstrap, topic, len(records), group=f"g-{unique}")

    assert [(k, v) for k, v, _ in got] == records
    assert all(h == k for k, _, h in got)


def test_missing_topic_is_not_auto_created(kafka_bootstrap: str, unique: str) -> None:
    topic = f"missing-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.timeout.ms": 3000})
    producer.produce(topic, b"x")
    producer.flush(10)
    md = admin.list_topics(timeout=10)
    assert topic not in md.topics or md.topics[topic].error is not None


@pytest.mark.kafka_outage
def test_records_survive_broker_stop_start(local_kafka: LocalKafka | None, kafka_bootstrap: str, unique: str) -> None:
    assert local_kafka is not None
    topic = f"durable-{unique}"
    _create_topic(kafka_bootstrap, topic, partitions=2)
    before = [(f"k{i}".encode(), f"before-{i}".encode()) for i in range(10)]
    _produce(kafka_bootstrap, topic, before)
    port, pid = local_kafka.port, local_kafka.pid

    local_kafka.stop()
    assert not local_kafka.running
    assert local_kafka.pid is None
    t0 = time.monotonic()
    bootstrap = local_kafka.start(timeout=240)
    print(f"broker restart took {time.monotonic() - t0:.1f}s")

    assert bootstrap == kafka_bootstrap
    assert local_kafka.port == port
    assert local_kafka.pid not in (None, pid)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=30)
    assert len(md.topics[topic].partitions) == 2

    after = [(b"k-after", b"after-0")]
    _produce(bootstrap, topic, after)
    got = _consume_all(bootstrap, topic, len(before) + 1, group=f"g-{unique}")
    assert sorted((k, v) for k, v, _ in got) == sorted(before + after)


@pytest.mark.kafka_outage
def test_committed_offsets_survive_kill(local_kafka: LocalKafka | None, kafka_bootstrap: str, unique: str) -> None:
    """A SIGKILL (crash, no clean shutdown): the broker recovers its log and the group offsets."""
    assert local_kafka is not None
    topic = f"crash-{unique}"
    group = f"g-{unique}"
    _create_topic(kafka_bootstrap, topic)
    _produce(kafka_bootstrap, topic, [(b"a", b"1"), (b"b", b"2")])
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()

    local_kafka.kill()
    assert not local_kafka.running
    local_kafka.start(timeout=240)

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        # Right after a crash restart the group coordinator may still be loading the offsets
        # partition (NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS): retriable, so retry.
        deadline = time.monotonic() + 90
        while True:
            try:
                committed = consumer.committed([TopicPartition(topic, 0)], timeout=30)
                break
            except KafkaException as e:
                if (not e.args[0].retriable() and e.args[0].code() not in (
                    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE,
                )) or time.monotonic() > deadline:
                    raise
                time.sleep(1)
    finally:
        consumer.close()
    assert committed[0].offset == 1
    low, high = _watermarks(kafka_bootstrap, topic)
    assert (low, high) == (0, 2)


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    return int(low), int(high)


def test_exited_reports_a_broker_that_ended_by_itself(tmp_path: Path) -> None:
    """``exited`` names a JVM that died on its own (what the bench's watch fails a run on), never
    one stopped, killed or restarted through the object."""
    broker = LocalKafka(port=0, data_dir=tmp_path / "kafka", prefer_docker=False)
    try:
        broker.start(timeout=120)
        assert broker.exited is None
        broker.kill()  # through the object: a deliberate crash, not a death to report
        assert broker.exited is None
        broker.start(timeout=120)
        pid = broker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # from outside, as a failed log directory or the OOM killer ends it
        deadline = time.monotonic() + 30
        while broker.exited is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.exited == -signal.SIGKILL
        why = broker_exit(broker)
        assert why is not None and f"exited with status {-signal.SIGKILL}" in why and str(broker.log_path) in why
    finally:
        broker.close()
    assert broker.exited is None
