"""Exactly-once delivery (``delivery: exactly-once``) on virtual time, against the Kafka twin.

What a ``read_committed`` consumer of the target and DLQ topics sees is what counts: each record
once, never early, none lost — through an aborted transaction, a crash, and a zombie. The twin's
uncommitted view shows that each of those really put records in a transaction that aborted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine import kafka_io, transactions
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.loop import Sidecar
from sidecar.engine.stores import StoreKey
from sidecar.engine.transactions import DIRTY
from tests.kafka_twin import TwinMessage
from tests.unit.helpers.world import INGRESS, PARTITIONS, TARGET, World, committed

CHANGELOG = f"{INGRESS}.changelog"
EOS: dict[str, Any] = {"delivery": "exactly-once"}


class EosWorld(World):
    def delivered(self) -> list[TwinMessage]:
        """What a read_committed consumer of the target topic reads."""
        return self.cluster.records(TARGET, committed_only=True)

    def written(self, topic: str = TARGET) -> list[TwinMessage]:
        """Everything written, aborted and still open transactions included."""
        return self.cluster.records(topic)


def ids(msgs: list[TwinMessage]) -> Counter[bytes]:
    return Counter(dict(m.headers() or [])[c.ID] or b"" for m in msgs)


def crash(sc: Sidecar, w: World) -> None:
    """The process dies: no revoke, no commit, no close; its lock goes with it."""
    w.cluster.leave(sc.kafka.consumer)
    sc.lock.release()


def test_deliveries_and_offsets_commit_together(tmp_path: Path) -> None:
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    w.send(80, lambda i: 300 + 10 * i)
    w.run([sc], lambda: len(w.delivered()) >= 80)
    w.check(set(w.sent))
    assert sc.txn is not None and sc.txn.committed > 0 and sc.txn.aborted == 0
    w.run([sc], lambda: committed(w) == {p: 20 for p in range(PARTITIONS)})
    # the changelog's committed view: every id put and then tombstoned (each delivery's
    # tombstone committed with it)
    last: dict[bytes, bytes | None] = {}
    for m in w.cluster.records(CHANGELOG, committed_only=True):
        last[m.key() or b""] = m.value()
    assert set(last) == set(w.sent) and all(v is None for v in last.values())
    assert (sc.stores[StoreKey(INGRESS, 0)].dir / DIRTY).exists()  # open in exactly-once mode: not clean until closed
    sc.shutdown()
    assert not (tmp_path / "a" / f"{INGRESS}-0" / DIRTY).exists()


def test_an_aborted_transaction_is_done_again_and_seen_once(tmp_path: Path) -> None:
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    w.send(40, lambda i: 200)
    w.run([sc], lambda: len(w.written()) >= 1)  # deliveries are in the open transaction
    w.cluster.fail_next_commit()
    w.send(40, lambda i: 400, prefix="later")
    w.run([sc], lambda: len(w.delivered()) >= 80)
    w.check(set(w.sent))
    assert sc.txn is not None and sc.txn.aborted == 1
    aborted = ids(w.written()) - ids(w.delivered())
    assert aborted, "the failed commit's deliveries were written (and aborted)"
    sc.shutdown()


def test_a_crash_restores_the_committed_state_and_delivers_each_once(tmp_path: Path) -> None:
    w = EosWorld(tmp_path)
    a = w.sidecar("a", **EOS)
    w.run([a], lambda: len(a.stores) == PARTITIONS)
    w.send(120, lambda i: 200 + 20 * i)
    w.run([a], lambda: len(w.delivered()) >= 30)
    assert a.txn is not None
    a.txn.interval_s = 1e9  # what it delivers from here on stays in the open transaction
    w.run([a], lambda: len(w.written()) >= len(w.delivered()) + 10)
    crash(a, w)
    b = w.sidecar("a", **EOS)  # the same data directory and instance id: it fences a's transaction
    w.run([b], lambda: len(w.delivered()) >= 120)
    w.check(set(w.sent))
    assert ids(w.written()) != ids(w.delivered()), "a's open transaction was aborted"
    assert b.restorer is not None and b.restorer.applied > 0  # wiped (dirty) and restored from the changelog
    b.shutdown()


def test_a_clean_restart_trusts_its_store(tmp_path: Path) -> None:
    w = EosWorld(tmp_path)
    a = w.sidecar("a", **EOS)
    w.send(40, lambda i: 100 if i < 20 else 60_000)
    w.run([a], lambda: len(w.delivered()) >= 20)
    a.stop_requested = True
    a.shutdown()
    b = w.sidecar("a", **EOS)
    w.run([b], lambda: len(b.stores) == PARTITIONS)
    assert b.restorer is not None and b.restorer.applied == 0  # nothing after its checkpoints
    assert sum(n for st in b.stores.values() for n in st.pending().values()) == 20
    w.run([b], lambda: len(w.delivered()) >= 40)
    w.check(set(w.sent))
    assert b.counters.ingested == 0
    b.shutdown()


@pytest.mark.parametrize("timeout_ms", [10_000, 600_000], ids=["timed-out", "refused"])
def test_a_zombie_commit_is_refused_and_nothing_it_delivered_is_seen(tmp_path: Path, timeout_ms: int) -> None:
    """a delivers into a transaction it has not committed when the group expels it; b takes the
    partitions over and delivers them. When a commits, either the coordinator has aborted its
    transaction already (open past transaction-timeout: a is fenced, makes a new producer) or its
    offsets carry an old member id and are refused: the transaction aborts, and a read_committed
    reader sees b's deliveries only."""
    w = EosWorld(tmp_path)
    a = w.sidecar("a", transaction_timeout_ms=timeout_ms, **EOS)
    w.run([a], lambda: len(a.stores) == PARTITIONS)
    assert a.txn is not None
    a.txn.interval_s = 1e9
    w.send(40, lambda i: 100)
    w.run([a], lambda: len(w.written()) >= 40)
    w.cluster.expel(a.kafka.consumer)
    b = w.sidecar("b", transaction_timeout_ms=timeout_ms, **EOS)
    # b's deliveries: read_committed readers see them only once a's open transaction (before
    # them in the target partition) has ended
    w.run([b], lambda: len(w.written()) >= 80)
    a.txn.interval_s = 0.1
    if timeout_ms == 10_000:
        w.clock.advance(timeout_ms)  # a stays stopped past its transaction's timeout
    fenced = a.kafka.producer
    a.turn()  # a's next commit
    assert a.txn.aborted >= 1
    assert (a.kafka.producer is not fenced) == (timeout_ms == 10_000)
    w.run([a, b], lambda: not a.stores and len(w.delivered()) >= 40)
    w.check(set(w.sent))  # b's, each once: a's 40 were written and aborted
    for sc in (a, b):
        sc.shutdown()


