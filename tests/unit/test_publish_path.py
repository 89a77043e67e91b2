"""The loop's publish path (``Publishing.publish`` -> ``produce`` -> delivery report -> settle) with a
fake producer and a fake clock, once through the C fast path (``native.publish_due`` and its
``Delivery`` reports) and once through the Python reference (``_produce`` / ``_on_delivery``):
the same records go out with the same arguments and headers, the same refs are acked, and the
counters, lateness values, early count, backlog, retries, troubled targets and in-flight counts
come out the same, on plain batches and on every path the C code hands back to Python (a record
not due yet, a full producer queue, a local produce error, a failed delivery, a troubled target,
the broker marked down, a revoked partition)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sidecar.config import Settings
from sidecar.engine.loop import Sidecar
from sidecar.engine.stores import store_key
from sidecar.store import codec
from sidecar.store.partition import PartitionStore
from tests.infra import needs_native

native = codec.native
T0 = 1_700_000_000_000
SCHEDULERS = ["wheel", "levels"]


class OutMsg:
    """What a delivery report carries: the broker's timestamp of the produced record."""

    def __init__(self, ts: int) -> None:
        self.ts = ts

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts)


@dataclass
class FakeProducer:
    """Records every ``produce`` (positional, as the loop calls it) and serves the delivery
    reports at ``poll``: an error for the keys in ``fail`` (each once), otherwise success stamped
    ``clock() + skew[key]``. ``buffer_full_at``: the produce calls (1-based) that raise
    BufferError; ``local_error``: keys whose produce raises KafkaException."""

    clock: Callable[[], int]
    fail: set[bytes] = field(default_factory=set)
    skew: dict[bytes, int] = field(default_factory=dict)
    buffer_full_at: set[int] = field(default_factory=set)
    local_error: set[bytes] = field(default_factory=set)
    hold: bool = False  # poll serves no report (deliveries still in flight)
    calls: int = 0
    produced: list[tuple[Any, ...]] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)
    pending: list[tuple[bytes, Any]] = field(default_factory=list)

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1, callback: Any = None,
                on_delivery: Any = None, timestamp: int = 0, headers: Any = None) -> None:
        self.calls += 1
        if self.calls in self.buffer_full_at:
            raise BufferError("Local: Queue full")
        if key in self.local_error:
            self.local_error.discard(key)
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        self.produced.append((topic, value, key, partition, on_delivery, timestamp, headers))
        self.callbacks.append(callback)
        self.pending.append((key, callback))

    def poll(self, timeout: float = 0) -> int:
        if self.hold:
            return 0
        pending, self.pending = self.pending, []
        for key, cb in pending:
            if key in self.fail:
                self.fail.discard(key)
                cb(KafkaError(KafkaError._MSG_TIMED_OUT), OutMsg(0))
            else:
                cb(None, OutMsg(self.clock() + self.skew.get(key, 0)))
        return len(pending)


@dataclass
class Observed:
    produced: list[tuple[Any, ...]] = field(default_factory=list)
    acked: list[tuple[int, bytes]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)


