"""The Kafka twin's transactions (``tests/kafka_twin.py``), against what librdkafka and the broker do.

The exactly-once tests of the loop rely on the twin telling committed from aborted records, holding
read_committed consumers at the last stable offset, committing offsets only with their transaction,
refusing a zombie's offsets, fencing an older producer and purging on abort, with the errors
confluent-kafka raises (code and ``fatal``/``retriable``/``txn_requires_abort`` flags).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from tests.kafka_twin import TwinClients, TwinCluster, TwinConsumer, TwinProducer, VirtualClock

TOPIC, GROUP = "out", "g"


class Reports:
    """A delivery callback that records (error code or None, offset, value)."""

    def __init__(self) -> None:
        self.got: list[tuple[int | None, int, bytes | None]] = []

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        self.got.append((None if err is None else err.code(), msg.offset(), msg.value()))


def world(partitions: int = 1) -> tuple[VirtualClock, TwinCluster, TwinClients]:
    clock = VirtualClock()
    cluster = TwinCluster(clock)
    cluster.create_topic(TOPIC, partitions)
    cluster.create_topic("in", 2)
    return clock, cluster, TwinClients(cluster)


def txn_producer(clients: TwinClients, tid: str = "t1", conf: dict[str, Any] | None = None) -> TwinProducer:
    p = clients.producer({"transactional.id": tid, **(conf or {})})
    p.init_transactions(10)
    return p


def reader(clients: TwinClients, isolation: str = "read_committed", topic: str = TOPIC) -> TwinConsumer:
    """A consumer assigned by hand (as the changelog's restore consumer is), from the beginning."""
    c = clients.consumer({"group.id": "reader", "isolation.level": isolation})
    parts = len(clients.cluster.topics[topic])
    c.incremental_assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    return c


def read_all(c: TwinConsumer) -> list[bytes | None]:
    out: list[bytes | None] = []
    while batch := c.consume(100, 0):
        out.extend(m.value() for m in batch)
    return out


def member(clients: TwinClients, topic: str = "in", **conf: Any) -> TwinConsumer:
    """A group member whose callbacks assign and unassign, as the loop's do."""
    c = clients.consumer({"group.id": GROUP, **conf})

    def assign(cons: Any, tps: list[TopicPartition]) -> None:
        cons.incremental_assign(tps)

    def revoke(cons: Any, tps: list[TopicPartition]) -> None:
        cons.incremental_unassign(tps)

    c.subscribe([topic], on_assign=assign, on_revoke=revoke, on_lost=revoke)
    return c


def raised(call: Any, *args: Any) -> KafkaError:
    with pytest.raises(KafkaException) as ei:
        call(*args)
    err = ei.value.args[0]
    assert isinstance(err, KafkaError)
    return err


def produce_txn(p: TwinProducer, values: list[bytes], cb: Any = None) -> None:
    for v in values:
        p.produce(TOPIC, v, partition=0, callback=cb)


# -- visibility ----------------------------------------------------------------------------------


def test_committed_records_are_read_and_aborted_ones_never_with_read_committed() -> None:
    _clock, cluster, clients = world()
    p = txn_producer(clients)
    reports = Reports()
    p.begin_transaction()
    produce_txn(p, [b"a1", b"a2"], reports)
    p.commit_transaction(10)
    p.begin_transaction()
    produce_txn(p, [b"b1", b"b2"], reports)
    p.poll(0)  # acknowledged: in the log, with offsets, before the abort
    p.abort_transaction(10)
    plain = clients.producer({})
    plain.produce(TOPIC, b"c1", partition=0, callback=reports)
    plain.poll(0)
    # every record got an offset and a successful report; the markers took offsets 2 and 5
    assert reports.got == [(None, 0, b"a1"), (None, 1, b"a2"), (None, 3, b"b1"), (None, 4, b"b2"), (None, 6, b"c1")]
    c = reader(clients)
    assert read_all(c) == [b"a1", b"a2", b"c1"]
    assert c.position([TopicPartition(TOPIC, 0)])[0].offset == 7
    assert c.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 7)
    assert [m.value() for m in cluster.records(TOPIC, committed_only=True)] == [b"a1", b"a2", b"c1"]
    # the aborted transaction's records are never read, also once more records come after them
    p.begin_transaction()
    produce_txn(p, [b"d1"])
    p.commit_transaction(10)
    assert read_all(c) == [b"d1"]


