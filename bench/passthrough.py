"""The physical limit baseline: a plain confluent-kafka consume -> produce passthrough.

Run as ``python -m bench.passthrough --bootstrap B --source T --target T2 --count N``.
It uses the sidecar's own client settings (``workload.INGRESS_CONSUMER`` and
``workload.DELIVERY_PRODUCER``: idempotent, ``acks=all``, ``linger.ms=2``, batches of 5 000 consumed
records, at most 20 000 unacknowledged), a delivery callback per record and an async offset
commit every 200 ms, i.e. everything an at-least-once forwarder written in Python on this
client needs, and nothing else: no validation, no store, no scheduling. It copies key, value and
headers unchanged and exits once ``count`` records are acknowledged, printing JSON event lines
(``ready``, ``done``). ``-P`` / ``-C key=value`` set a producer / consumer setting over those.

``--native-produce`` keeps the consume side and moves the produce side to C (``NativeProduce``:
bench/micro/hybrid_forward.c, a librdkafka producer whose reports are counted in C), to measure
what the Python client's produce and reports cost (docs/benchmarks.md, "A forward path without
Python objects"); ``bench/micro/native_forward.c`` is the whole loop in C.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.workload import CONSUME_BATCH, DELIVERY_PRODUCER, INGRESS_CONSUMER, MAX_IN_FLIGHT, rdkafka_value
from devkafka.jars import cache_root


def emit(event: str, **kw: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps({"event": event, "ts_ms": time.time_ns() // 1_000_000, **kw}) + b"\n")
    sys.stdout.flush()


def hybrid_dir() -> Path:
    """Where scripts/setup.d/80-native-forward.sh builds the hybrid_forward module."""
    return cache_root() / "native-forward"


class PyProduce:
    """The produce side through the Python client: a delivery callback per record."""

    def __init__(self, conf: dict[str, Any], target: str, state: dict[str, int], errors: dict[str, int]) -> None:
        self.prod = Producer(conf)
        self.target, self.state, self.errors = target, state, errors

    def on_delivery(self, err: Any, _msg: Any) -> None:
        self.state["in_flight"] -= 1
        if err is None:
            self.state["acked"] += 1
        else:
            self.state["failed"] += 1
            self.errors[str(err)] = self.errors.get(str(err), 0) + 1

    def forward(self, batch: list[Message], pos: int, positions: dict[int, int]) -> int:
        """Produce ``batch[pos:]`` until MAX_IN_FLIGHT are unacknowledged; the index reached."""
        state, errors, produce, target, on_delivery = self.state, self.errors, self.prod.produce, self.target, \
            self.on_delivery
        while pos < len(batch) and state["in_flight"] < MAX_IN_FLIGHT:
            m = batch[pos]
            err = m.error()
            if err is not None:
                state["consume_errors"] += 1
                errors[str(err)] = errors.get(str(err), 0) + 1
                pos += 1
                continue
            try:
                # positional, as the sidecar calls it (keywords cost ~2 us per call in the client)
                produce(target, m.value(), m.key(), -1, on_delivery, None, 0, m.headers())
            except BufferError:
                self.prod.poll(0.01)
                break
            pos += 1
            state["in_flight"] += 1
            positions[m.partition()] = m.offset() + 1  # type: ignore[index,operator]
        return pos

    def serve(self, timeout_s: float) -> None:
        self.prod.poll(timeout_s)

    def flush(self) -> None:
        self.prod.flush(60)


class NativeProduce:
    """The produce side in C (``--native-produce``: bench/micro/hybrid_forward.c's module, built by
    scripts/setup.d/80-native-forward.sh): reports counted in C, no Python object per report."""

    def __init__(self, conf: dict[str, Any], target: str, state: dict[str, int], errors: dict[str, int]) -> None:
        built = hybrid_dir()
        sys.path.insert(0, str(built))
        try:
            import hybrid_forward  # type: ignore[import-not-found]  # built into the cache, not the package
        except ImportError as e:
            raise SystemExit(f"python -m bench.passthrough --native-produce: {e} in {built} "
                             "(scripts/setup.d/80-native-forward.sh builds it)") from None
        self.hf, self.state = hybrid_forward, state
        self.hf.init({k: rdkafka_value(v) for k, v in conf.items()}, target)

    def forward(self, batch: list[Message], pos: int, positions: dict[int, int]) -> int:
        j: int = self.hf.produce(batch, pos, MAX_IN_FLIGHT)
        for m in batch[pos:j]:  # the same bookkeeping per record as PyProduce's
            positions[m.partition()] = m.offset() + 1  # type: ignore[index,operator]
        if j == pos and pos < len(batch):
            self.serve(0.01)  # a full queue
        self.state.update(self.hf.poll(0))
        return j

    def serve(self, timeout_s: float) -> None:
        self.state.update(self.hf.poll(int(timeout_s * 1000)))

    def flush(self) -> None:
        self.state.update(self.hf.flush(60_000))


def settings(base: dict[str, Any], pairs: list[str]) -> dict[str, Any]:
    """``base`` with the ``key=value`` pairs of -P / -C over it."""
    out = dict(base)
    for kv in pairs:
        key, eq, value = kv.partition("=")
        if not eq:
            raise SystemExit(f"python -m bench.passthrough: expected key=value, got {kv!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.passthrough")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("-P", action="append", default=[], metavar="KEY=VALUE", help="a producer setting")
    ap.add_argument("-C", action="append", default=[], metavar="KEY=VALUE", help="a consumer setting")
    ap.add_argument("--native-produce", action="store_true",
                    help="produce from C (bench/micro/hybrid_forward.c), consume as before")
    ns = ap.parse_args(argv)

    state = {"in_flight": 0, "acked": 0, "failed": 0, "consume_errors": 0}
    errors: dict[str, int] = {}
    side = NativeProduce if ns.native_produce else PyProduce
    prod = side(settings({"bootstrap.servers": ns.bootstrap, **DELIVERY_PRODUCER}, ns.P), ns.target, state, errors)
    cons = Consumer(settings({"bootstrap.servers": ns.bootstrap, "group.id": ns.group, **INGRESS_CONSUMER}, ns.C))

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
            prod.serve(0.001)
        if pos < len(backlog):
            before = state["consume_errors"]
            j = prod.forward(backlog, pos, positions)
            if j > pos and not first_ms:
                first_ms = time.time_ns() // 1_000_000
            consumed += j - pos - (state["consume_errors"] - before)
            pos = j
        prod.serve(0)
        now = time.monotonic()
        if now - last_progress >= 5:
            emit("progress", consumed=consumed, positions={str(p): o for p, o in positions.items()}, errors=errors,
                 **state)
            last_progress = now
        if now - last_commit >= 0.2 and positions:
            cons.commit(offsets=[TopicPartition(ns.source, p, o) for p, o in positions.items()], asynchronous=True)
            last_commit = now
    prod.flush()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    emit("done", cpu_s=ru.ru_utime + ru.ru_stime - cpu0, consumed=consumed, acked=state["acked"],
         failed=state["failed"], consume_errors=state["consume_errors"], errors=errors, first_produce_ms=first_ms)
    cons.close()
    return 0 if state["acked"] >= ns.count else 1


if __name__ == "__main__":
    sys.exit(main())
