"""Reschedule (``delay.replace``) and etf1/kafka-message-scheduler semantics on one PartitionStore,
with virtual time and no Kafka (the ``Sim`` of test_partition_store.py plays the loop).

A replace stored before the pending record's due time always wins: the old version never fires,
across crashes (the log's replay), checkpoints (entries restored from it), a re-consumption of
older records, a changelog restore, and under both schedulers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.engine.etf1 import schedule_headers, tail_of
from sidecar.headers import AfterDelivery, Cancel, Rejection, kms_delete, parse_ingress, py_parse_request
from sidecar.store import codec
from sidecar.store.codec import native
from sidecar.store.idindex import id_hash
from sidecar.store.partition import IngressRecord, PartitionStore
from tests.unit.helpers.records import parse_rules
from tests.unit.helpers.store_sim import T0, TOPIC, Sim

SCHEDULERS = ["levels", "wheel"]


def send(sim: Sim, rid: str | None, delay_ms: int, value: bytes, *, replace: bytes | None = b"true",
         key: bytes | None = b"k", extra: list[tuple[str, bytes | None]] | None = None) -> int:
    headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"target"), (c.DELAY_MS, str(delay_ms).encode())]
    if rid is not None:
        headers.append((c.ID, rid.encode()))
    if replace is not None:
        headers.append((c.REPLACE, replace))
    headers += extra or []
    off = len(sim.ingress)
    sim.ingress.append(IngressRecord(TOPIC, 0, off, sim.now, key, value, headers))
    return off


def fired(sim: Sim) -> list[tuple[bytes, bytes | None, int]]:
    """(id, value, committed due time - T0) of every record handed out so far, in order."""
    return sim.fired  # type: ignore[attr-defined, no-any-return]


def run(sim: Sim, ms: int, step: int = 100, ack: bool = True) -> None:
    end = sim.now + ms
    while sim.now < end:
        sim.now += step
        sim.consume()
        for ref, rec in sim.st.sched.due(sim.now, 1_000_000):
            assert rec.due_ms <= sim.now
            sim.fired.append((bytes(rec.id), None if rec.value is None else bytes(rec.value),  # type: ignore[attr-defined]
                              rec.due_ms - T0))
            sim.in_flight.append((ref, bytes(rec.id)))
        if ack:
            sim.ack_all()


@pytest.fixture(params=SCHEDULERS)
def sim(request: pytest.FixtureRequest, tmp_path: Path) -> Sim:
    s = Sim(tmp_path, scheduler=request.param)
    s.fired = []  # type: ignore[attr-defined]
    return s


def test_a_replace_takes_the_place_of_the_pending_record(sim: Sim) -> None:
    send(sim, "x", 5000, b"old", replace=None)
    send(sim, "x", 1000, b"new")
    sim.consume()
    assert sim.counters.replaced == 1 and sim.counters.duplicates == 0
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"new", 1000)]
    send(sim, "x", 1000, b"again")  # a replace for an id no longer pending: scheduled anew
    run(sim, 2000)
    assert fired(sim)[1:] == [(b"x", b"again", 13_000)]
    assert sim.st.log.pending_records() == 0


def test_a_later_due_time_also_wins(sim: Sim) -> None:
    send(sim, "x", 1000, b"old", replace=None)
    sim.consume()
    sim.now += 900  # shortly before the due time
    send(sim, "x", 5000, b"new")
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"new", 5900)]


def test_without_replace_the_second_record_is_a_dropped_duplicate(sim: Sim) -> None:
    send(sim, "x", 5000, b"old", replace=None)
    send(sim, "x", 1000, b"new", replace=b"false")
    sim.consume()
    assert sim.counters.duplicates == 1 and sim.counters.replaced == 0
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"old", 5000)]


@pytest.mark.parametrize("checkpoint", ["none", "before-replace", "after-replace"])
def test_a_replace_survives_a_crash(sim: Sim, checkpoint: str) -> None:
    """The log replay treats a second record under a pending id as the replace it was, whether the
    replaced entry is restored from the checkpoint or replayed itself."""
    send(sim, "x", 5000, b"v1", replace=None)
    sim.consume()
    if checkpoint == "before-replace":
        sim.st.checkpoint()
    send(sim, "x", 10_000, b"v2")
    send(sim, "x", 1000, b"v3")
    sim.consume()
    if checkpoint == "after-replace":
        sim.st.checkpoint()
    sim.crash()
    assert sim.position == 3, "nothing consumed again: the log holds all three"
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"v3", 1000)]
    sim.st.checkpoint()
    sim.crash()
    run(sim, 2000)
    assert fired(sim) == [(b"x", b"v3", 1000)], "delivered, acked and checkpointed: not again"


def test_an_older_version_consumed_again_never_replaces_a_newer_one(sim: Sim) -> None:
    """A handover can resume ingress before records the store holds: a re-consumed older record
    (a lower offset than the pending version) changes nothing."""
    send(sim, "x", 5000, b"v1", replace=None)
    send(sim, "x", 5000, b"v2")
    send(sim, "x", 1000, b"v3")
    sim.consume()
    sim.position = 0
    sim.consume()
    assert sim.counters.replaced == 2 and sim.counters.duplicates == 3
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"v3", 1000)]


def test_a_replace_while_the_old_version_is_being_delivered(sim: Sim) -> None:
    send(sim, "x", 0, b"v1", replace=None)
    run(sim, 100, ack=False)  # v1 is in flight (its due time had come)
    send(sim, "x", 1000, b"v2")
    sim.consume()
    sim.send(cancel="x")  # reaches v2, not only the in-flight v1
    sim.consume()
    assert sim.counters.cancelled == 1
    sim.ack_all()
    run(sim, 3000)
    assert fired(sim) == [(b"x", b"v1", 0)]


def test_the_dead_letter_of_a_version_replaced_in_flight_leaves_its_successor(sim: Sim) -> None:
    send(sim, "x", 0, b"v1", replace=None)
    run(sim, 100, ack=False)  # v1 in flight
    send(sim, "x", 1000, b"v2")
    sim.consume()
    (ref, _rid), = sim.in_flight
    rec = sim.st.sched.record(ref)
    assert rec is not None
    sim.st.dead_letter(ref, rec, c.DELIVERY_FAILED, "target gone", 3, sim.now)
    sim.in_flight = []
    sim.crash()  # the replay too keeps v2 pending
    run(sim, 3000)
    assert sorted(f[1] for f in fired(sim)) == [b"v1", b"v1", b"v2"]  # v1 first, then its dead letter
    dead = [f for f in fired(sim)[1:] if f[1] == b"v1"]
    assert dead == [(b"in:0:0", b"v1", dead[0][2])], "the dead letter under the source's default id"


def test_a_rejected_replace_leaves_the_pending_record(sim: Sim) -> None:
    send(sim, "x", 5000, b"v1", replace=None)
    send(sim, "x", 1000, b"v2", replace=b"yes")
    send(sim, None, 1000, b"v3")  # a replace without delay.id
    sim.consume()
    assert sim.counters.dlq[c.BAD_HEADER] == 2
    run(sim, 12_000)
    dead = [f for f in fired(sim) if f[1] != b"v1"]
    assert [f[1] for f in dead] == [b"v2", b"v3"]
    assert [f for f in fired(sim) if f[1] == b"v1"] == [(b"x", b"v1", 5000)]


def test_replace_header_values_and_errors() -> None:
    rules = parse_rules()
    base = [(c.TARGET_TOPIC, b"out"), (c.ID, b"a")]
    for raw in (b"yes", b"TRUE", b"1", b"true "):
        r = parse_ingress([*base, (c.REPLACE, raw)], T0, T0, 0, rules)
        assert isinstance(r, Rejection) and r.reason == c.BAD_HEADER
        assert c.REPLACE in r.error and "accepted: true, false" in r.error
    r = parse_ingress([*base, (c.REPLACE, b"")], T0, T0, 0, rules)
    assert isinstance(r, Rejection) and r.reason == c.BAD_HEADER and r.error == f"header {c.REPLACE} is empty"
    r = parse_ingress([(c.TARGET_TOPIC, b"out"), (c.REPLACE, b"true")], T0, T0, 0, rules)
    assert isinstance(r, Rejection) and r.reason == c.BAD_HEADER and c.ID in r.error
    ok = parse_ingress([*base, (c.REPLACE, b"true")], T0, T0, 0, rules)
    assert not isinstance(ok, Rejection) and ok.replace  # type: ignore[union-attr]
    no = parse_ingress([*base, (c.REPLACE, b"false")], T0, T0, 0, rules)
    assert not isinstance(no, Rejection) and not no.replace  # type: ignore[union-attr]
    # the C fast path does not take a replace: the full parser (and _schedule) does
    rules.checked_targets.add("out")
    assert py_parse_request([*base, (c.REPLACE, b"true")], T0, T0, 0, rules) is None
    if native is not None:
        assert native.parse_request(
            [*base, (c.REPLACE, b"true")], T0, T0, 0, rules.max_record_bytes, rules.max_delay_ms,
            rules.checked_targets,
        ) is None


# -- the changelog restore ----------------------------------------------------------------------------
def _raw(rid: bytes, src_offset: int, value: bytes, due: int, rtype: int = codec.MESSAGE) -> bytes:
    return codec.encode(
        codec.head(
            rtype=rtype, due_ms=due, enqueue_ms=T0, src_offset=src_offset, src_partition=0, target_partition=-1,
            retry_count=0, level=0,
        ),
        rid, b"target", b"k", value, codec.encode_headers(()),
    )


def test_restore_put_a_newer_version_replaces_an_older_one_is_ignored(sim: Sim) -> None:
    st: PartitionStore = sim.st
    now = T0
    st.restore_put(b"x", _raw(b"x", 10, b"v10", T0 + 5000), now)
    st.restore_put(b"x", _raw(b"x", 7, b"v7", T0 + 1000), now)  # older: the same id replayed from before
    st.restore_put(b"x", _raw(b"x", 10, b"v10", T0 + 5000), now)  # the same record again
    run(sim, 2000)
    assert fired(sim) == []
    st.restore_put(b"x", _raw(b"x", 12, b"v12", T0 + 3000), sim.now)  # newer: a replace on the old owner
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"v12", 3000)]


def test_restore_put_the_dead_letter_of_a_pending_record_replaces_it(sim: Sim) -> None:
    st = sim.st
    st.restore_put(b"x", _raw(b"x", 4, b"v", T0 + 5000), T0)
    st.restore_put(b"x", _raw(b"x", 4, b"dead", T0, codec.DEAD), T0)
    run(sim, 12_000)
    assert fired(sim) == [(b"x", b"dead", 0)]


class _Mirror:
    on_settle = True
    holds_due = False
    put_run = remove_run = None

    def __init__(self) -> None:
        self.produced = self.acked = 0
        self.table: dict[bytes, bytes | None] = {}

    def put(self, rid: bytes, raw: bytes, due_now: bool = False) -> None:
        self.table[rid] = raw

    def remove(self, rid: bytes) -> None:
        self.table[rid] = None


def test_the_changelog_holds_the_newest_version(sim: Sim, tmp_path: Path) -> None:
    """A replace is a put under the same key; the settle of a version replaced while it was being
    delivered writes no tombstone over its successor; a store restored from that table fires the
    newest version only."""
    m = _Mirror()
    sim.st.mirror = m
    send(sim, "x", 5000, b"v1", replace=None)
    send(sim, "y", 0, b"y1", replace=None)
    sim.consume()
    run(sim, 100, ack=False)  # y1 in flight
    send(sim, "x", 1000, b"v2")
    send(sim, "y", 5000, b"y2")
    sim.consume()
    for ref, rid in sim.in_flight:
        sim.st.acked.append((ref, sim.st.sched.record(ref)))  # type: ignore[arg-type]
        assert rid == b"y"
    sim.in_flight = []
    sim.st.settle()
    table = {k: None if v is None else codec.decode(memoryview(v), 0).value for k, v in m.table.items()}
    assert table == {b"x": b"v2", b"y": b"y2"}

    fresh = Sim(tmp_path / "fresh", scheduler=sim.scheduler)
    fresh.fired = []  # type: ignore[attr-defined]
    for k, v in m.table.items():
        assert v is not None
        fresh.st.restore_put(k, v, fresh.now)
    run(fresh, 12_000)
    assert sorted(fired(fresh)) == [(b"x", b"v2", 1100), (b"y", b"y2", 5100)]


# -- etf1/kafka-message-scheduler ---------------------------------------------------------------------
def _etf1_schedule(sim: Sim, key: bytes, epoch_s: int, value: bytes, target_key: bytes | None = b"vid1",
                   ts: int | None = None) -> int:
    """A schedule record shaped as etf1's README shows it ("Schedule message"):

        Headers:
            scheduler-epoch: 1893456000
            scheduler-target-topic: online-videos
            scheduler-target-key: vid1
            customer-header: dummy
        Timestamp: 1607918336
        Key: vid1-online
        Value: "video 1"
    """
    headers: list[tuple[str, bytes | None]] = [
        (c.KMS_EPOCH, str(epoch_s).encode()), (c.KMS_TARGET_TOPIC, b"online-videos"),
    ]
    if target_key is not None:
        headers.append((c.KMS_TARGET_KEY, target_key))
    headers.append(("customer-header", b"dummy"))
    off = len(sim.ingress)
    sim.ingress.append(IngressRecord(TOPIC, 0, off, sim.now if ts is None else ts, key, value, headers))
    return off


def _etf1_delete(sim: Sim, key: bytes) -> None:
    """etf1's clientlib.DeleteSchedule: ``Key: []byte(scheduleID)``, ``Value: nil`` ("tombstone
    message has nil Value"), no headers."""
    sim.ingress.append(IngressRecord(TOPIC, 0, len(sim.ingress), sim.now, key, None, None))


