"""Helpers for the Spark tests: create topics, produce crafted records (plainly, or in a committed
or aborted Kafka transaction), consume, free ports, and the batch job's crafted scenario
(:func:`produce_batch_scenario`), which the local run (tests/spark/test_accuracy_batch.py) and the
standalone-cluster run (tests/spark/test_accuracy_cluster.py) both measure.

The scenario (base = a whole minute ten minutes ago; range [base, base + 2m)):

=====  =========================================  ======================  ==============
id     ingress                                    delivered copies         lateness (ms)
=====  =========================================  ======================  ==============
a1     delay.ms=1000                              base+1005               5
a2     delay.deliver-at=base+2000                 base+2020               20
a3     delay.level=2 (5s)                         base+5100               100
a4     delay.level=2 (5s)                         base+5300               300
a5     delay.ms=1000                              base+993 (early)        -7
a6     delay.ms=3000                              base+3010, base+3050    10, 50 (duplicate)
a7     delay.ms=2000                              none                    lost
(def)  no delay.id, delay.ms=61000                base+62000              1000 (next minute)
p1     delay.deliver-at=until+60s                 none                    pending
c1     delay.ms=30000, then a cancel command      none                    not counted
a1     a second a1 (duplicate id)                 -                       not counted
bad    no delay.target-topic                      -                       not counted
oth    target outside the pattern                 -                       not counted
zz     -                                          base+4000 (no ingress)  unmatched
=====  =========================================  ======================  ==============

Lateness over the 8 delivered copies: -7 5 10 20 50 100 300 1000 -> p50 20, max 1000, min -7.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

MIN_MS = 60_000


@dataclass
class Rec:
    """One record to produce: timestamp (epoch ms), headers (name -> text), optional key/value."""

    ts: int
    headers: dict[str, str] = field(default_factory=dict)
    value: bytes = b"v"
    key: bytes | None = None


def create_topics(bootstrap: str, names: Sequence[str], partitions: int = 1,
                  conf: Mapping[str, str] | None = None) -> None:
    """``conf``: more client properties (a secured broker's)."""
    admin = AdminClient({**(conf or {}), "bootstrap.servers": bootstrap})
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


def produce(bootstrap: str, topic: str, records: Sequence[Rec], conf: Mapping[str, str] | None = None) -> list[int]:
    """Produce in order to partition 0; returns the offsets."""
    producer = Producer({**(conf or {}), "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
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


def produce_transaction(bootstrap: str, topic: str, records: Sequence[Rec], *, commit: bool) -> None:
    """Produce ``records`` to partition 0 in one Kafka transaction, then commit or abort it."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": f"t-{topic}-{uuid.uuid4().hex}", "linger.ms": 5,
    })
    producer.init_transactions(30)
    producer.begin_transaction()
    for r in records:
        producer.produce(topic, value=r.value, key=r.key, partition=0, timestamp=r.ts,
                         headers=[(k, v.encode()) for k, v in r.headers.items()])
    assert producer.flush(30) == 0
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


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


@dataclass(frozen=True)
class BatchScenario:
    """Where :func:`produce_batch_scenario` put the records (see the module docstring)."""

    ingress: str
    target: str
    other: str
    pattern: str
    base: int
    since: int
    until: int
    default_id: str


def produce_batch_scenario(bootstrap: str, conf: Mapping[str, str] | None = None) -> BatchScenario:
    """Create fresh topics and produce the scenario of the module docstring into them (``conf``:
    more client properties, a secured broker's admin)."""
    u = uuid.uuid4().hex[:8]
    ingress, target, other = f"acc.in.{u}", f"acc.out.{u}", f"acc.other.{u}"
    create_topics(bootstrap, [ingress, target, other], conf=conf)
    base = (int(time.time() * 1000) // MIN_MS) * MIN_MS - 10 * MIN_MS
    since, until = base, base + 2 * MIN_MS

    def ing(ts: int, **h: str) -> Rec:
        headers = {"delay.target-topic": target}
        headers.update({k.replace("_", "."): v for k, v in h.items()})
        return Rec(ts=ts, headers={k: v for k, v in headers.items() if v != ""})

    def dl(id_: str, ts: int, deliver_at: int) -> Rec:
        return Rec(ts=ts, headers={"delay.id": id_, "delay.deliver-at": str(deliver_at), "delay.source": "x"})

    ingress_records = [
        ing(base, delay_id="a1", delay_ms="1000"),
        ing(base, delay_id="a2", **{"delay_deliver-at": str(base + 2000)}),
        ing(base, delay_id="a3", delay_level="2"),
        ing(base, delay_id="a4", delay_level="2"),
        ing(base, delay_id="a5", delay_ms="1000"),
        ing(base, delay_id="a6", delay_ms="3000"),
        ing(base, delay_id="a7", delay_ms="2000"),
        ing(base, delay_ms="61000"),  # default id <topic>:0:<offset>
        ing(base, delay_id="p1", **{"delay_deliver-at": str(until + MIN_MS)}),
        ing(base, delay_id="c1", delay_ms="30000"),
        Rec(ts=base + 10, headers={"delay.cancel": "c1"}),
        ing(base + 20, delay_id="a1", delay_ms="1000"),  # duplicate id: dropped by the sidecar
        Rec(ts=base, headers={"delay.id": "bad", "delay.ms": "1000"}),  # no target -> DLQ
        Rec(ts=base, headers={"delay.id": "oth", "delay.ms": "1000", "delay.target-topic": other}),
        ing(until + 1000, delay_id="late-sent", delay_ms="0"),  # sent after the range
    ]
    offsets = produce(bootstrap, ingress, ingress_records, conf)
    default_id = f"{ingress}:0:{offsets[7]}"
    produce(bootstrap, target, [
        dl("a5", base + 993, base + 1000),
        dl("a1", base + 1005, base + 1000),
        dl("a2", base + 2020, base + 2000),
        dl("a6", base + 3010, base + 3000),
        dl("zz", base + 4000, base + 3900),
        dl("a6", base + 3050, base + 3000),
        dl("a3", base + 5100, base + 5000),
        dl("a4", base + 5300, base + 5000),
        dl(default_id, base + 62_000, base + 61_000),
        dl("late-sent", until + 1000, until + 1000),
    ], conf)
    produce(bootstrap, other, [dl("oth", base + 1000, base + 1000)], conf)
    return BatchScenario(ingress=ingress, target=target, other=other, pattern=rf"acc\.out\.{u}",
                         base=base, since=since, until=until, default_id=default_id)