def test_dead_letters_are_exactly_once_too(tmp_path: Path) -> None:
    """A missing target is never produced to (it would abort the transaction): the records wait
    for delivery-grace and go to the DLQ, each once."""
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", delivery_grace_ms=2000, **EOS)
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    for i in range(12):
        w.cluster.append(INGRESS, i % PARTITIONS, b"k", b"v", [
            (c.TARGET_TOPIC, b"missing"), (c.DELAY_MS, b"100"), (c.ID, b"m%d" % i)])
    dlq = sc.s.dlq_topic
    w.run([sc], lambda: len(w.cluster.records(dlq, committed_only=True)) >= 12)
    w.clock.advance(2000)
    w.run([sc], lambda: committed(w) == {p: 3 for p in range(PARTITIONS)})
    got = Counter(dict(m.headers() or [])[c.ID] for m in w.cluster.records(dlq, committed_only=True))
    assert got == Counter({b"m%d" % i: 1 for i in range(12)})
    assert all(dict(m.headers() or [])[c.DLQ_REASON] == c.DELIVERY_FAILED.encode()
               for m in w.cluster.records(dlq, committed_only=True))
    assert sc.txn is not None and sc.txn.aborted == 0
    sc.shutdown()


def test_a_send_offsets_that_never_returns_gives_up_the_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka's send_offsets_to_transaction can wait past its timeout for ever (after a
    broker restart, measured by the exactly-once bench: the loop stood still for minutes). The
    loop waits its timeout plus a grace, then replaces the producer: the new one fences the stuck
    one, the stores are restored from the committed changelog, and every record is still seen
    once."""
    monkeypatch.setattr(transactions, "OFFSETS_TIMEOUT_S", 0.05)
    monkeypatch.setattr(transactions, "STUCK_GRACE_S", 0.05)
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    w.send(40, lambda i: 200)
    w.run([sc], lambda: len(w.written()) >= 1)  # deliveries are in the open transaction
    stuck = w.cluster.hang_next_offsets()
    first = sc.kafka.producer
    try:
        w.send(40, lambda i: 400, prefix="later")
        w.run([sc], lambda: len(w.delivered()) >= 80)
        w.check(set(w.sent))
        assert sc.kafka.producer is not first, "the stuck producer was replaced"
        assert sc.txn is not None and sc.txn.aborted >= 1
        assert not w.cluster.offsets_hangs, "the hanging call was made"
    finally:
        stuck.set()  # the stuck thread ends (the old producer is fenced by now)
    sc.shutdown()


def _changelog(w: EosWorld) -> tuple[Counter[bytes], Counter[bytes], dict[bytes, bytes | None]]:
    """The committed changelog: puts and tombstones per id prefix, and each id's last value."""
    log = w.cluster.records(CHANGELOG, committed_only=True)
    puts = Counter((m.key() or b"")[:3] for m in log if m.value() is not None)
    tombstones = Counter((m.key() or b"")[:3] for m in log if m.value() is None)
    return puts, tombstones, {m.key() or b"": m.value() for m in log}