def _delivered(sim: Sim) -> list[codec.Record]:
    out = []
    sim.now += 100
    sim.consume()
    for ref, rec in sim.st.sched.due(sim.now, 1000):
        out.append(rec)
        sim.st.delivered(ref, id_hash(bytes(rec.id)))
    return out


def _until(sim: Sim, ms: int) -> list[codec.Record]:
    out: list[codec.Record] = []
    end = sim.now + ms
    while sim.now < end:
        out += _delivered(sim)
    return out


def test_etf1_delivered_record_carries_its_output_headers(sim: Sim) -> None:
    """etf1's README, "Triggered message in topic 'online-videos'":

        Headers:
            scheduler-timestamp: 1607918336 # original message timestamp
            scheduler-key: vid1-online
            scheduler-topic: schedules
            customer-header: dummy
        Key: vid1
        Value: "video 1"

    and its code, which keeps every header of the schedule record, its own scheduler-* ones
    included, before the three it adds (runner/kafka/handler.go, ``produceTargetMessage``)::

        headers := []confluent.Header{}
        if len(msg.Headers) != 0 {
            headers = append(headers, msg.Headers...)
        }
        headers = append(
            headers,
            confluent.Header{
                Key:   OriginalTimestamp,
                Value: []byte(strconv.FormatInt(msg.Timestamp(), 10)),
            },
            confluent.Header{
                Key:   OriginalKey,
                Value: msg.Key,
            },
            confluent.Header{
                Key:   OriginalTopic,
                Value: []byte(*msg.TopicPartition.Topic),

    A client builds its next schedule from them (a third-party etf1 client failed its own test
    against the sidecar when scheduler-epoch, -target-topic and -target-key were missing).
    """
    ts = T0 - 1000  # the README's example is from 2020; the levels scheduler holds up to 10 s here
    _etf1_schedule(sim, b"vid1-online", (T0 + 5000) // 1000, b"video 1", ts=ts)
    recs = _until(sim, 12_000)
    assert len(recs) == 1
    rec = recs[0]
    assert (bytes(rec.topic), rec.key, rec.value, bytes(rec.id)) == (b"online-videos", b"vid1", b"video 1",
                                                                     b"vid1-online")
    assert codec.decode_headers(rec.headers) == [
        (c.KMS_EPOCH, b"%d" % ((T0 + 5000) // 1000)), (c.KMS_TARGET_TOPIC, b"online-videos"),
        (c.KMS_TARGET_KEY, b"vid1"), ("customer-header", b"dummy"),
        (c.KMS_TIMESTAMP, b"%d" % (ts // 1000)), (c.KMS_KEY, b"vid1-online"), (c.KMS_TOPIC, TOPIC.encode()),
    ]


def test_etf1_repeated_headers_resolve_to_the_first_and_all_are_delivered(sim: Sim) -> None:
    """A retry library re-sends a delivered record as a new schedule: its new scheduler-* headers
    come first, the old ones (and the old scheduler-key/-topic/-timestamp) follow. etf1 reads the
    first of each (schedule/kafka/schedule.go, ``getHeaderValue``: ``if s.Headers[i].Key == key {
    return s.Headers[i].Value``) and delivers all of them, then its own three again."""
    off = _etf1_schedule(sim, b"retry-1", T0 // 1000, b"again", target_key=b"k-new")
    old = [(c.KMS_EPOCH, b"1"), (c.KMS_TARGET_TOPIC, b"old-topic"), (c.KMS_TARGET_KEY, b"k-old"),
           (c.KMS_TIMESTAMP, b"1600000000"), (c.KMS_KEY, b"retry-0"), (c.KMS_TOPIC, b"schedules")]
    sim.ingress[off].headers += old  # type: ignore[operator]
    recs = _until(sim, 1000)
    assert sim.counters.dlq[c.BAD_HEADER] == 0
    assert [(bytes(r.topic), r.key, bytes(r.id)) for r in recs] == [(b"online-videos", b"k-new", b"retry-1")]
    got = codec.decode_headers(recs[0].headers)
    assert got[:4] == sim.ingress[off].headers[:4] and got[4:10] == old  # type: ignore[index]
    assert got[10:] == [(c.KMS_TIMESTAMP, b"%d" % (T0 // 1000)), (c.KMS_KEY, b"retry-1"), (c.KMS_TOPIC, TOPIC.encode())]


def test_etf1_without_a_target_key_delivers_no_key(sim: Sim) -> None:
    _etf1_schedule(sim, b"s1", T0 // 1000, b"v", target_key=None)
    recs = _until(sim, 1000)
    assert [(r.key, r.value) for r in recs] == [(None, b"v")]


def test_etf1_a_newer_record_with_the_same_key_replaces(sim: Sim) -> None:
    _etf1_schedule(sim, b"vid1-online", (T0 + 10_000) // 1000, b"video 1")
    _etf1_schedule(sim, b"vid1-online", (T0 + 1000) // 1000, b"video 1, edited")
    sim.consume()
    sim.crash()  # the replay after a crash keeps the replace
    recs = _until(sim, 3000)
    sim.st.checkpoint()
    sim.crash()
    recs += _until(sim, 10_000)
    assert [(r.value, r.due_ms - T0) for r in recs] == [(b"video 1, edited", 1000)]
    assert sim.counters.replaced == 1


def test_etf1_a_tombstone_with_the_key_cancels_and_the_key_can_be_used_again(sim: Sim) -> None:
    _etf1_schedule(sim, b"vid1-online", (T0 + 5000) // 1000, b"video 1")
    _etf1_delete(sim, b"vid1-online")
    _etf1_delete(sim, b"never-scheduled")  # deletes what does not exist: a no-op, no pre-cancel
    sim.consume()
    assert sim.counters.cancelled == 1 and sim.counters.cancel_unmatched == 1
    sim.crash()
    assert _until(sim, 6000) == []
    _etf1_schedule(sim, b"vid1-online", (sim.now + 1000) // 1000, b"video 1 again")
    _etf1_schedule(sim, b"never-scheduled", (sim.now + 1000) // 1000, b"later")
    assert sorted(r.value for r in _until(sim, 3000)) == [b"later", b"video 1 again"]  # type: ignore[type-var]


def _after_delivery(sim: Sim, rec: codec.Record) -> None:
    """The tombstone written back after ``rec`` was delivered, as etf1 writes it (runner/kafka/
    handler.go, ``produceTombstoneMessageForOriginalSchedule``, quoted in
    tests/integration/test_etf1.py) and sidecar/engine/etf1.py too: the schedule id as key, a
    null value, the delivered record's headers (so ``scheduler-key``)."""
    sim.ingress.append(IngressRecord(TOPIC, 0, len(sim.ingress), sim.now, bytes(rec.id), None,
                                     codec.decode_headers(rec.headers)))


def test_etf1_the_tombstone_after_a_delivery_never_deletes_a_newer_schedule(sim: Sim) -> None:
    """The schedules topic holds: schedule 1, schedule 2 under the same key (sent after schedule 1
    was delivered), then the tombstone written back for schedule 1 (it was produced after the
    delivery, so it can land after schedule 2). It must not delete schedule 2, which a delete
    (clientlib.DeleteSchedule: no headers) would."""
    _etf1_schedule(sim, b"vid1-online", T0 // 1000, b"first")
    first = _until(sim, 1000)
    assert [r.value for r in first] == [b"first"]
    _etf1_schedule(sim, b"vid1-online", (sim.now + 2000) // 1000, b"second")
    _after_delivery(sim, first[0])
    sim.consume()
    assert (sim.counters.cancelled, sim.counters.cancel_unmatched) == (0, 0)
    sim.crash()  # (nothing was written for it: the replay agrees)
    assert [r.value for r in _until(sim, 6000)] == [b"second"]  # (levels: rounded up to 5 s)
    _etf1_schedule(sim, b"vid1-online", (sim.now + 2000) // 1000, b"third")
    _etf1_delete(sim, b"vid1-online")
    assert _until(sim, 6000) == [] and sim.counters.cancelled == 1


def test_etf1_bad_keys_and_tombstone_shapes(sim: Sim) -> None:
    assert kms_delete(b"k", None, None) is not None
    assert kms_delete(b"k", b"", None) is None, "an empty value is not a tombstone"
    assert kms_delete(None, None, None) is None
    assert kms_delete(b"k", None, [(c.CANCEL, b"x")]) is None, "a delay.* record is not an etf1 delete"
    etf1_own = [(c.KMS_EPOCH, b"1"), (c.KMS_TARGET_TOPIC, b"t"), (c.KMS_KEY, b"k")]
    assert kms_delete(b"k", None, etf1_own) == AfterDelivery(b"k"), "etf1's own tombstones carry its headers"
    assert kms_delete(b"k", None, [(c.REDRIVE_ID, b"d:0:1")]) == Cancel(b"k"), "a pass-through header"
    assert kms_delete(b"k", None, [("delay.cron", b"x")]) is None, "an unknown delay.* header: parse_ingress rejects"
    r = kms_delete(b"x" * 256, None, None)
    assert isinstance(r, Rejection) and r.reason == c.BAD_HEADER
    _etf1_schedule(sim, b"", T0 // 1000, b"no key")
    _etf1_schedule(sim, b"y" * 256, T0 // 1000, b"long key")
    _etf1_schedule(sim, b"z", T0 // 1000, b"id differs")
    sim.ingress[-1].headers.append((c.ID, b"other"))  # type: ignore[union-attr]
    recs = _until(sim, 1000)
    assert sim.counters.dlq[c.BAD_HEADER] == 3
    errors = sorted(dict(codec.decode_headers(r.headers))[c.DLQ_ERROR] for r in recs)
    assert all(b"kafka-message-scheduler mode" in e for e in errors)


@pytest.mark.parametrize("crash", [False, True])
def test_a_record_waiting_in_a_wheel_bucket_is_replaced(tmp_path: Path, crash: bool) -> None:
    """Beyond the wheel's window (60 s here) a record waits in a time bucket, where a replace
    cancels it through the bucket entry's marker, live and in the replay."""
    sim = Sim(tmp_path, scheduler="wheel")
    sim.fired = []  # type: ignore[attr-defined]
    send(sim, "x", 200_000, b"far", replace=None)
    sim.consume()
    assert sim.st.pending().get("bucket") == 1
    sim.st.checkpoint()
    send(sim, "x", 2000, b"near")
    sim.consume()
    if crash:
        sim.crash()
    run(sim, 260_000, step=1000)
    assert fired(sim) == [(b"x", b"near", 2000)]


def test_etf1_tombstones_are_for_etf1_deliveries_only(sim: Sim) -> None:
    """``etf1.schedule_headers`` picks the records ``etf1-tombstones`` writes a tombstone for: a
    delivered etf1-mode schedule, not a delay.* request forwarding an etf1 delivery's headers
    under another id, and not a dead letter."""
    tail = tail_of(TOPIC)
    _etf1_schedule(sim, b"vid1-online", T0 // 1000, b"video 1")
    forwarded = [(c.KMS_TIMESTAMP, b"1"), (c.KMS_KEY, b"vid0"), (c.KMS_TOPIC, TOPIC.encode())]
    send(sim, "other", 0, b"forwarded", replace=None, extra=forwarded)
    send(sim, None, -1, b"dead", replace=None)  # delay-out-of-range: a DEAD record to the DLQ
    recs = {r.value: r for r in _until(sim, 1000)}
    assert set(recs) == {b"video 1", b"forwarded", b"dead"}
    got = schedule_headers(recs[b"video 1"], tail)
    assert got is not None and got[-2:] == [(c.KMS_KEY, b"vid1-online"), (c.KMS_TOPIC, TOPIC.encode())]
    assert schedule_headers(recs[b"forwarded"], tail) is None
    assert schedule_headers(recs[b"dead"], tail) is None
    assert schedule_headers(recs[b"video 1"], tail_of("another-ingress")) is None