def test_read_uncommitted_reads_committed_aborted_and_open_records() -> None:
    _clock, cluster, clients = world()
    p = txn_producer(clients)
    p.begin_transaction()
    produce_txn(p, [b"a1"])
    p.commit_transaction(10)
    p.begin_transaction()
    produce_txn(p, [b"b1"])
    p.poll(0)
    p.abort_transaction(10)
    p.begin_transaction()
    produce_txn(p, [b"o1"])
    p.poll(0)  # open
    c = reader(clients, "read_uncommitted")
    assert read_all(c) == [b"a1", b"b1", b"o1"]
    assert c.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 5)  # a1, marker, b1, marker, o1
    assert [m.value() for m in cluster.records(TOPIC)] == [b"a1", b"b1", b"o1"]  # markers are never records


def test_read_committed_stops_at_the_first_record_of_an_open_transaction() -> None:
    _clock, _cluster, clients = world()
    plain = clients.producer({})
    p = txn_producer(clients)
    plain.produce(TOPIC, b"p0", partition=0)
    plain.poll(0)
    p.begin_transaction()
    produce_txn(p, [b"t1"])
    p.poll(0)  # offset 1, open
    plain.produce(TOPIC, b"p2", partition=0)
    plain.poll(0)  # offset 2: after the open transaction's first record
    tp = TopicPartition(TOPIC, 0)
    committed, uncommitted = reader(clients), reader(clients, "read_uncommitted")
    assert read_all(committed) == [b"p0"]
    assert committed.position([tp])[0].offset == 1
    assert committed.get_watermark_offsets(tp) == (0, 1)  # the LSO
    assert uncommitted.get_watermark_offsets(tp) == (0, 3)
    admin = clients.admin({})
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    assert admin.list_offsets({tp: latest}, isolation_level=IsolationLevel.READ_COMMITTED)[tp].result().offset == 1
    assert admin.list_offsets({tp: latest})[tp].result().offset == 3  # the admin client's default: uncommitted
    assert read_all(uncommitted) == [b"p0", b"t1", b"p2"]
    p.commit_transaction(10)
    assert read_all(committed) == [b"t1", b"p2"]
    assert committed.get_watermark_offsets(tp) == (0, 4)  # the commit marker at 3
    assert committed.position([tp])[0].offset == 4  # the position moved past the marker


# -- offsets -------------------------------------------------------------------------------------


def test_offsets_are_committed_with_the_transaction_and_dropped_on_abort() -> None:
    _clock, cluster, clients = world()
    cluster.append("in", 0, b"k", b"v", None)
    c = member(clients, "in")
    assert len(c.consume(10, 0)) == 1  # joined, assigned, read
    p = txn_producer(clients)
    tps = [TopicPartition("in", 0), TopicPartition("in", 1)]
    p.begin_transaction()
    produce_txn(p, [b"out"])
    offsets = [TopicPartition("in", 0, c.position(tps)[0].offset), TopicPartition("in", 1, OFFSET_INVALID)]
    p.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), 10)
    # pending: not committed yet; a read_committed lookup waits for stable offsets, then times out
    assert cluster.committed == {}
    look = clients.consumer({"group.id": GROUP, "isolation.level": "read_uncommitted"})
    assert [tp.offset for tp in look.committed(tps, 5)] == [OFFSET_INVALID, OFFSET_INVALID]
    err = raised(c.committed, tps, 2)
    assert err.code() == KafkaError._TIMED_OUT
    p.commit_transaction(10)
    assert [tp.offset for tp in c.committed(tps, 5)] == [1, OFFSET_INVALID]  # a logical offset is ignored
    cluster.append("in", 0, b"k", b"v2", None)
    c.consume(10, 0)
    p.begin_transaction()
    p.send_offsets_to_transaction(c.position(tps), c.consumer_group_metadata(), 10)
    p.abort_transaction(10)
    assert [tp.offset for tp in c.committed(tps, 5)] == [1, OFFSET_INVALID]


