"""The native producer (sidecar/native/producer.c) against the real broker: what the engine relies
on from confluent-kafka's Producer, checked on NativeProducer itself.

Records produced with it are read back with a plain confluent-kafka consumer (key, value, headers,
partition, timestamp); its reports carry what a confluent-kafka report carries; a full queue raises
BufferError, a bad setting KafkaException naming the property; purge fails what is queued through
the reports; an unreachable broker reaches ``error_cb``; the logger gets librdkafka's lines; an
exception a report callable raises is raised by the poll, after the rest of the batch is served;
close drops the reports still to come. The engine's use of it (``--producer native``) is tested by
the crash test (SIGKILLs under load, 0 lost) and the broker outage test.
"""

from __future__ import annotations

import time
import types
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sidecar.engine.native_client import NativeClients, bind, librdkafka_path
from sidecar.store.codec import native
from tests.integration.harness import SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def bound() -> None:
    bind()


def _conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2, **extra}


def test_records_and_reports_match_what_a_consumer_reads(kafka_bootstrap: str, unique: str) -> None:
    topic = f"native-{unique}"
    create_topics(kafka_bootstrap, [topic], partitions=3)
    p = native.NativeProducer(_conf(kafka_bootstrap))
    reports: list[tuple[Any, Any]] = []
    n = 300
    for i in range(n):
        # positional, in the engine's order (topic, value, key, partition, callback, on_delivery,
        # timestamp, headers), and by keyword
        if i % 2:
            p.produce(topic, f"v{i}".encode(), f"k{i}".encode(), i % 3, lambda e, m: reports.append((e, m)), None,
                      1_700_000_000_000 + i, [("n", str(i).encode()), ("none", None), ("s", "text")])
        else:
            p.produce(topic, value=f"v{i}", key=f"k{i}", partition=i % 3,
                      on_delivery=lambda e, m: reports.append((e, m)), headers={"n": str(i).encode()})
    assert p.flush(30) == 0
    assert len(p) == 0
    assert len(reports) == n and all(e is None for e, _ in reports)
    by_key = {m.key(): m for _, m in reports}
    got = consume_until(kafka_bootstrap, [topic], want=n, timeout_s=60)
    assert len(got) == n
    for r in got:
        i = int(r.key.decode()[1:])  # type: ignore[union-attr]
        m = by_key[r.key]
        assert (m.topic(), m.partition(), m.offset()) == (r.topic, r.partition, r.offset) == (topic, i % 3, r.offset)
        assert m.value() == r.value == f"v{i}".encode() and m.error() is None and m.headers() is None
        assert m.timestamp()[1] == r.timestamp_ms
        if i % 2:
            assert r.timestamp_ms == 1_700_000_000_000 + i
            assert r.header_list == [("n", str(i).encode()), ("none", None), ("s", b"text")]
        else:
            assert r.header_list == [("n", str(i).encode())]
    p.close()


