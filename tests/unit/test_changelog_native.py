"""The changelog writes' C path (native/mirror.c) against the Python reference (StoreMirror with
``in_c=False``): the same sequence of puts, held puts, tombstones and flushes, on the Kafka twin,
leaves the same changelog records, the same counts and the same offsets the store covers; and a
refused produce or a failed write takes the reference's way (sent again, counted as failed)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from sidecar.engine.changelog import StoreMirror
from sidecar.store import codec
from sidecar.store.codec import NATIVE
from sidecar.store.flights import Flights
from tests.kafka_twin import TwinCluster, TwinProducer, VirtualClock

pytestmark = pytest.mark.skipif(not NATIVE, reason="the C extension is not built")

TOPIC = "in.changelog"
NOW = 1_000_000


class _Store:
    """What a mirror reads and moves of its store (PartitionStore's fields and ``covered``)."""

    def __init__(self) -> None:
        self.partition = 0
        self.changelog_offset: int | None = None
        self.changelog_ingress: int | None = None
        self.flights = Flights()  # no record published from the intake (engine/direct.py)

    def covered(self, src_offset: int) -> None:
        if self.changelog_ingress is None or src_offset >= self.changelog_ingress:
            self.changelog_ingress = src_offset + 1


def _raw(i: int, due: int) -> bytes:
    return codec.encode(
        codec.head(
            rtype=codec.MESSAGE, due_ms=due, enqueue_ms=NOW, src_offset=100 + i, src_partition=0,
            target_partition=-1, retry_count=0, level=0,
        ),
        b"id-%d" % i, b"out", b"k", b"v" * i, b"",
    )


def _mirror(in_c: bool, queue_max: int = 100_000) -> tuple[StoreMirror, TwinCluster, TwinProducer]:
    cluster = TwinCluster(VirtualClock())
    cluster.create_topic(TOPIC, 1)
    producer = TwinProducer(cluster, queue_max=queue_max)
    kafka = types.SimpleNamespace(producer=producer, should_warn=lambda _key: False)
    store: Any = _Store()
    return StoreMirror(kafka, TOPIC, store, in_c=in_c), cluster, producer


def _drive(m: StoreMirror, producer: TwinProducer) -> None:
    """Records 0-5 due now (held), 6 due later (the held ones written first), 7-9 due now (held);
    0-2 and 7 delivered (tombstones of 0-2; 7, its id's only version, settled while its put was
    held: neither is written); a flush (a checkpoint)."""
    raws = [_raw(i, NOW + (60_000 if i == 6 else 0)) for i in range(10)]
    recs = [codec.decode(r, 0) for r in raws]
    if m.put_run is not None:
        buf, off, count = memoryview(b"".join(raws)), 0, len(raws)
        while count:
            done, off = m.put_run(buf, off, count, NOW, True)
            count -= done
            if count:  # what _mirror_run does with the record C leaves to put
                rec = codec.decode(buf, off)
                m.put(bytes(rec.id), bytes(buf[off:off + rec.length]), rec.due_ms <= NOW, fresh=True)
                off += rec.length
                count -= 1
    else:
        for rec, raw in zip(recs, raws, strict=True):
            m.put(bytes(rec.id), raw, rec.due_ms <= NOW, fresh=True)  # as store/mirroring.py _mirror_run
    producer.poll(0)
    acked = [(k, recs[k]) for k in (0, 1, 2, 7)]
    if m.remove_run is not None:
        m.remove_run(acked)
    else:
        for _ref, rec in acked:
            m.remove(rec.id)
    m.flush_held()
    producer.poll(0)


def _state(m: StoreMirror, cluster: TwinCluster) -> dict[str, Any]:
    log = [(msg.offset(), msg.key(), msg.value()) for msg in cluster.topics[TOPIC][0]]
    return {"log": log, "produced": m.produced, "acked": m.acked, "failed": m.failed, "held": dict(m.held),
            "retry": list(m.retry), "changelog_offset": m.store.changelog_offset,
            "changelog_ingress": m.store.changelog_ingress}


@pytest.mark.parametrize("queue_max", [100_000, 2])  # 2: produces refused (BufferError) and handed back
def test_the_c_writes_and_reports_match_the_reference(queue_max: int) -> None:
    out = []
    for in_c in (True, False):
        m, cluster, producer = _mirror(in_c, queue_max)
        assert (m.put_run is not None) == in_c
        _drive(m, producer)
        out.append(_state(m, cluster))
    fast, ref = out
    assert fast == ref
    keys = [(k.decode(), "tomb" if v is None else "put") for _o, k, v in ref["log"]]
    assert keys == [*((f"id-{i}", "put") for i in range(7)),  # the held puts of 0-5 before 6's
                    *((f"id-{i}", "tomb") for i in (0, 1, 2)),  # 7: its held put dropped, no tombstone
                    ("id-8", "put"), ("id-9", "put")]  # the flush
    assert ref["acked"] == ref["produced"] == len(ref["log"])
    assert ref["changelog_offset"] == len(ref["log"])
    assert ref["changelog_ingress"] == 100 + 9 + 1  # the highest source offset put: record 9's (flushed)
    assert ref["held"] == {}


def test_a_failed_write_is_sent_again_on_either_path() -> None:
    out = []
    for in_c in (True, False):
        m, cluster, producer = _mirror(in_c)
        cluster.refused.add(TOPIC)
        _drive(m, producer)
        failed = _state(m, cluster)
        assert failed["acked"] == 0 and failed["failed"] == failed["produced"] > 0
        assert len(failed["retry"]) == failed["produced"]
        cluster.refused.clear()
        m.resend()
        producer.poll(0)
        out.append((failed, _state(m, cluster)))
    assert out[0] == out[1]
    after = out[1][1]
    assert after["failed"] == 0 and after["acked"] == after["produced"] and after["retry"] == []


def _settle(m: StoreMirror, rec: codec.Record) -> None:
    if m.remove_run is not None:
        m.remove_run([(0, rec)])
    else:
        m.remove(rec.id)


@pytest.mark.parametrize("in_c", [True, False])
def test_a_fresh_record_settled_while_held_writes_nothing_else_a_tombstone(in_c: bool) -> None:
    """Settled while its put is held: a fresh record (its id's only version) leaves the changelog
    untouched; a held replace (not fresh: an older version may be in the changelog) and a fresh
    record whose put a flush wrote get their tombstones."""
    m, cluster, producer = _mirror(in_c)
    raws = [_raw(i, NOW) for i in range(3)]
    recs = [codec.decode(r, 0) for r in raws]
    m.put(bytes(recs[0].id), raws[0], True, fresh=True)
    m.put(bytes(recs[1].id), raws[1], True)  # e.g. a replace held back
    _settle(m, recs[0])
    _settle(m, recs[1])
    m.put(bytes(recs[2].id), raws[2], True, fresh=True)
    m.flush_held()  # a checkpoint: record 2's put is written, so its settle needs a tombstone
    _settle(m, recs[2])
    producer.poll(0)
    log = [(msg.key(), msg.value() is None) for msg in cluster.topics[TOPIC][0]]
    assert log == [(b"id-1", True), (b"id-2", False), (b"id-2", True)]
    assert m.produced == m.acked == 3 and m.held == {} and m.fresh == set()


@pytest.mark.parametrize("in_c", [True, False])
def test_a_held_put_of_a_rearmed_firing_is_not_fresh(in_c: bool) -> None:
    """A re-armed firing's put (store/rearming.py: a run with ``fresh`` False) is not its id's only
    version: the schedule's earlier put is in the changelog, so when its last firing settles while
    held the tombstone is written; else a restore would bring the ended schedule back."""
    m, cluster, producer = _mirror(in_c)
    first, again = _raw(0, NOW + 60_000), _raw(0, NOW)
    m.put(b"id-0", first)  # armed for later: written
    if m.put_run is not None:
        assert m.put_run(memoryview(again), 0, 1, NOW, False) == (1, len(again))
    else:
        m.put(b"id-0", again, True, fresh=False)  # as store/mirroring.py _mirror_run with fresh False
    assert m.fresh == set() and m.held == {b"id-0": again}
    _settle(m, codec.decode(again, 0))
    producer.poll(0)
    assert [(msg.key(), msg.value() is None) for msg in cluster.topics[TOPIC][0]] == [(b"id-0", False), (b"id-0", True)]


def test_exactly_once_keeps_no_fresh_ids() -> None:
    """In transactions every settled record's tombstone is written (its held put waits for the
    commit): ``fresh`` stays empty."""
    m, cluster, producer = _mirror(False)
    m.in_transactions = True
    raw = _raw(0, NOW)
    rec = codec.decode(raw, 0)
    m.put(bytes(rec.id), raw, True, fresh=True)
    assert m.fresh == set()
    m.remove(rec.id)
    producer.poll(0)
    assert [(msg.key(), msg.value()) for msg in cluster.topics[TOPIC][0]] == [(b"id-0", None)]
