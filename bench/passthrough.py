"""The physical limit baseline: a plain confluent-kafka consume -> produce passthrough.

Run as ``python -m bench.passthrough --bootstrap B --source T --target T2 --count N``.
It uses the sidecar's own client settings (``workload.INGRESS_CONSUMER`` and
``workload.DELIVERY_PRODUCER``: idempotent, ``acks=all``, ``linger.ms=2``, batches of 5 000 consumed
records, at most 20 000 unacknowledged), a delivery callback per record and an async offset
commit every 200 ms, i.e. everything an at-least-once forwarder written in Python on this
client needs, and nothing else: no validation, no store, no scheduling. It copies key, value and
headers unchanged and exits once ``count`` records are acknowledged, printing JSON event lines
(``ready``, ``done``).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.workload import CONSUME_BATCH, DELIVERY_PRODUCER, INGRESS_CONSUMER, MAX_IN_FLIGHT


def emit(event: str, **kw: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps({"event": event, "ts_ms": time.time_ns() // 1_000_000, **kw}) + b"\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.passthrough")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--timeout", type=float, default=600)
    ns = ap.parse_args(argv)

    prod = Producer({"bootstrap.servers": ns.bootstrap, **DELIVERY_PRODUCER})
    cons = Consumer({"bootstrap.servers": ns.bootstrap, "group.id": ns.group, **INGRESS_CONSUMER})
    state = {"in_flight": 0, "acked": 0, "failed": 0, "consume_errors": 0}
    errors: dict[str, int] = {}

    def on_delivery(err: Any, _msg: Any) -> None:
        state["in_flight"] -= 1
        if err is None:
            state["acked"] += 1
        else:
            state["failed"] += 1
            errors[str(err)] = errors.get(str(err), 0) + 1

    def on_assign(c: Consumer, parts: list[TopicPartition]) -> None:
        c.incremental_assign(parts)
        emit("ready", partitions=[p.partition for p in parts])

    def on_lost(c: Consumer, parts: list[TopicPartition]) -> None:
        emit("lost", partitions=[p.partition for p in parts])
        c.incremental_unassign(parts)

    cons.subscribe([ns.source], on_assign=on_assign, on_lost=on_lost)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru0.ru_utime + ru0.ru_stime
    consumed = 0
    first_ms = 0
    positions: dict[int, int] = {}
    last_commit = last_progress = time.monotonic()
    deadline = time.monotonic() + ns.timeout
    backlog: list[Message] = []
    pos = 0
    while state["acked"] + state["failed"] < ns.count and time.monotonic() < deadline:
        if pos >= len(backlog) and consumed < ns.count and state["in_flight"] < MAX_IN_FLIGHT:
            backlog, pos = cons.consume(num_messages=CONSUME_BATCH, timeout=0.1), 0
        elif pos >= len(backlog):
            # nothing to forward until reports come back: wait for them (a consumer poll here would
            # take a record off the queue and drop it)
            prod.poll(0.001)
        while pos < len(backlog) and state["in_flight"] < MAX_IN_FLIGHT:
            m = backlog[pos]
            err = m.error()
            if err is not None:
                state["consume_errors"] += 1
                errors[str(err)] = errors.get(str(err), 0) + 1
                pos += 1
                continue
            try:
                # positional, as the sidecar calls it (keywords cost ~2 us per call in the client)
                prod.produce(ns.target, m.value(), m.key(), -1, on_delivery, None, 0, m.headers())
            except BufferError:
                prod.poll(0.01)
                break
            pos += 1
            if not first_ms:
                first_ms = time.time_ns() // 1_000_000
            state["in_flight"] += 1
            consumed += 1
            positions[m.partition()] = m.offset() + 1  # type: ignore[index,operator]
        prod.poll(0)
        now = time.monotonic()
        if now - last_progress >= 5:
            emit("progress", consumed=consumed, positions={str(p): o for p, o in positions.items()}, errors=errors,
                 **state)
            last_progress = now
        if now - last_commit >= 0.2 and positions:
            cons.commit(offsets=[TopicPartition(ns.source, p, o) for p, o in positions.items()], asynchronous=True)
            last_commit = now
    prod.flush(60)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    emit("done", cpu_s=ru.ru_utime + ru.ru_stime - cpu0, consumed=consumed, acked=state["acked"],
         failed=state["failed"], consume_errors=state["consume_errors"], errors=errors, first_produce_ms=first_ms)
    cons.close()
    return 0 if state["acked"] >= ns.count else 1


if __name__ == "__main__":
    sys.exit(main())
