"""Small Kafka helpers for the Spark tests: create topics, produce crafted records, consume."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass
class Rec:
    """One record to produce: timestamp (epoch ms), headers (name -> text), optional key/value."""

    ts: int
    headers: dict[str, str] = field(default_factory=dict)
    value: bytes = b"v"
    key: bytes | None = None


def create_topics(bootstrap: str, names: Sequence[str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names])
    for f in futures.values():
        f.result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10)
        if all(n in md.topics and not md.topics[n].error for n in names):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topics not visible: {names}")


def produce(bootstrap: str, topic: str, records: Sequence[Rec]) -> list[int]:
    """Produce in order to partition 0; returns the offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    offsets: list[int] = [-1] * len(records)
    errors: list[Any] = []

    def report(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets[i] = msg.offset()

        return cb

    for i, r in enumerate(records):
        producer.produce(
            topic, value=r.value, key=r.key, partition=0, timestamp=r.ts,
            headers=[(k, v.encode()) for k, v in r.headers.items()], on_delivery=report(i),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    return offsets


def consume_all(bootstrap: str, topic: str, *, min_count: int = 1, timeout: float = 30.0) -> list[Any]:
    """Every record of ``topic`` from the beginning, waiting for at least ``min_count``."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"t-{topic}-{time.time_ns()}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msgs = consumer.consume(num_messages=500, timeout=1.0)
            out.extend(m for m in msgs if m.error() is None)
            if len(out) >= min_count and not msgs:
                break
    finally:
        consumer.close()
    return out