def _send_due(w: EosWorld, n: int, prefix: str, at_ms: int) -> None:
    """``n`` records with ``delay.deliver-at`` ``at_ms`` (in the past: due when they arrive)."""
    for i in range(n):
        rid = f"{prefix}{i}".encode()
        w.sent[rid] = at_ms
        w.cluster.append(INGRESS, i % PARTITIONS, b"k%d" % i, b"v%d" % i, [
            (c.TARGET_TOPIC, TARGET.encode()), (c.DELIVER_AT, b"%d" % at_ms), (c.ID, rid),
        ])


def test_a_record_due_on_arrival_and_delivered_in_its_transaction_writes_no_put(tmp_path: Path) -> None:
    """A backlog (records already due when accepted) is delivered in the transaction that stores
    it: its put is held back and dropped, its tombstone still written (an older version may be in
    the changelog). Records due later are written at once. A crash after the commit restores
    exactly the records still pending, and delivers them once."""
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    _send_due(w, 60, "now", w.clock.now_ms - 30_000)  # due 30 s ago: a backlog
    w.send(30, lambda i: 60_000, prefix="later")
    ends = {p: len([i for i in range(60) if i % PARTITIONS == p]) + len([i for i in range(30) if i % PARTITIONS == p])
            for p in range(PARTITIONS)}
    w.run([sc], lambda: len(w.delivered()) >= 60 and committed(w) == ends)
    puts, tombstones, _last = _changelog(w)
    assert tombstones[b"now"] == 60 and puts[b"now"] == 0, (puts, tombstones)
    assert puts[b"lat"] == 30 and tombstones[b"lat"] == 0
    crash(sc, w)
    b = w.sidecar("b", **EOS)
    w.run([b], lambda: len(w.delivered()) >= 90, max_turns=200_000)
    assert ids(w.delivered()) == Counter(set(w.sent))


def test_a_held_put_replaced_by_a_later_version_is_never_written(tmp_path: Path) -> None:
    """Version 1 arrives due (its put held back); version 2 replaces it in the same batch, due
    later (written at once). Writing the held version 1 at the commit would put it after version 2
    in the changelog, and a restore would bring back the replaced version: it must be dropped."""
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    rid = b"rep-1"
    w.cluster.append(INGRESS, 0, b"k", b"v1", [(c.TARGET_TOPIC, TARGET.encode()),
                                             (c.DELIVER_AT, b"%d" % (w.clock.now_ms - 5_000)), (c.ID, rid)])
    w.cluster.append(INGRESS, 0, b"k", b"v2", [(c.TARGET_TOPIC, TARGET.encode()), (c.DELAY_MS, b"60000"),
                                             (c.ID, rid), (c.REPLACE, b"true")])
    w.run([sc], lambda: committed(w).get(0) == 2)
    _puts, _tombstones, last = _changelog(w)
    value = last.get(rid)
    assert value is not None and b"v2" in value and b"v1" not in value, last
    assert not w.delivered()  # version 1 was replaced before it was handed out
    crash(sc, w)
    b = w.sidecar("b", **EOS)
    w.run([b], lambda: len(w.delivered()) >= 1, max_turns=200_000)
    assert [m.value() for m in w.delivered()] == [b"v2"]


def test_the_transactional_producer_lingers_longer_and_the_operator_still_wins() -> None:
    """Exactly-once: ``EOS_LINGER_MS`` (nothing is visible before the commit, which flushes);
    at-least-once: ``LINGER_MS``; a ``kafka: linger.ms`` of the operator's wins in both."""
    def linger(**kw: Any) -> Any:
        s = Settings(bootstrap_servers="127.0.0.1:1", group_instance_id="i-1", http_port=0, **kw)
        return KafkaIO(s, clients=None, events=None).producer_conf()["linger.ms"]  # type: ignore[arg-type]

    assert kafka_io.EOS_LINGER_MS > kafka_io.LINGER_MS
    assert linger() == kafka_io.LINGER_MS
    assert linger(delivery="exactly-once", changelog="on") == kafka_io.EOS_LINGER_MS
    assert linger(delivery="exactly-once", changelog="on", kafka={"linger.ms": "3"}) == "3"
    assert linger(kafka={"linger.ms": "3"}) == "3"