class Clock:
    """The loop's clock (``engine/clock.py``), moved by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def wall_ms(self) -> int:
        return self.now

    def monotonic(self) -> float:
        return self.now / 1000

    def sleep(self, seconds: float) -> None:
        self.now += int(seconds * 1000)


def make(tmp: Path, scheduler: str, c_path: bool, clock: Clock, monkeypatch: pytest.MonkeyPatch,
         **settings: Any) -> tuple[Sidecar, PartitionStore, FakeProducer, Observed]:
    s = Settings(scheduler=scheduler, data_dir=tmp, bootstrap_servers="x:1", ingress_topic="in", **settings)
    sc = Sidecar(s, clock=clock)
    sc.pub.rng = random.Random(5)  # the retry backoff's jitter
    if not c_path:
        sc.pub.native_publisher = None
    st = PartitionStore(s.data_path, "in", 0, rules=sc.rules, scheduler_name=scheduler,
                        make_scheduler=sc.make_scheduler, segment_bytes=s.segment_bytes,
                        cancel_horizon_ms=s.cancel_horizon_ms, counters=sc.counters)
    st.open()
    sc.stores[store_key(st)] = st
    producer = FakeProducer(clock)
    sc.pub.producer = producer
    seen = Observed()
    settle = st.settle

    def spy_settle(now_ms: int = -1) -> None:
        seen.acked.extend((ref, rec.id) for ref, rec in st.acked)
        settle(now_ms)

    st.settle = spy_settle  # type: ignore[method-assign]
    return sc, st, producer, seen


def ingest(st: PartitionStore, n: int, target: Callable[[int], bytes], due: Callable[[int], int],
           start: int = 0) -> None:
    for i in range(start, start + n):
        headers: list[tuple[str, bytes | None]] = [
            ("delay.target-topic", target(i)), ("delay.deliver-at", str(due(i)).encode()), ("app", b"%d" % i),
        ]
        if i % 7 == 3:
            headers.append(("delay.target-partition", b"%d" % (i % 3)))
        # enqueued 1 s before its due time: the due time is exact for the levels scheduler too
        st.ingest_fields("in", i, due(i) - 1000, b"k%d" % i, b"v%d" % i, headers, T0)


def snapshot(sc: Sidecar, st: PartitionStore, producer: FakeProducer) -> dict[str, Any]:
    return {
        "calls": producer.calls,
        "in_flight": sc.pub.state.in_flight,
        "topic_in_flight": dict(sc.pub.state.topic_in_flight),
        "troubled": dict(sc.pub.state.troubled),
        "broker_up": sc.pub.state.broker_up,
        "backlog": [(ref, rec.id, att is None) for ref, rec, _st, att in sc.pub.backlog],
        "retries": sorted((at, ref, None if att is None else att.attempt) for at, _q, ref, _s, att in sc.pub.retries),
        "counters": (sc.counters.delivered, sc.counters.early, sc.counters.publish_retries, dict(sc.counters.dlq)),
        "lateness": list(st.lateness),
        "acked_pending": [(ref, rec.id) for ref, rec in st.acked],
    }


def turn(sc: Sidecar, st: PartitionStore, producer: FakeProducer, seen: Observed, poll: bool = True) -> None:
    sc.pub.publish()
    if poll:
        sc.pub.poll(0)
    seen.steps.append(snapshot(sc, st, producer))


def produced(producer: FakeProducer) -> list[tuple[Any, ...]]:
    """What went out, without the callback objects (a ``partial`` or a ``Delivery``)."""
    return list(producer.produced)


def scenario(tmp: Path, scheduler: str, c_path: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Observed, Any]:
    """Every path in one run, step by step; the observations after each step are compared."""
    clock = Clock()
    sc, st, producer, seen = make(tmp, scheduler, c_path, clock, monkeypatch, max_in_flight=40)  # per-target cap 10
    # 60 records to two targets, due over the next 3 s
    ingest(st, 60, lambda i: b"out-a" if i % 2 else b"out-b", lambda i: T0 + 50 * i)
    producer.skew = {b"k4": -2000, b"k9": 7}  # a broker clock behind the due time: counted early
    clock.now = T0 + 1000
    turn(sc, st, producer, seen)  # plain: the first ~20 due
    # The scheduler hands out records not due yet (as a bug would): the publish-time check parks them.
    due = st.sched.due
    st.sched.due = lambda now, limit: due(now + 400, limit)  # type: ignore[method-assign]
    clock.now = T0 + 1500
    turn(sc, st, producer, seen)
    st.sched.due = due  # type: ignore[method-assign]
    # A full producer queue mid-batch: the rest waits in the backlog, then goes first.
    producer.buffer_full_at = {producer.calls + 3}
    clock.now = T0 + 2000
    turn(sc, st, producer, seen, poll=False)
    clock.now = T0 + 2100
    turn(sc, st, producer, seen)
    # A local produce error and a failed delivery: the target turns troubled, retries follow.
    producer.local_error = {b"k45"}
    producer.fail = {b"k47"}
    clock.now = T0 + 2400
    turn(sc, st, producer, seen)
    clock.now = T0 + 2600  # out-a troubled: its records (and the rest) go through Python
    turn(sc, st, producer, seen)
    # The broker marked down: the first success brings it back.
    sc.pub.state.broker_up = False
    clock.now = T0 + 2800
    turn(sc, st, producer, seen)
    # The retries fall due (backoff <= 100 ms for the first attempt; the cap lets them through).
    for k in range(3):
        clock.now = T0 + 3000 + 300 * k
        turn(sc, st, producer, seen)
    # A revoked partition: its in-flight reports only count down.
    ingest(st, 4, lambda i: b"out-b", lambda i: T0 + 4500, start=60)
    clock.now = T0 + 5000
    producer.hold = True
    turn(sc, st, producer, seen, poll=False)
    del sc.stores[store_key(st)]
    producer.hold = False
    sc.pub.poll(0)
    seen.steps.append(snapshot(sc, st, producer))
    seen.produced = produced(producer)
    return seen, (sc, st, producer)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_python_path_outcomes(tmp_path: Path, scheduler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference path's outcomes, so the comparison below compares something that happened."""
    seen, (sc, _st, producer) = scenario(tmp_path, scheduler, False, monkeypatch)
    ids = [rid for _ref, rid in seen.acked]
    assert sorted(ids) == sorted(b"in:0:%d" % i for i in range(60))  # each delivered once, revoked ones not
    st = sc.pub.state
    assert st.in_flight == 0 and st.topic_in_flight == {} and not sc.pub.backlog and not sc.pub.retries
    assert sc.pub.state.troubled == {} and sc.pub.state.broker_up
    assert seen.steps[0]["counters"][1] == 1  # k4's report, stamped before its due time
    assert seen.steps[1]["counters"][1] == 1 + 8  # the 8 records handed out early, parked
    assert [at for at, _ref, _a in seen.steps[1]["retries"]] == [T0 + 1550 + 50 * k for k in range(8)]
    assert seen.steps[2]["backlog"] != []  # the full queue did leave a backlog
    assert any(s["troubled"] for s in seen.steps)
    assert sc.counters.publish_retries >= 3
    assert len(seen.steps[-2]["lateness"]) > 0
    out = next(p for p in seen.produced if p[2] == b"k12")
    assert out[0] == "out-b" and out[1] == b"v12" and out[3] == -1 and out[4] is None and out[5] == 0
    assert ("app", b"12") in out[6] and ("delay.id", b"in:0:12") in out[6]
    assert [p[3] for p in seen.produced if p[2] == b"k3"] == [0]  # the target partition goes positionally
    assert all(isinstance(cb, functools.partial) for cb in producer.callbacks)


