"""Exactly-once per tenant (engine/txn_lanes.py) on virtual time, against the Kafka twin.

Two tenants with principals of their own (alice for a, bob for b), ``delivery: exactly-once``:
each tenant's partitions commit in its own transactions, on its own producer and transactional
id; a ``read_committed`` reader of the target sees each record once; a record alice may not
write is dead-lettered in a's DLQ as ``not-authorized`` without a produce (so without aborting
a's transactions); an aborted transaction of one tenant restores that tenant's partitions only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sidecar import contract as c
from sidecar.engine.transactions import tenant_transactional_id
from sidecar.tenants import TenantSpec
from tests.kafka_twin import TwinMessage
from tests.unit.helpers.world import GROUP, TARGET, World

A, B = "a.in", "b.in"
SPECS = (TenantSpec("a", A, dlq_topic=f"{A}.dlq", kafka=(("sasl.username", "alice"),)),
         TenantSpec("b", B, dlq_topic=f"{B}.dlq", kafka=(("sasl.username", "bob"),)))


class TenantWorld(World):
    def delivered(self) -> list[TwinMessage]:
        return self.cluster.records(TARGET, committed_only=True)


def _ids(msgs: list[TwinMessage]) -> Counter[bytes]:
    return Counter(dict(m.headers() or [])[c.ID] or b"" for m in msgs)


def _world(tmp_path: Path) -> TenantWorld:
    w = TenantWorld(tmp_path, tenants=(A, B))
    for t in (A, B):
        w.cluster.create_topic(f"{t}.dlq", 1)
    return w


def test_each_tenant_commits_its_partitions_in_transactions_of_its_own(tmp_path: Path) -> None:
    w = _world(tmp_path)
    w.cluster.denied = {"alice": {TARGET}, "sidecar": {TARGET}}
    sc = w.sidecar("x", delivery="exactly-once", tenant_specs=SPECS, kafka={"sasl.username": "sidecar"},
                   delivery_attempts=2)
    assert sc.eos is not None and [lane.name for lane in sc.eos.lanes] == ["", "a", "b"]
    instance = sc.s.group_instance_id or ""
    ids = {p.user: p.transactional_id for p in w.clients.producers}
    assert ids == {"sidecar": f"{GROUP}.{instance}", "alice": tenant_transactional_id(GROUP, "a", instance),
                   "bob": tenant_transactional_id(GROUP, "b", instance)}
    assert ids["alice"] == f"{GROUP}.a:{instance}"
    w.send(3, lambda i: 200, prefix="steal", topic=A)
    stolen = {b"steal%d" % i for i in range(3)}
    for rid in stolen:
        del w.sent[rid]
    w.send(30, lambda i: 300 + 10 * i, prefix="b", topic=B)
    w.run([sc], lambda: len(w.delivered()) >= 30 and len(w.cluster.records(f"{A}.dlq", committed_only=True)) >= 3)
    w.check(set(w.sent))  # b's 30, each once (read_committed), none early
    dead = [dict(m.headers() or []) for m in w.cluster.records(f"{A}.dlq", committed_only=True)]
    assert {h[c.ID] for h in dead} == stolen
    for h in dead:
        assert h[c.DLQ_REASON] == c.NOT_AUTHORIZED.encode()
        error = (h[c.DLQ_ERROR] or b"").decode()
        assert "TOPIC_AUTHORIZATION_FAILED" in error and f"User:alice may not write topic '{TARGET}'" in error, error
    assert w.cluster.records(f"{B}.dlq") == []
    # nothing of alice's reached the target, not even in an aborted transaction; nothing aborted
    assert not any(i.startswith(b"steal") for i in _ids(w.cluster.records(TARGET)))
    assert sc.txn is not None and sc.txn.aborted == 0 and sc.txn.committed > 0
    # each tenant's changelog and offsets were written by its own producer, in its transactions
    bob = next(p for p in w.clients.producers if p.user == "bob")
    assert bob.produced >= 30 * 3  # deliveries, changelog puts and tombstones
    w.run([sc], lambda: all(k[0] == GROUP for k in w.cluster.committed) and sum(
        v for (g, t, _p), v in w.cluster.committed.items() if t == B) == 30)
    sc.shutdown()


def test_a_tenants_aborted_transaction_restores_its_partitions_only(tmp_path: Path) -> None:
    """a's transaction aborts (its producer dies): a's partitions are restored and consumed
    again from the committed offsets, b's stores stay open and b's transactions go on; each
    record is seen once."""
    from confluent_kafka import KafkaError, KafkaException

    w = _world(tmp_path)
    sc = w.sidecar("x", delivery="exactly-once", tenant_specs=SPECS)
    assert sc.eos is not None
    w.run([sc], lambda: len(sc.stores) == 2 * w.partitions)
    a_stores = {k: s for k, s in sc.stores.items() if k.topic == A}
    b_stores = {k: s for k, s in sc.stores.items() if k.topic == B}
    w.send(20, lambda i: 200, prefix="a", topic=A)
    w.send(20, lambda i: 200, prefix="b", topic=B)
    w.run([sc], lambda: len(w.cluster.records(TARGET)) >= 10)
    alice = sc.pub.tenants.own[A]
    real_poll = alice.poll

    def dies(timeout: float = 0) -> int:
        alice.poll = real_poll
        raise KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))

    alice.poll = dies
    w.send(20, lambda i: 400, prefix="later-a", topic=A)
    w.send(20, lambda i: 400, prefix="later-b", topic=B)
    w.run([sc], lambda: len(w.delivered()) >= 80)
    w.check(set(w.sent))
    assert sc.pub.tenants.own[A] is not alice
    assert all(sc.stores[k] is s for k, s in b_stores.items())  # b's partitions were not restored
    assert all(sc.stores[k] is not s for k, s in a_stores.items())  # a's were, from the changelog
    sc.shutdown()


def test_a_tenants_transactional_id_refused_while_running_holds_its_lane_only(tmp_path: Path) -> None:
    """Write on a's transactional id revoked while records flow: a's lane waits (the cause names
    a's id and alice): a's partitions are paused and nothing of a's is published, while b's
    records, sent and falling due meanwhile, are consumed and delivered. Once granted, a new
    producer of a's is registered, a's partitions are consumed again from the committed offsets,
    and every record of both tenants is seen once, none early."""
    w = _world(tmp_path)
    sc = w.sidecar("x", delivery="exactly-once", tenant_specs=SPECS)
    assert sc.eos is not None
    lane = sc.eos.lanes[1]
    txn_id = sc.pub.tenants.own[A].transactional_id
    lane.refusal.probe = lambda: txn_id not in w.cluster.txn_refused  # the twin's answer, not a real client's
    w.run([sc], lambda: len(sc.stores) == 2 * w.partitions)
    w.send(10, lambda i: 200, prefix="a", topic=A)
    w.send(10, lambda i: 200, prefix="b", topic=B)
    w.run([sc], lambda: len(w.delivered()) >= 20)
    w.cluster.txn_refused.add(txn_id)
    w.send(10, lambda i: 300, prefix="meanwhile-a", topic=A)
    w.run([sc], lambda: lane.refusal.waiting)
    cause = lane.refusal.cause
    assert cause is not None and cause.operation == "Write" and cause.principal == "User:alice"
    assert cause.resource == f"transactional id {txn_id}" and txn_id.startswith(f"{GROUP}.a:")
    assert sc.eos.producing and not sc.kafka.paused and sc.kafka.held_topics == {A}
    # b goes on: records sent and due while a waits are delivered, on time
    w.send(10, lambda i: 200, prefix="while-b", topic=B)
    w.run([sc], lambda: sum(1 for i in _ids(w.delivered()) if i.startswith(b"while-b")) == 10)
    got = _ids(w.delivered())
    assert not any(i.startswith(b"meanwhile-a") for i in got)  # a's wait: nothing of a's published
    until = w.clock.now_ms + 5_000
    w.run([sc], lambda: w.clock.now_ms >= until)  # a's records fall due while it waits: still nothing of a's
    assert not any(i.startswith(b"meanwhile-a") for i in _ids(w.delivered()))
    assert lane.refusal.waiting and all(lane_.refusal.waiting is False for lane_ in sc.eos.lanes if lane_ is not lane)
    w.cluster.txn_refused.discard(txn_id)
    w.run([sc], lambda: not lane.refusal.waiting)
    assert sc.eos.producing and not sc.kafka.paused and not sc.kafka.held_topics
    w.send(10, lambda i: 100, prefix="after-a", topic=A)
    w.run([sc], lambda: len(w.delivered()) >= 50)
    w.check(set(w.sent))
    sc.shutdown()


def test_a_tenants_transactional_id_refused_at_start_holds_its_lane_only(tmp_path: Path) -> None:
    """a's transactional id refused from the start: b delivers; a's records wait in the topic
    (consumed, dropped, its partitions paused) and are all delivered once the ACL is granted."""
    w = _world(tmp_path)
    txn_id = tenant_transactional_id(GROUP, "a", "i1")
    w.cluster.txn_refused.add(txn_id)
    w.send(10, lambda i: 100, prefix="a", topic=A)
    w.send(10, lambda i: 100, prefix="b", topic=B)
    sc = w.sidecar("x", delivery="exactly-once", tenant_specs=SPECS, group_instance_id="i1")
    assert sc.eos is not None
    lane = sc.eos.lanes[1]
    lane.refusal.probe = lambda: txn_id not in w.cluster.txn_refused
    assert lane.refusal.waiting and sc.eos.producing and sc.kafka.held_topics == {A}
    w.run([sc], lambda: sum(1 for i in _ids(w.delivered()) if i.startswith(b"b")) == 10)
    until = w.clock.now_ms + 3_000
    w.run([sc], lambda: w.clock.now_ms >= until)
    assert not any(i.startswith(b"a") for i in _ids(w.delivered()))
    w.cluster.txn_refused.discard(txn_id)
    w.run([sc], lambda: len(w.delivered()) >= 20)
    w.check(set(w.sent))
    sc.shutdown()