def test_a_transaction_open_when_every_partition_is_lost_never_commits(tmp_path: Path) -> None:
    """The group moves every partition on while a's transaction holds deliveries (a stopped in the
    middle of a publish, so no gap between turns was seen): with no store left, that transaction
    must still abort, never commit later beside the new owner's deliveries."""
    w = EosWorld(tmp_path)
    a = w.sidecar("a", **EOS)
    w.run([a], lambda: len(a.stores) == PARTITIONS)
    assert a.txn is not None
    a.txn.interval_s = 1e9  # what it delivers stays in the open transaction
    w.send(40, lambda i: 100)
    w.run([a], lambda: len(w.written()) >= 40)
    a.partitions_lost(sorted(a.stores))  # the callback, as librdkafka runs it after a session timeout
    assert not a.stores
    a.txn.interval_s = 0.1
    w.clock.advance(1000)
    a.turn()
    assert a.txn.aborted == 1, "the lost partitions' transaction was aborted"
    w.clock.advance(1000)
    a.turn()
    assert w.delivered() == [], "nothing of it became visible to read_committed readers"
    a.shutdown()


def test_a_transactional_id_refused_while_running_is_waited_out(tmp_path: Path) -> None:
    """Write on the transactional id revoked while records flow: no exit; nothing is published
    or committed while refused (ingress paused, /readyz's cause set); once it is granted again a
    new producer is registered and every record is seen once for read_committed, none early."""
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    assert sc.eos is not None and sc.txn is not None
    refusal = sc.eos.refusal
    txn_id = sc.kafka.producer.transactional_id
    refusal.probe = lambda: txn_id not in w.cluster.txn_refused  # the twin's answer, not a real client's
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    w.send(40, lambda i: 200)
    w.run([sc], lambda: len(w.delivered()) >= 40)
    w.cluster.txn_refused.add(txn_id)
    w.send(40, lambda i: 300, prefix="meanwhile")
    w.run([sc], lambda: refusal.waiting)
    assert refusal.cause is not None and refusal.cause.operation == "Write"
    assert refusal.cause.resource == f"transactional id {txn_id}"
    seen, written = len(w.delivered()), len(w.written())
    dead = sc.kafka.producer
    w.run([sc], lambda: w.clock.now_ms > w.sent[b"meanwhile39"] + 5_000)  # long past due, still refused
    assert refusal.waiting and sc.kafka.paused
    assert len(w.delivered()) == seen and len(w.written()) == written  # nothing produced meanwhile
    assert sc.kafka.producer is dead
    w.cluster.txn_refused.discard(txn_id)
    w.run([sc], lambda: not refusal.waiting)
    assert sc.kafka.producer is not dead and not sc.kafka.paused
    w.send(20, lambda i: 100, prefix="after")
    w.run([sc], lambda: len(w.delivered()) >= 100)
    w.check(set(w.sent))  # each once, none early
    assert refusal.refused_count == 1
    sc.shutdown()


def test_a_stop_while_the_transactional_id_is_refused_loses_nothing(tmp_path: Path) -> None:
    """Stopped while refused: a clean shutdown (no exception), the stores closed dirty; the next
    start, with the id granted, delivers every record once."""
    w = EosWorld(tmp_path)
    sc = w.sidecar("a", **EOS)
    assert sc.eos is not None
    txn_id = sc.kafka.producer.transactional_id
    sc.eos.refusal.probe = lambda: txn_id not in w.cluster.txn_refused
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    w.send(30, lambda i: 200)
    w.run([sc], lambda: len(w.delivered()) >= 10)
    w.cluster.txn_refused.add(txn_id)
    w.send(30, lambda i: 300, prefix="meanwhile")
    w.run([sc], lambda: sc.eos is not None and sc.eos.refusal.waiting)
    sc.shutdown()
    assert all((tmp_path / "a" / f"{INGRESS}-{p}" / DIRTY).exists() for p in range(PARTITIONS))
    w.cluster.txn_refused.discard(txn_id)
    again = w.sidecar("a", **EOS)
    w.run([again], lambda: len(w.delivered()) >= 60)
    w.check(set(w.sent))
    again.shutdown()