def test_an_assignment_from_committed_offsets_waits_for_the_transaction_holding_them() -> None:
    """KIP-447: a read_committed consumer asks for stable offsets, so a new owner does not start
    before the previous owner's transaction (offsets and output together) has ended."""
    _clock, cluster, clients = world()
    for i in range(5):
        cluster.append("in", 0, b"k", b"v%d" % i, None)
    a = member(clients, "in")
    assert len(a.consume(3, 0)) == 3
    p = txn_producer(clients)
    p.begin_transaction()
    p.send_offsets_to_transaction(a.position([TopicPartition("in", 0)]), a.consumer_group_metadata(), 10)
    new = clients.consumer({"group.id": GROUP})
    new.incremental_assign([TopicPartition("in", 0, OFFSET_INVALID)])
    assert new.consume(10, 0) == []
    assert new.position([TopicPartition("in", 0)])[0].offset == -1001
    p.commit_transaction(10)
    assert [m.value() for m in new.consume(10, 0)] == [b"v3", b"v4"]


# -- zombies and fencing -------------------------------------------------------------------------


def test_an_expelled_members_offsets_are_refused_with_an_abortable_error() -> None:
    _clock, cluster, clients = world()
    cluster.append("in", 0, b"k", b"v", None)
    a = member(clients, "in")
    a.consume(10, 0)
    p = txn_producer(clients)
    p.begin_transaction()
    produce_txn(p, [b"zombie"])
    md = a.consumer_group_metadata()
    cluster.expel(a)  # a's session timed out while it was stopped
    member(clients, "in").consume(10, 0)  # the survivor owns everything now
    err = raised(p.send_offsets_to_transaction, a.position([TopicPartition("in", 0)]), md, 10)
    assert err.code() == KafkaError.UNKNOWN_MEMBER_ID
    assert err.txn_requires_abort() and not err.fatal() and not err.retriable()
    again = raised(p.commit_transaction, 10)
    assert again.code() == KafkaError.UNKNOWN_MEMBER_ID and again.txn_requires_abort()
    assert raised(p.produce, TOPIC, b"more").code() == KafkaError._STATE
    p.abort_transaction(10)
    assert cluster.committed == {}
    p.begin_transaction()  # usable again
    produce_txn(p, [b"next"])
    p.commit_transaction(10)
    assert read_all(reader(clients)) == [b"next"]


def test_metadata_from_before_a_rebalance_is_refused_with_illegal_generation() -> None:
    _clock, cluster, clients = world()
    a = member(clients, "in")
    a.consume(10, 0)
    old = a.consumer_group_metadata()
    member(clients, "in")  # joins: the group moves to a new generation...
    a.consume(10, 0)  # ...which a takes part in, giving up a partition
    assert [tp.partition for tp in a.assignment()] == [0]
    p = txn_producer(clients)
    p.begin_transaction()
    offsets = [TopicPartition("in", 0, 0)]
    err = raised(p.send_offsets_to_transaction, offsets, old, 10)
    assert err.code() == KafkaError.ILLEGAL_GENERATION and err.txn_requires_abort()
    p.abort_transaction(10)
    p.begin_transaction()
    p.send_offsets_to_transaction(offsets, a.consumer_group_metadata(), 10)  # current metadata: accepted
    p.commit_transaction(10)
    assert cluster.committed == {(GROUP, "in", 0): 0}


