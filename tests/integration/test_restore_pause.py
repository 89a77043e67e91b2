"""A partition's pause while its store restores, lost by the client, on the real broker.

The assign callback does not pause a newly assigned partition while its store restores from the
changelog (a pause there races the fetch start the assignment issues from librdkafka's own
thread: confluentinc/librdkafka#5591), so its records can arrive with no store to take them. Here
the joining member's assign callback is replaced by one that also notes which partitions were
restoring, so every record of those that arrives during the restore is seen to take that path,
with real librdkafka: the loop pauses the partition, and once restored seeks it back to the first
of them. Nothing may be lost (before: those records were dropped for good).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer

from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.loop import Sidecar
from sidecar.engine.stores import tp_key
from tests.integration.harness import create_topics, producer

pytestmark = pytest.mark.integration

PARTITIONS = 4


def test_records_of_a_restoring_partition_that_arrive_anyway_are_consumed_again(
    kafka_bootstrap: str, tmp_path: Path,
) -> None:
    u = uuid.uuid4().hex[:8]
    ingress, target, group = f"rp-in-{u}", f"rp-out-{u}", f"rp-{u}"
    create_topics(kafka_bootstrap, [ingress], PARTITIONS)
    create_topics(kafka_bootstrap, [target], 1)

    def sidecar(name: str) -> Sidecar:
        s = Settings(bootstrap_servers=kafka_bootstrap, data_dir=str(tmp_path / name), ingress_topic=ingress,
                     group_id=group, group_instance_id=f"{group}-{name}", ingress_partitions=PARTITIONS,
                     dlq_topic=f"rp-dlq-{u}", commit_interval_ms=200, helper_threads="none",
                     kafka={"session.timeout.ms": "6000"})
        return Sidecar(s)

    def send(n: int, prefix: str, delay_ms: int) -> None:
        p = producer(kafka_bootstrap)
        for i in range(n):
            p.produce(ingress, b"v", f"{prefix}{i}".encode(), partition=i % PARTITIONS, headers=[
                (c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, str(delay_ms).encode()),
                (c.ID, f"{prefix}{i}".encode())])
        p.flush(30)

    a = sidecar("a")
    a.start()
    deadline = time.monotonic() + 60
    while len(a.stores) < PARTITIONS and time.monotonic() < deadline:
        a.turn()
    send(400, "old", 20_000)  # pending in a's stores: b restores its share from the changelog
    end = time.monotonic() + 2
    while time.monotonic() < end:
        a.turn()
    b = sidecar("b")
    unpaused: list[int] = []

    def assign_without_pause(consumer: Any, partitions: list[Any]) -> None:
        """``KafkaIO._assign`` with its pause lost: the stores opened, restores begun, the
        partitions assigned at the committed offsets, none paused."""
        b.kafka.events.partitions_assigned([tp_key(tp) for tp in partitions])
        for tp in partitions:
            tp.offset = OFFSET_INVALID
        unpaused.extend(tp.partition for tp in partitions if tp_key(tp) in b.handover.held())
        consumer.incremental_assign(partitions)

    b.kafka._assign = assign_without_pause  # type: ignore[method-assign]
    b.start()
    send(400, "new", 1_000)  # records that arrive while b's partitions restore
    deadline = time.monotonic() + 60
    while not (b.stores and len(a.stores) == PARTITIONS // 2) and time.monotonic() < deadline:
        a.turn()
        b.turn()
    assert unpaused, "b's assign callback paused nothing"
    # turn both until every record is on the target (the old ones fall due 20 s after they were sent)
    ids: set[bytes] = set()
    want = {f"{p}{i}".encode() for p in ("old", "new") for i in range(400)}
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"rp-read-{u}",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.subscribe([target])
    try:
        end = time.monotonic() + 45
        while not want <= ids and time.monotonic() < end:
            a.turn()
            b.turn()
            ids.update(dict(m.headers() or []).get(c.ID) for m in reader.consume(1000, 0) if m.error() is None)
    finally:
        reader.close()
    missing = want - ids
    assert not missing, f"{len(missing)} never delivered, e.g. {sorted(missing)[:3]}"
    for sc in (a, b):
        sc.shutdown()