@needs_native
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_c_path_is_the_python_path(tmp_path: Path, scheduler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    py, _ = scenario(tmp_path / "py", scheduler, False, monkeypatch)
    c, (_sc, _st, producer) = scenario(tmp_path / "c", scheduler, True, monkeypatch)
    assert native is not None
    # the C path did run (plain records got C delivery reports), and handed the rest to Python
    kinds = {type(cb) for cb in producer.callbacks}
    assert native.Delivery in kinds and functools.partial in kinds
    assert c.produced == py.produced
    assert c.acked == py.acked
    assert len(c.steps) == len(py.steps)
    for k, (a, b) in enumerate(zip(c.steps, py.steps, strict=True)):
        assert a == b, f"step {k}"


@needs_native
def test_c_path_plain_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain batch goes out entirely in C: one Delivery per record, counts back to zero."""
    assert native is not None
    clock = Clock()
    sc, st, producer, seen = make(tmp_path, "wheel", True, clock, monkeypatch)
    ingest(st, 50, lambda i: b"out", lambda i: T0)
    clock.now = T0 + 10
    producer.hold = True
    sc.pub.publish()
    assert sc.pub.state.in_flight == 50 and sc.pub.state.topic_in_flight == {"out": 50}
    assert all(type(cb) is native.Delivery for cb in producer.callbacks)
    assert len({id(p[0]) for p in producer.produced}) == 1  # one str for the topic
    producer.hold = False
    sc.pub.poll(0)
    assert sc.pub.state.in_flight == 0 and sc.pub.state.topic_in_flight == {}
    assert sc.counters.delivered == 50 and st.lateness == [10] * 50
    assert len(seen.acked) == 50


@needs_native
def test_delivery_rejects_bad_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert native is not None
    clock = Clock()
    sc, st, producer, _seen = make(tmp_path, "wheel", True, clock, monkeypatch)
    ingest(st, 1, lambda i: b"out", lambda i: T0)
    producer.hold = True
    sc.pub.publish()
    cb = producer.callbacks[0]
    with pytest.raises(TypeError):
        cb(None)
    with pytest.raises(TypeError):
        native.publish_due(object(), producer.produce, [], 0, st, T0)
    cb(None, OutMsg(T0))
    assert sc.pub.state.in_flight == 0  # a C integer of the state: the report took it down at once
    assert sc.pub.state.topic_in_flight == {"out": 1}  # the Publisher's until the loop's sync after the poll
    sc.pub.poll(0)
    assert sc.pub.state.in_flight == 0 and sc.pub.state.topic_in_flight == {}