def test_a_second_init_transactions_fences_the_older_producer() -> None:
    _clock, _cluster, clients = world()
    old = txn_producer(clients, "same")
    old.begin_transaction()
    produce_txn(old, [b"old"])
    old.poll(0)
    new = txn_producer(clients, "same")
    # the old producer's open transaction is aborted: it neither blocks nor shows to read_committed
    c = reader(clients)
    assert c.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 2)
    assert read_all(c) == []
    err = raised(old.commit_transaction, 10)
    assert err.code() == KafkaError._FENCED and err.fatal() and not err.txn_requires_abort()
    assert raised(old.abort_transaction, 10).fatal()
    assert raised(old.begin_transaction).fatal()
    # produce raises the bare _FATAL code (confluent-kafka's produce sets no flag)
    assert raised(old.produce, TOPIC, b"x").code() == KafkaError._FATAL
    assert raised(old.poll, 0).fatal()  # the fatal error event, once
    assert old.poll(0) == 0
    new.begin_transaction()
    produce_txn(new, [b"new"])
    new.commit_transaction(10)
    assert read_all(c) == [b"new"]


def test_a_fenced_producer_with_records_queued_learns_it_at_poll() -> None:
    _clock, cluster, clients = world()
    old = txn_producer(clients, "same")
    reports = Reports()
    old.begin_transaction()
    produce_txn(old, [b"q1", b"q2"], reports)  # queued, not yet sent
    txn_producer(clients, "same")
    err = raised(old.poll, 0)
    assert err.code() == KafkaError._FENCED and err.fatal()
    assert reports.got == [(KafkaError._PURGE_QUEUE, -1, b"q1"), (KafkaError._PURGE_QUEUE, -1, b"q2")]
    assert cluster.records(TOPIC) == []


def test_a_transaction_left_open_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    clock, _cluster, clients = world()
    p = txn_producer(clients, conf={"transaction.timeout.ms": 1000})
    p.begin_transaction()
    produce_txn(p, [b"slow"])
    p.poll(0)
    c = reader(clients)
    assert c.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 0)
    clock.advance(999)
    assert c.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 0)
    clock.advance(1)
    assert c.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 2)  # aborted: record and marker
    assert read_all(c) == []
    err = raised(p.commit_transaction, 10)
    assert err.code() == KafkaError._FENCED and err.fatal()


# -- abort, failures, outages --------------------------------------------------------------------


def test_abort_purges_unacknowledged_records_and_reports_them_in_the_call() -> None:
    _clock, cluster, clients = world()
    p = txn_producer(clients)
    reports = Reports()
    p.begin_transaction()
    produce_txn(p, [b"x1", b"x2", b"x3"], reports)
    p.abort_transaction(10)
    assert reports.got == [(KafkaError._PURGE_QUEUE, -1, v) for v in (b"x1", b"x2", b"x3")]
    assert len(p) == 0 and cluster.topics[TOPIC][0] == []  # nothing was written: no marker either
    assert p.poll(0) == 0
    p.begin_transaction()
    produce_txn(p, [b"y"], reports)
    p.commit_transaction(10)
    assert reports.got[-1] == (None, 0, b"y")
    assert read_all(reader(clients)) == [b"y"]


def test_a_failed_commit_must_be_aborted_and_leaves_nothing_visible() -> None:
    _clock, cluster, clients = world()
    cluster.append("in", 0, b"k", b"v", None)
    c = member(clients, "in")
    c.consume(10, 0)
    p = txn_producer(clients)
    p.begin_transaction()
    produce_txn(p, [b"lost"])
    p.send_offsets_to_transaction(c.position([TopicPartition("in", 0)]), c.consumer_group_metadata(), 10)
    cluster.fail_next_commit()
    err = raised(p.commit_transaction, 10)
    assert err.code() == KafkaError.TRANSACTION_ABORTABLE and err.txn_requires_abort() and not err.fatal()
    assert raised(p.begin_transaction).txn_requires_abort()
    assert read_all(reader(clients, "read_uncommitted")) == [b"lost"]
    committed = reader(clients)
    assert read_all(committed) == []  # still open: held at the LSO
    p.abort_transaction(10)
    assert read_all(committed) == [] and cluster.committed == {}
    p.begin_transaction()
    produce_txn(p, [b"kept"])
    p.commit_transaction(10)
    assert read_all(committed) == [b"kept"]