def test_refusals_are_confluent_kafkas(kafka_bootstrap: str, unique: str) -> None:
    with pytest.raises(KafkaException, match=r"no\.such\.property"):
        native.NativeProducer({"bootstrap.servers": kafka_bootstrap, "no.such.property": 1})
    with pytest.raises(ValueError, match="stats_cb"):
        native.NativeProducer({"bootstrap.servers": kafka_bootstrap, "stats_cb": print})
    p = native.NativeProducer(_conf(kafka_bootstrap, **{"queue.buffering.max.messages": 5, "linger.ms": 1000}))
    for _ in range(5):
        p.produce(f"native-{unique}", b"x")
    with pytest.raises(BufferError):
        p.produce(f"native-{unique}", b"x")
    with pytest.raises(TypeError, match="value"):
        p.produce(f"native-{unique}", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword"):
        p.produce(f"native-{unique}", valeu=b"x")  # type: ignore[call-arg]
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.produce(f"native-{unique}", b"x")


def test_purge_fails_the_queued_records_through_their_reports(kafka_bootstrap: str, unique: str) -> None:
    topic = f"native-{unique}"
    create_topics(kafka_bootstrap, [topic])
    p = native.NativeProducer(_conf(kafka_bootstrap, **{"linger.ms": 5000}))
    reports: list[Any] = []
    for i in range(50):
        p.produce(topic, b"x", str(i).encode(), callback=lambda e, m: reports.append(e))
    p.purge()
    deadline = time.monotonic() + 10
    while len(p) and time.monotonic() < deadline:
        p.poll(0.1)
    assert len(reports) == 50
    assert {e.code() for e in reports} == {KafkaError._PURGE_QUEUE}
    p.close()


def test_error_cb_and_logger_are_served_by_poll(unique: str) -> None:
    errors: list[Any] = []
    lines: list[tuple[int, tuple[Any, ...]]] = []

    class Logger:
        def log(self, level: int, msg: str, *args: Any) -> None:
            lines.append((level, args))

    p = native.NativeProducer({"bootstrap.servers": "127.0.0.1:1", "error_cb": errors.append,
                               "logger": Logger(), "reconnect.backoff.ms": 10})
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        p.poll(0.1)
    assert errors and all(isinstance(e, KafkaError) for e in errors)
    assert {e.code() for e in errors} & {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
    assert lines, "librdkafka's lines reach the logger"
    level, (facility, client, text) = lines[0]
    assert level in (10, 20, 30, 40, 50) and facility and client.startswith("rdkafka#producer") and text
    p.close()


def test_a_raising_callable_is_raised_by_poll_after_its_batch(kafka_bootstrap: str, unique: str) -> None:
    topic = f"native-{unique}"
    create_topics(kafka_bootstrap, [topic])
    p = native.NativeProducer(_conf(kafka_bootstrap, **{"linger.ms": 200}))
    served: list[int] = []

    def report(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            served.append(i)
            if i == 0:
                raise LookupError("from the callable")
        return cb

    for i in range(20):
        p.produce(topic, b"x", callback=report(i))
    with pytest.raises(LookupError, match="from the callable"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            p.poll(0.5)
    while len(p):
        p.poll(0.1)
    assert sorted(served) == list(range(20)), "every report served once, the raise notwithstanding"
    p.close()


def test_close_drops_the_reports_to_come(kafka_bootstrap: str, unique: str) -> None:
    p = native.NativeProducer(_conf(kafka_bootstrap, **{"linger.ms": 5000}))
    called: list[Any] = []
    for _ in range(10):
        p.produce(f"native-{unique}", b"x", callback=lambda e, m: called.append(e))
    assert len(p) == 10
    p.close()
    assert len(p) == 0 and called == []
    p.close()  # a second close is harmless


def test_the_engine_gets_it_for_non_transactional_producers(kafka_bootstrap: str) -> None:
    clients = NativeClients()
    assert isinstance(clients.producer(_conf(kafka_bootstrap)), native.NativeProducer)
    txn = clients.producer(_conf(kafka_bootstrap, **{"transactional.id": "t"}))
    assert not isinstance(txn, native.NativeProducer)
    path = librdkafka_path()
    assert path is not None and "librdkafka" in path


def test_c_report_callables_are_served_in_c_as_their_reference(kafka_bootstrap: str, unique: str) -> None:
    """A changelog mirror's writes (mirror.c's MirrorReport, served from the report's offset and
    value without a report object) leave the counts and offsets the Python reference leaves."""
    from sidecar.engine.changelog import StoreMirror
    from tests.unit.test_changelog_native import _drive, _Store

    out = []
    for in_c in (True, False):
        topic = f"native-cl-{unique}-{int(in_c)}"
        create_topics(kafka_bootstrap, [topic])
        p = native.NativeProducer(_conf(kafka_bootstrap))
        store: Any = _Store()
        m = StoreMirror(types.SimpleNamespace(producer=p, should_warn=lambda _key: False), topic, store, in_c=in_c)
        assert (m.put_run is not None) == in_c
        _drive(m, p)
        assert p.flush(30) == 0
        out.append({"produced": m.produced, "acked": m.acked, "failed": m.failed,
                    "changelog_offset": store.changelog_offset, "changelog_ingress": store.changelog_ingress})
        p.close()
    fast, ref = out
    assert fast == ref
    assert ref["acked"] == ref["produced"] == ref["changelog_offset"] == 12 and ref["failed"] == 0
    assert ref["changelog_ingress"] == 100 + 9 + 1


def _delivered_headers(kafka_bootstrap: str, tmp_path: Any, name: str, kind: str) -> dict[bytes, Any]:
    """300 records through a sidecar with the ``kind`` producer, half due on arrival (published
    from the intake, direct.c) and half after a second (stored, publish.c); per delay.id what its
    delivered record carries, with the time-dependent header values reduced to their form."""
    target = f"{name}-out"
    create_topics(kafka_bootstrap, [target])
    sc = SidecarProcess(kafka_bootstrap, tmp_path / f"data-{kind}", f"{name}-in", f"{name}-dlq",
                        extra=["--scheduler", "levels", "--ingress-partitions", "1", "--producer", kind])
    try:
        sc.start()
        p = producer(kafka_bootstrap)
        for i in range(300):
            headers = [("app", b"x%d" % i), ("delay.target-topic", target.encode()),
                       ("delay.ms", b"0" if i % 2 else b"1000"), ("delay.id", b"id-%d" % i), ("nul", None)]
            p.produce(sc.ingress, key=b"k%d" % i, value=b"v%d" % i, headers=headers)
        assert p.flush(30) == 0
        got = consume_until(kafka_bootstrap, [target], want=300, timeout_s=60, settle_s=1)
    finally:
        sc.stop_quietly()
    out: dict[bytes, Any] = {}
    for r in got:
        shape = []
        for k, v in r.header_list:
            if k in ("delay.deliver-at", "delay.enqueued-at"):
                assert v is not None and v.isdigit()
                v = b"<ms>"
            elif k == "delay.source":
                assert v is not None and v.startswith(f"{name}-in:0:".encode()) and v.rsplit(b":", 1)[1].isdigit()
                v = b"<source>"
            shape.append((k, v))
        out[r.headers["delay.id"] or b""] = (r.key, r.value, shape)
    return out


def test_the_c_entry_delivers_what_the_python_path_delivers(kafka_bootstrap: str, tmp_path: Any,
                                                            unique: str) -> None:
    """publish.c and direct.c write a delivered record's headers straight into librdkafka's with the
    native producer: the records a consumer reads are those confluent-kafka's producer delivers."""
    by_kind = {kind: _delivered_headers(kafka_bootstrap, tmp_path, f"nat-{kind}-{unique}", kind)
               for kind in ("confluent", "native")}
    assert len(by_kind["native"]) == 300
    assert by_kind["native"] == by_kind["confluent"]
    key, value, shape = by_kind["native"][b"id-7"]
    assert (key, value) == (b"k7", b"v7")
    assert shape == [("app", b"x7"), ("nul", None), ("delay.id", b"id-7"), ("delay.deliver-at", b"<ms>"),
                     ("delay.enqueued-at", b"<ms>"), ("delay.source", b"<source>")]
