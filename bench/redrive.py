"""Scenario ``redrive``: ``delay-sidecar dlq redrive`` of N dead letters, twice.

Method:

1. *Fill*: a fresh DLQ topic (3 partitions) gets N dead letters (100 B values, reason
   ``delivery-failed``), each with the headers ``PartitionStore.dead_letter`` writes for a failed
   publish (a user header, ``delay.id``, ``delay.target-topic``, ``delay.deliver-at``,
   ``delay.enqueued-at`` and the ``delay.dlq.*`` headers, made by the sidecar's own
   ``dlq_headers``); the target topic exists with 3 partitions. Producing them directly takes a
   fraction of the time a sidecar takes to dead-letter them.
2. *Run 1*: ``python -m sidecar dlq redrive --reason delivery-failed --to target --json`` (the
   command as an operator runs it, in its own process). Its rate is the records it sent over its
   ``send_seconds`` (first dead letter read to last transaction committed; goal >= 50 000/s); the
   whole command's wall time and the records per CPU second it used (its process and threads:
   what the machine's load does not change) are reported beside it.
3. *Run 2*: the same command again: it must send nothing (goal == 0).
4. *Check*: the target topic is read with ``read_committed`` and every record's
   ``delay.redrive-id`` counted: ``duplicates`` (records beyond one per id) and ``lost`` (dead
   letters without a record) across the two runs, both with goal 0.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from typing import Any, cast

import orjson
from confluent_kafka import Consumer, TopicPartition

from bench.report import fig
from bench.workload import Bench, BenchError, log, producer, uid, value_of
from sidecar import contract as c
from sidecar.store.outcomes import dlq_headers

PARTITIONS = 3
GOAL_RATE = ">= 50000"


def counts_for(bench: Bench) -> int:
    return 100_000 if bench.full else 5_000


def fill(bootstrap: str, dlq: str, target: str, ingress: str, n: int) -> float:
    """N dead letters of failed publishes to ``target``; returns the seconds it took."""
    p = producer(bootstrap, **{"linger.ms": 20, "batch.size": 1_000_000})
    value = value_of(100)
    now = int(time.time() * 1000)
    t0 = time.monotonic()
    for i in range(n):
        original: list[tuple[str, bytes | None]] = [
            ("trace", b"t%d" % i), (c.ID, b"bench-%d" % i), (c.TARGET_TOPIC, target.encode()),
            (c.DELIVER_AT, b"%d" % (now - 60_000)), (c.ENQUEUED_AT, b"%d" % (now - 120_000))]
        headers = dlq_headers(original, c.DELIVERY_FAILED, "Broker: Unknown topic or partition", ingress,
                              i % PARTITIONS, i // PARTITIONS, 5)
        while True:
            try:
                p.produce(dlq, value, b"k%d" % i, i % PARTITIONS, headers=cast(Any, headers))
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise BenchError("the dead letters were not all acknowledged")
    return time.monotonic() - t0


def redrive_once(bootstrap: str, dlq: str, ingress: str, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sidecar", "dlq", "redrive", "--bootstrap-servers", bootstrap, "--dlq-topic", dlq,
           "--ingress-topic", ingress, "--reason", c.DELIVERY_FAILED, "--to", "target", "--json", "--timeout", "30s"]
    t0, cpu0 = time.monotonic(), _children_cpu_s()
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    wall, cpu = time.monotonic() - t0, _children_cpu_s() - cpu0
    if proc.returncode != 0:
        raise BenchError(f"dlq redrive exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}")
    out: dict[str, Any] = orjson.loads(proc.stdout.splitlines()[-1])
    out["command_wall_s"] = round(wall, 3)
    out["command_cpu_s"] = round(cpu, 3)  # user + system of the process and its librdkafka threads
    return out


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def count_ids(bootstrap: str, topic: str, timeout_s: float = 120) -> tuple[int, int]:
    """(records, distinct delay.redrive-id values) in ``topic``, read committed, to its end."""
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-rdr-{uid()}", "enable.auto.commit": False,
                     "enable.partition.eof": True, "isolation.level": "read_committed"})
    cons.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: set[bytes] = set()
    records = 0
    eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            for m in cons.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    eof.add(cast(int, m.partition()))
                    continue
                records += 1
                for name, value in cast(list[tuple[str, bytes | None]], m.headers() or []):
                    if name == c.REDRIVE_ID and value is not None:
                        seen.add(value)
    finally:
        cons.close()
    if len(eof) < PARTITIONS:
        raise BenchError(f"reading {topic}: no end within {timeout_s} s")
    return records, len(seen)


def run(bench: Bench) -> dict[str, Any]:
    n = counts_for(bench)
    dlq, target, ingress = f"bench.rdr.dlq.{uid()}", f"bench.rdr.out.{uid()}", f"bench.rdr.in.{uid()}"
    bench.topics(dlq, target, partitions=PARTITIONS)
    log(f"redrive: filling {dlq} with {n} dead letters ...")
    fill_s = fill(bench.bootstrap, dlq, target, ingress, n)
    timeout_s = 600 if bench.full else 180
    first = redrive_once(bench.bootstrap, dlq, ingress, timeout_s)
    second = redrive_once(bench.bootstrap, dlq, ingress, timeout_s)
    records, distinct = count_ids(bench.bootstrap, target)
    bench._topics.append(f"{dlq}.redrive")  # the marker topic the command created: deleted with the rest
    rate = first["records_per_s"]
    return {
        "method": __doc__,
        "settings": {"dead_letters": n, "partitions": PARTITIONS, "value_bytes": 100, "batch": 10_000},
        "results": {
            "records_per_s": fig(rate, "records/s", GOAL_RATE),
            "first_run_sent": fig(first["sent"], "records", f"== {n}"),
            "second_run_sent": fig(second["sent"], "records", "== 0"),
            "duplicates": fig(records - distinct, "records", "== 0"),
            "lost": fig(n - distinct, "records", "== 0"),
            "command_wall_s": fig(first["command_wall_s"], "s"),
            # the machine's load moves the rate; the CPU the command used per record does not
            "records_per_cpu_s": fig(round(n / first["command_cpu_s"]) if first["command_cpu_s"] else None,
                                     "records/CPU-s"),
        },
        "details": {"fill_s": round(fill_s, 3), "first_run": first, "second_run": second,
                    "target_records": records, "distinct_redrive_ids": distinct},
    }