def test_an_outage_makes_commit_fail_abortable_with_records_queued_and_retriable_without() -> None:
    clock, cluster, clients = world()
    p = txn_producer(clients)
    reports = Reports()
    p.begin_transaction()
    produce_txn(p, [b"a"], reports)
    cluster.down = True
    err = raised(p.commit_transaction, 10)
    assert err.code() == KafkaError._MSG_TIMED_OUT and err.txn_requires_abort()
    assert reports.got == [(KafkaError._MSG_TIMED_OUT, -1, b"a")]
    before = clock.now_ms
    err = raised(p.abort_transaction, 5)
    assert err.code() == KafkaError._TIMED_OUT and err.retriable() and not err.txn_requires_abort()
    assert clock.now_ms - before == 5000  # the call waited its timeout for the coordinator
    cluster.down = False
    p.abort_transaction(5)  # resumed
    p.begin_transaction()
    produce_txn(p, [b"b"])
    p.poll(0)  # delivered before the outage: the commit itself cannot reach the coordinator
    cluster.down = True
    err = raised(p.commit_transaction, 5)
    assert err.code() == KafkaError._TIMED_OUT and err.retriable()
    c = reader(clients)
    assert read_all(c) == []
    cluster.down = False
    p.commit_transaction(5)  # resumed
    assert read_all(c) == [b"b"]


def test_calls_in_the_wrong_state_or_with_keyword_timeouts_are_refused() -> None:
    _clock, _cluster, clients = world()
    p = clients.producer({"transactional.id": "t"})
    assert raised(p.produce, TOPIC, b"x").code() == KafkaError._STATE  # before init_transactions
    assert raised(p.begin_transaction).code() == KafkaError._STATE
    p.init_transactions(10)
    assert raised(p.produce, TOPIC, b"x").code() == KafkaError._STATE  # outside a transaction
    assert raised(p.commit_transaction, 10).code() == KafkaError._STATE
    assert raised(p.init_transactions, 10).code() == KafkaError._STATE
    # confluent-kafka takes these timeouts positionally, as a number
    with pytest.raises(TypeError):
        p.commit_transaction(timeout=10)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        p.abort_transaction(None)  # type: ignore[arg-type]
    plain = clients.producer({})
    assert raised(plain.begin_transaction).code() == KafkaError._NOT_CONFIGURED
    with pytest.raises(KafkaException, match=r"isolation\.level"):
        clients.consumer({"group.id": "x", "isolation.level": "read_some"})


# -- the consumer's other calls ------------------------------------------------------------------


def test_seek_moves_an_assigned_partition_and_committed_answers_invalid_when_none() -> None:
    _clock, cluster, clients = world()
    for i in range(4):
        cluster.append(TOPIC, 0, None, b"v%d" % i, None)
    c = reader(clients)
    assert c.consume(2, 0)[-1].value() == b"v1"
    c.seek(TopicPartition(TOPIC, 0, 3))
    assert [m.value() for m in c.consume(10, 0)] == [b"v3"]
    c.seek(TopicPartition(TOPIC, 0, OFFSET_BEGINNING))
    assert read_all(c) == [b"v0", b"v1", b"v2", b"v3"]
    c.seek(TopicPartition(TOPIC, 0, OFFSET_END))
    cluster.append(TOPIC, 0, None, b"v4", None)
    assert read_all(c) == [b"v4"]
    assert [tp.offset for tp in c.committed([TopicPartition(TOPIC, 0)], 5)] == [OFFSET_INVALID]
